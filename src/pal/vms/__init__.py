"""VM drivers of the isolated tier, behind one interface (docs/isolated-tier.md).

A driver starts the harness (`python -m pal.harness`) for one VM on this host; the harness starts the
workload in the driver's sandbox and reports to the control plane. Liveness needs no polling of
the driver: the harness's heartbeats renew the run's lease, and the sweep reconciles a VM whose
heartbeats stopped (a killed VM, a lost host) to `terminated`.

- `namespace` (the default here): Linux namespaces via `unshare` (pid, mount, network, ipc, uts):
  the workload is PID 1 of its own tree, sees only a loopback interface, cannot reach the host's
  services, cannot write outside its work directory, and dies with its harness.
- `firecracker`: drives Firecracker's HTTP API over its Unix socket (pal.vms.firecracker).
- `qemu-microvm`: not built yet; asking for it is refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

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
