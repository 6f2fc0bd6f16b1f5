"""A real VM host for the isolated tier's tests: `pal worker --vm-host` beside the `api` fixture's
control plane and a `pal beat`, its PAL_VM_ROOT a folder of the test's own."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.conftest import REPO
from tests.support.api_server import Api
from tests.support.processes import Processes

# The qemu-microvm guest `make vm-guest` builds. KVM on the machines this suite was written on cannot
# boot a guest kernel (its CPUID lacks SSE3; the boot hangs after the setup stub), so the suite runs
# the microVMs emulated unless PAL_TEST_VM_ACCEL=kvm says the host's KVM works.
VM_GUEST = REPO / ".venv" / "vm-guest"
VM_ACCEL = os.environ.get("PAL_TEST_VM_ACCEL", "tcg")


def start_vm_host(api: Api, processes: Processes, tmp_path: Path, **env: str) -> Path:
    """A VM host worker reporting to `api`, and beat; returns its PAL_VM_ROOT."""
    root = tmp_path / "vm-root"
    root.mkdir()
    processes.start(["worker", "--pool", "solo", "--vm-host", "--loglevel", "INFO"], "vmhost.log",
                    PAL_CONTROL_URL=api.url, PAL_VM_ROOT=str(root), PAL_VM_GUEST=str(VM_GUEST),
                    PAL_VM_ACCEL=VM_ACCEL, **env)
    processes.beat()
    return root


@contextlib.contextmanager
def vm_host_of(api: Api, processes: Processes, tmp_path: Path, **env: str) -> Iterator[tuple[Api, Path]]:
    root = start_vm_host(api, processes, tmp_path, **env)
    try:
        yield api, root
    finally:
        stop_vms(api)


def stop_vms(api: Api) -> None:
    """Harnesses run in sessions of their own: kill every VM the test's runs started."""
    journal = api.client.runtime.journal
    for run in api.client.list_runs(limit=200):
        for vm in journal.vms.vms(run.id):
            if vm.pid:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(vm.pid, signal.SIGKILL)


def microvm(workdir: str, *command: str, driver: str = "namespace", **env: str) -> dict[str, Any]:
    return {"kind": "microvm", "command": list(command), "workdir": workdir, "env": env, "driver": driver}


def logs(root: Path) -> str:
    """Every VM's harness log and console, from the VM host's state folders."""
    found = sorted((root / ".state").glob("*/*.log"))
    return "\n".join(f"== {p}\n{p.read_text(errors='replace')}" for p in found) or "(no harness log)"
