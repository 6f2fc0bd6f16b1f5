"""A VM's cgroups: its memory, CPU and process-count limits (docs/isolated-tier.md).

cgroup v2 where the host delegates the memory, pids and cpu controllers to the unified hierarchy;
else the v1 hierarchies `memory`, `pids` and `cpu` under /sys/fs/cgroup. The harness makes one
group per VM, puts its sandbox (or qemu) in it before anything runs there, and removes it after.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

from pal.vms import DriverError

ROOT = Path("/sys/fs/cgroup")
_V1 = ("memory", "pids", "cpu")
_PERIOD_US = 100_000


@dataclass(frozen=True)
class Limits:
    memory_bytes: int
    cpus: float
    pids: int


def _v2_root(root: Path) -> Path | None:
    controllers = root / "cgroup.controllers"
    if controllers.exists() and set(_V1) <= set(controllers.read_text().split()):
        return root
    return None


def available(root: Path = ROOT) -> str | None:
    """What stops this host from limiting a VM, or None when it can."""
    if _v2_root(root) is not None:
        return None
    missing = [c for c in _V1 if not (root / c / "cgroup.procs").exists()]
    if missing:
        return (f"this host offers no cgroup v2 with memory, pids and cpu delegated, nor the v1 "
                f"controllers {', '.join(missing)} under {root}: a VM could not be limited")
    return None


def _remove_empty_siblings(group: Path) -> None:
    """The groups of VMs whose harness was killed before it removed them: a group with a process
    left refuses rmdir, so only empty ones go."""
    for sibling in group.parent.glob("vm_*"):
        if sibling != group:
            with contextlib.suppress(OSError):
                sibling.rmdir()


class Group:
    """One VM's cgroup (v2) or groups (v1), made with its limits."""

    def __init__(self, name: str, limits: Limits, root: Path = ROOT) -> None:
        problem = available(root)
        if problem:
            raise DriverError(problem)
        v2 = _v2_root(root)
        if v2 is not None:
            parent = v2 / "pal"
            parent.mkdir(exist_ok=True)
            (parent / "cgroup.subtree_control").write_text("+memory +pids +cpu")
            self.dirs = [parent / name]
            self.dirs[0].mkdir(exist_ok=True)
            _remove_empty_siblings(self.dirs[0])
            self._write(self.dirs[0], "memory.max", str(limits.memory_bytes))
            with contextlib.suppress(FileNotFoundError):  # no swap accounting: nothing to cap
                self._write(self.dirs[0], "memory.swap.max", "0")
            self._write(self.dirs[0], "pids.max", str(limits.pids))
            self._write(self.dirs[0], "cpu.max", f"{round(limits.cpus * _PERIOD_US)} {_PERIOD_US}")
            return
        self.dirs = []
        for controller in _V1:
            group = root / controller / "pal" / name
            group.mkdir(parents=True, exist_ok=True)
            self.dirs.append(group)
            _remove_empty_siblings(group)
        memory, pids, cpu = self.dirs
        self._write(memory, "memory.limit_in_bytes", str(limits.memory_bytes))
        with contextlib.suppress(FileNotFoundError, PermissionError):  # memsw exists with swap accounting
            self._write(memory, "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
        self._write(pids, "pids.max", str(limits.pids))
        self._write(cpu, "cpu.cfs_period_us", str(_PERIOD_US))
        self._write(cpu, "cpu.cfs_quota_us", str(round(limits.cpus * _PERIOD_US)))

    @staticmethod
    def _write(group: Path, name: str, value: str) -> None:
        (group / name).write_text(value)

    def join(self) -> None:
        """Put the calling process in the group (a child's preexec: all it starts stays inside)."""
        for group in self.dirs:
            with open(group / "cgroup.procs", "w") as procs:
                procs.write(str(os.getpid()))

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of this VM for its memory limit."""
        for group in self.dirs:
            for name in ("memory.events", "memory.oom_control"):
                with contextlib.suppress(OSError):
                    for line in (group / name).read_text().splitlines():
                        key, _, value = line.partition(" ")
                        if key == "oom_kill" and value.strip() not in ("", "0"):
                            return True
        return False

    def remove(self, wait_s: float = 5.0) -> None:
        """Remove the groups once their processes are gone (a killed sandbox leaves in moments)."""
        deadline = time.monotonic() + wait_s
        for group in self.dirs:
            while True:
                try:
                    group.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.05)
