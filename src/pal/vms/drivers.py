"""Which driver starts a VM: the run document's `driver`, one of those built here."""

from __future__ import annotations

from pal.config import Settings
from pal.vms import Driver, DriverError
from pal.vms.firecracker import FirecrackerDriver
from pal.vms.harnessed import HarnessedDriver

BUILT = ("namespace", "qemu-microvm", "firecracker")


def driver_of(name: str, settings: Settings) -> Driver:
    if name in ("namespace", "qemu-microvm"):
        return HarnessedDriver(settings, name)
    if name == "firecracker":
        return FirecrackerDriver(settings)
    raise DriverError(f"driver {name!r} is not available on this host (available: {', '.join(BUILT)})")
