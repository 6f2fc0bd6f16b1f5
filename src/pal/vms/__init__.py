"""VM drivers of the isolated tier, behind one interface (docs/isolated-tier.md).

A driver starts the harness (`python -m pal.harness`) for one VM on this host; the harness starts the
workload in the driver's sandbox and reports to the control plane. Liveness needs no polling of
the driver: the harness's heartbeats renew the run's lease, and the sweep reconciles a VM whose
heartbeats stopped (a killed VM, a lost host) to `terminated`.

- `namespace` (the default): Linux namespaces, an unprivileged user, no capabilities, a seccomp
  filter and cgroup limits (pal.vms.sandbox).
- `qemu-microvm`: a microVM of its own kernel, booted by qemu (pal.vms.qemu).
- `firecracker`: drives Firecracker's HTTP API over its Unix socket (pal.vms.firecracker).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from pal.errors import PalError


class DriverError(PalError):
    """A VM could not be started on this host."""


@dataclass(frozen=True)
class Placement:
    """Where one VM lives on its host: PAL_VM_ROOT, its work directory below it, its state folder
    (pal.vms.paths makes them)."""

    root: Path
    work: tuple[str, ...]
    state: Path


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

    @property
    def tenant_id(self) -> str: ...


class Driver(Protocol):
    name: str

    def spawn(self, order: VmOrderLike, token: str, *, place: Placement) -> int:
        """Start the VM's harness; returns its pid on this host."""
        ...

    def terminate(self, pid: int) -> None: ...
