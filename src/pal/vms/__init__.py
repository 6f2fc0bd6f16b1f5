"""VM drivers of the isolated tier, behind one interface (docs/isolated-tier.md).

A driver starts the harness (`python -m pal.harness`) for one VM on this host; the harness starts the
workload in the driver's sandbox and reports to the control plane. Liveness needs no polling of
the driver: the harness's heartbeats renew the run's lease, and the sweep reconciles a VM whose
heartbeats stopped (a killed VM, a lost host) to `terminated`.

- `namespace` (the default here): Linux namespaces via `unshare` (pid, mount, network, ipc, uts):
  the workload is PID 1 of its own tree, sees only a loopback interface, cannot reach the host's
  services, cannot write outside its work directory, and dies with its harness.
- `qemu-microvm`, `firecracker`: not available on this host yet; asking for them is refused.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Protocol

from pal.config import Settings
from pal.errors import PalError


class DriverError(PalError):
    """A VM could not be started on this host."""


class VmOrderLike(Protocol):
    @property
    def vm_id(self) -> str: ...

    @property
    def run_id(self) -> str: ...

    @property
    def attempt(self) -> int: ...

    @property
    def spec(self) -> object: ...

    @property
    def resume(self) -> bool: ...


class Driver(Protocol):
    name: str

    def spawn(self, order: VmOrderLike, token: str, *, workdir: Path) -> int:
        """Start the VM's harness; returns its pid on this host."""
        ...

    def terminate(self, pid: int) -> None: ...


class NamespaceDriver:
    name = "namespace"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def spawn(self, order: VmOrderLike, token: str, *, workdir: Path) -> int:
        spec = order.spec if isinstance(order.spec, dict) else {}
        state = workdir / ".pal"
        state.mkdir(mode=0o700, exist_ok=True)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PAL_VM_ID": order.vm_id,
               "PAL_VM_TOKEN": token, "PAL_CONTROL_URL": self.settings.control_url,
               "PAL_VM_WORKDIR": str(workdir), "PAL_VM_COMMAND": json.dumps(spec.get("command", [])),
               "PAL_VM_ENV": json.dumps(spec.get("env", {})), "PAL_RESUME": "1" if order.resume else "0",
               "PAL_LEASE_TTL": str(self.settings.lease_ttl), "PAL_VM_SANDBOX": "namespace"}
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


def driver_of(name: str, settings: Settings) -> Driver:
    if name == "namespace":
        return NamespaceDriver(settings)
    raise DriverError(f"driver {name!r} is not available on this host (available: namespace)")
