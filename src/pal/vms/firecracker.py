"""The `firecracker` driver, for production VM hosts (docs/isolated-tier.md).

It starts `firecracker --api-sock <sock>` and configures the microVM through Firecracker's HTTP API
on that Unix socket: machine size, the guest kernel with the VM's id and resume flag on its command
line, a read-only root drive (`PAL_FIRECRACKER_ROOTFS`), the work directory's image (kept under
`PAL_VM_ROOT/.state/images`) as a writable drive, a vsock device whose host end is a Unix socket in
the VM's state folder; then `InstanceStart`. The report token never enters the guest (its command
line and metadata are readable by every guest process): reports are to leave through the vsock to a
relay on the host that holds it. Not built yet: that relay and the guest image's init; so a
Firecracker VM boots but does not report, and the sweep gives up on it after three VMs. Firecracker
is not obtainable on the machines PAL is tested on: the tests drive a local stand-in of the API that
records each call.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from pal.config import Settings
from pal.core.vms import Resources
from pal.vms import DriverError, Placement, VmOrderLike
from pal.vms.harnessed import within_host_caps
from pal.vms.paths import create_private, open_dir

_SOCKET_WAIT_S = 5.0  # how long Firecracker may take to open its API socket
GUEST_CID = 3  # the guest's vsock context id (2 is the host)


def work_image(place: Placement) -> Path:
    """The work directory's disk image, kept across the run's VMs where no guest can reach its path:
    PAL_VM_ROOT/.state/images/<digest of the work directory's path>.img."""
    os.close(open_dir(place.root, [".state", "images"]))
    digest = hashlib.sha256("/".join(place.work).encode()).hexdigest()[:40]
    return place.root / ".state" / "images" / f"{digest}.img"


class FirecrackerDriver:
    name = "firecracker"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def spawn(self, order: VmOrderLike, token: str, *, place: Placement) -> int:
        del token  # kept on the host, never handed to the guest (see the module's docstring)
        for what, path in (("PAL_FIRECRACKER_KERNEL", self.settings.firecracker_kernel),
                           ("PAL_FIRECRACKER_ROOTFS", self.settings.firecracker_rootfs)):
            if not path or not Path(path).is_file():
                raise DriverError(f"{what} must name the guest's {what.rsplit('_', 1)[1].lower()} file, "
                                  f"not {path!r}")
        limits = within_host_caps(order.spec if isinstance(order.spec, Mapping) else {}, self.settings)
        api_sock = place.state / "firecracker.sock"
        api_sock.unlink(missing_ok=True)
        log = create_private(place.state / "firecracker.log")
        try:
            process = subprocess.Popen([self.settings.firecracker_bin, "--api-sock", str(api_sock)],
                                       stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                       start_new_session=True)
        except OSError as exc:
            raise DriverError(f"firecracker did not start ({self.settings.firecracker_bin}): {exc}") from exc
        finally:
            os.close(log)
        threading.Thread(target=process.wait, name=f"reap-{order.vm_id}", daemon=True).start()
        try:
            self._configure(api_sock, order, place, limits)
        except (DriverError, httpx.HTTPError) as exc:
            self.terminate(process.pid)
            raise DriverError(f"configuring the microVM failed: {exc}") from exc
        return process.pid

    def _configure(self, api_sock: Path, order: VmOrderLike, place: Placement, limits: Resources) -> None:
        deadline = time.monotonic() + _SOCKET_WAIT_S
        while not api_sock.exists():
            if time.monotonic() > deadline:
                raise DriverError(f"firecracker opened no API socket at {api_sock} in {_SOCKET_WAIT_S:g}s")
            time.sleep(0.02)
        calls: list[tuple[str, dict[str, Any]]] = [
            ("/machine-config", {"vcpu_count": max(1, math.ceil(limits.cpus)),
                                 "mem_size_mib": limits.memory_mb}),
            ("/boot-source", {"kernel_image_path": self.settings.firecracker_kernel,
                              "boot_args": (f"console=ttyS0 reboot=k panic=1 pci=off pal.vm={order.vm_id} "
                                            f"pal.resume={int(order.resume)}")}),
            ("/drives/rootfs", {"drive_id": "rootfs", "path_on_host": self.settings.firecracker_rootfs,
                                "is_root_device": True, "is_read_only": True}),
            ("/drives/work", {"drive_id": "work", "path_on_host": str(work_image(place)),
                              "is_root_device": False, "is_read_only": False}),
            ("/vsock", {"guest_cid": GUEST_CID, "uds_path": str(place.state / "vsock.sock")}),
            ("/actions", {"action_type": "InstanceStart"}),
        ]
        transport = httpx.HTTPTransport(uds=str(api_sock))
        with httpx.Client(transport=transport, base_url="http://localhost", timeout=5.0) as api:
            for path, body in calls:
                reply = api.put(path, json=body)
                if reply.status_code >= 300:
                    raise DriverError(f"PUT {path}: HTTP {reply.status_code}: {reply.text[:300]}")

    def terminate(self, pid: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
