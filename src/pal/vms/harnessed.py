"""The drivers whose harness runs on this host (docs/isolated-tier.md): `namespace`, the workload in
Linux namespaces made by `unshare`; `qemu-microvm`, the workload in a KVM microVM booted from the
guest built by `pal.vms.guest_image`. Either way the sandbox itself is started by pal.harness."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

from pal.config import Settings
from pal.vms import DriverError, VmOrderLike

QEMU = "qemu-system-x86_64"


class HarnessedDriver:
    def __init__(self, settings: Settings, name: str = "namespace") -> None:
        self.settings, self.name = settings, name
        if name == "qemu-microvm":
            guest = Path(settings.vm_guest)
            missing = [str(guest / f) for f in ("vmlinuz", "initrd.img") if not (guest / f).is_file()]
            if missing:
                raise DriverError(f"the qemu-microvm guest is not built ({', '.join(missing)}): "
                                  "run `make vm-guest`, or set PAL_VM_GUEST")
            if shutil.which(QEMU) is None:
                raise DriverError(f"qemu-microvm needs {QEMU} on this host")
            if settings.vm_accel == "kvm" and not os.path.exists("/dev/kvm"):
                raise DriverError("qemu-microvm on KVM needs /dev/kvm on this host (or PAL_VM_ACCEL=tcg)")

    def spawn(self, order: VmOrderLike, token: str, *, workdir: Path) -> int:
        spec = order.spec if isinstance(order.spec, dict) else {}
        state = workdir / ".pal"
        state.mkdir(mode=0o700, exist_ok=True)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PAL_VM_ID": order.vm_id,
               "PAL_VM_TOKEN": token, "PAL_CONTROL_URL": self.settings.control_url,
               "PAL_VM_WORKDIR": str(workdir), "PAL_VM_COMMAND": json.dumps(spec.get("command", [])),
               "PAL_VM_ENV": json.dumps(spec.get("env", {})), "PAL_RESUME": "1" if order.resume else "0",
               "PAL_LEASE_TTL": str(self.settings.lease_ttl), "PAL_VM_SANDBOX": self.name,
               "PAL_VM_GUEST": self.settings.vm_guest, "PAL_VM_ATTEMPT": str(order.attempt),
               "PAL_VM_ACCEL": self.settings.vm_accel}
        log = (state / f"harness-{order.attempt}.log").open("ab")
        try:
            process = subprocess.Popen([sys.executable, "-m", "pal.harness"], env=env, cwd=workdir,
                                       stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                       start_new_session=True)
        finally:
            log.close()
        # Reaped here when it ends, so a finished VM leaves no zombie under the worker.
        threading.Thread(target=process.wait, name=f"reap-{order.vm_id}", daemon=True).start()
        return process.pid

    def terminate(self, pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, 9)
