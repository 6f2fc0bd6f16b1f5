"""CPU time by process group over a measurement, read from /proc (Linux only).

On 2 cores the concurrent scenario is bound by CPU, so its steps/s follow the CPU that every
process spends per step: the driver, the worker's main process (Celery's consumer: it receives,
acks and sends the task events), its pool processes (the steps), Postgres and Redis. Summing
each group's user + system time between two snapshots shows where a step's CPU goes, for PAL and
for the peers alike. A process that starts in between (a new Postgres backend) counts from zero;
one that exits in between is lost, which no measured process does.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Iterable, Iterator
from pathlib import Path

GROUPS = ("driver", "worker", "pool", "postgres", "redis")
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PROC = Path("/proc")

Snapshot = dict[int, tuple[str, float]]  # pid -> (group, CPU seconds so far)


def _processes() -> Iterator[tuple[int, int, str, float]]:
    """(pid, parent pid, command name, CPU seconds) of every process we may read."""
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # it exited meanwhile
            continue
        yield int(entry.name), *_parse(stat)


def _parse(stat: str) -> tuple[int, str, float]:
    """(parent pid, command name, CPU seconds of all its threads) from a /proc/<pid>/stat line."""
    # The command name is in parentheses and may itself hold spaces or parentheses.
    name = stat[stat.index("(") + 1:stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[1]), name, (int(fields[11]) + int(fields[12])) / _TICKS


def seconds(pids: Iterable[int]) -> float:
    """CPU seconds so far of the given processes (a peer's server, its service, the driver);
    one that is gone or unreadable counts as 0."""
    total = 0.0
    for pid in pids:
        try:
            total += _parse((_PROC / str(pid) / "stat").read_text())[2]
        except OSError:
            continue
    return total


def snapshot(worker_pid: int, *more_workers: int) -> Snapshot:
    """CPU so far of every process in a group; `worker_pid` (and `more_workers`) are the measured
    workers' main processes, their descendants are their pools. Empty where there is no /proc."""
    if not _PROC.is_dir():
        return {}
    processes = list(_processes())
    children: dict[int, list[int]] = {}
    for pid, parent, _, _ in processes:
        children.setdefault(parent, []).append(pid)
    pool: set[int] = set()
    workers = {worker_pid, *more_workers}
    pending = [child for worker in workers for child in children.get(worker, ())]
    while pending:
        pid = pending.pop()
        pool.add(pid)
        pending.extend(children.get(pid, ()))
    me = os.getpid()
    found: Snapshot = {}
    for pid, _, name, seconds in processes:
        if pid == me:
            found[pid] = ("driver", seconds)
        elif pid in workers:
            found[pid] = ("worker", seconds)
        elif pid in pool:
            found[pid] = ("pool", seconds)
        elif name == "postgres":
            found[pid] = ("postgres", seconds)
        elif name.startswith("redis-server"):
            found[pid] = ("redis", seconds)
    return found


def ms_per_step(before: Snapshot, after: Snapshot, steps: int) -> dict[str, float]:
    """Each group's CPU milliseconds per step between two snapshots (empty without /proc)."""
    if not after or steps <= 0:
        return {}
    spent = dict.fromkeys(GROUPS, 0.0)
    for pid, (group, seconds) in after.items():
        spent[group] += seconds - before.get(pid, (group, 0.0))[1]
    return {group: 1000 * seconds / steps for group, seconds in spent.items()}


def medians(samples: list[dict[str, float]]) -> dict[str, float]:
    """Each group's median over several measurements' `ms_per_step` (empty without samples)."""
    return {group: statistics.median(s[group] for s in samples) for group in GROUPS} if samples else {}
