"""The drivers whose harness runs on this host (docs/isolated-tier.md): `namespace`, the workload in
Linux namespaces as an unprivileged user under a seccomp filter (pal.vms.sandbox); `qemu-microvm`,
the workload in a KVM microVM booted from the guest built by `pal.vms.guest_image` (pal.vms.qemu).
Either way the harness (`python -m pal.harness`) starts the sandbox and limits it with cgroups."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pal.config import Settings
from pal.core.vms import Resources, resources_of
from pal.vms import DriverError, Placement, VmOrderLike, cgroups
from pal.vms.paths import create_private
from pal.vms.sandbox import SYSTEM_PATH

QEMU = "qemu-system-x86_64"
_TOOLS = ("unshare", "setpriv", "pivot_root", "mount")


def within_host_caps(spec: Mapping[str, Any], settings: Settings) -> Resources:
    """The VM's limits (pal.core.vms.resources_of); DriverError when over this host's caps."""
    asked = resources_of(spec)
    over = [f"{name} {value:g} (this host allows at most {cap:g}, {variable})"
            for name, value, cap, variable in (
                ("memoryMb", asked.memory_mb, settings.vm_max_memory_mb, "PAL_VM_MAX_MEMORY_MB"),
                ("cpus", asked.cpus, settings.vm_max_cpus, "PAL_VM_MAX_CPUS"),
                ("pids", asked.pids, settings.vm_max_pids, "PAL_VM_MAX_PIDS")) if value > cap]
    if over:
        raise DriverError("the VM asks for more than this host gives: " + "; ".join(over))
    return asked


class HarnessedDriver:
    def __init__(self, settings: Settings, name: str = "namespace") -> None:
        self.settings, self.name = settings, name
        missing = [t for t in _TOOLS if shutil.which(t, path=SYSTEM_PATH) is None]
        if missing:
            raise DriverError(f"the {name} driver needs {', '.join(missing)} (util-linux) on this host")
        if problem := cgroups.available():
            raise DriverError(problem)
        if name == "qemu-microvm":
            guest = Path(settings.vm_guest)
            absent = [str(guest / f) for f in ("vmlinuz", "initrd.img") if not (guest / f).is_file()]
            if absent:
                raise DriverError(f"the qemu-microvm guest is not built ({', '.join(absent)}): "
                                  "run `make vm-guest`, or set PAL_VM_GUEST")
            if shutil.which(QEMU) is None:
                raise DriverError(f"qemu-microvm needs {QEMU} on this host")
            if settings.vm_accel == "kvm" and not os.path.exists("/dev/kvm"):
                raise DriverError("qemu-microvm on KVM needs /dev/kvm on this host (or PAL_VM_ACCEL=tcg)")

    def spawn(self, order: VmOrderLike, token: str, *, place: Placement) -> int:
        spec = order.spec if isinstance(order.spec, Mapping) else {}
        limits = within_host_caps(spec, self.settings)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PAL_VM_ID": order.vm_id,
               "PAL_VM_TOKEN": token, "PAL_CONTROL_URL": self.settings.control_url,
               "PAL_VM_ROOT": str(place.root), "PAL_VM_WORK": "/".join(place.work),
               "PAL_VM_STATE": str(place.state),
               "PAL_VM_COMMAND": json.dumps(spec.get("command", [])),
               "PAL_VM_ENV": json.dumps(spec.get("env", {})), "PAL_RESUME": "1" if order.resume else "0",
               "PAL_LEASE_TTL": str(self.settings.lease_ttl), "PAL_VM_SANDBOX": self.name,
               "PAL_VM_GUEST": self.settings.vm_guest, "PAL_VM_ACCEL": self.settings.vm_accel,
               "PAL_VM_UID": str(self.settings.vm_uid), "PAL_VM_MEMORY_MB": str(limits.memory_mb),
               "PAL_VM_CPUS": str(limits.cpus), "PAL_VM_PIDS": str(limits.pids),
               "PAL_VM_EXPOSE": ":".join(self.settings.vm_expose)}
        log = create_private(place.state / "harness.log")
        try:
            process = subprocess.Popen([sys.executable, "-m", "pal.harness"], env=env, cwd=place.state,
                                       stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                       start_new_session=True)
        finally:
            os.close(log)
        # Reaped here when it ends, so a finished VM leaves no zombie under the worker.
        threading.Thread(target=process.wait, name=f"reap-{order.vm_id}", daemon=True).start()
        return process.pid

    def terminate(self, pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, 9)
