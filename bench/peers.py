"""What the peer benchmarks share (bench/dbos_peer.py, bench/langgraph_peer.py, bench/restate_peer.py):
the two scenarios, their sizes, the JSON shape of a result and the table each prints.

A result is {"<peer>_version", ..., "linear": {...}, "concurrent": {...}}; each scenario has
"workflows" (runs or invocations), "steps" (all of them in one repetition), "steps_per_s" (one
figure per repetition) and its "median", and where the peer measures CPU, "cpu_ms_per_step" (all
the peer's processes, per repetition) and its "cpu_ms_median". bench/all.py reads these keys.
A peer that cannot run writes {"error": "why"} instead, so that the table can say why.
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import cpu

WARM_STEPS = 10  # steps per run in the untimed warm-up round


@dataclass(frozen=True)
class Scenario:
    name: str
    workflows: int
    steps: int  # steps per workflow

    @property
    def total(self) -> int:
        return self.workflows * self.steps

    @property
    def label(self) -> str:
        return f"{self.name} ({self.workflows}x{self.steps})"


def scenarios(quick: bool) -> list[Scenario]:
    """The same shapes and sizes as bench/throughput.py: one long chain, and many shorter ones at once."""
    if quick:
        return [Scenario("linear", 1, 60), Scenario("concurrent", 5, 40)]
    return [Scenario("linear", 1, 300), Scenario("concurrent", 20, 100)]


def warm_ups(plan: list[Scenario]) -> list[Scenario]:
    """One small untimed round of each shape: pooled connections, threads, first-use code paths."""
    return [Scenario(f"warm-up {s.name}", s.workflows, WARM_STEPS) for s in plan]


def in_process_cpu() -> cpu.Snapshot:
    """CPU so far of this process and of Postgres: all a peer that runs its steps in the driving
    process spends (DBOS, LangGraph)."""
    return cpu.snapshot(-1)  # no worker process: only the driver and Postgres groups fill


def in_process_ms(before: cpu.Snapshot, steps: int) -> float:
    """CPU milliseconds per step of this process and Postgres since `before`."""
    spent = cpu.ms_per_step(before, cpu.snapshot(-1), steps)
    return spent.get("driver", 0.0) + spent.get("postgres", 0.0)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def log_rep(rep: int, reps: int, scenario: Scenario, rate: float, cpu_ms: float | None = None) -> None:
    spent = "" if cpu_ms is None else f" {cpu_ms:5.2f} ms CPU/step"
    log(f"rep {rep}/{reps} {scenario.label:<22} {scenario.total:5d} steps "
        f"{scenario.total / rate:7.2f}s {rate:8.1f} steps/s{spent}")


class Samples:
    """Each scenario's steps/s (and CPU ms per step, where measured) over the repetitions."""

    def __init__(self, plan: list[Scenario], reps: int) -> None:
        self.plan, self.reps = plan, reps
        self.rates: dict[str, list[float]] = {s.name: [] for s in plan}
        self.cpu_ms: dict[str, list[float]] = {s.name: [] for s in plan}

    def add(self, rep: int, scenario: Scenario, rate: float, cpu_ms: float | None = None) -> None:
        self.rates[scenario.name].append(rate)
        if cpu_ms is not None:
            self.cpu_ms[scenario.name].append(cpu_ms)
        log_rep(rep, self.reps, scenario, rate, cpu_ms)

    def result(self, versions: dict[str, str]) -> dict[str, Any]:
        """`versions`, then one entry per scenario in the shape the module docstring gives."""
        result: dict[str, Any] = dict(versions)
        for scenario in self.plan:
            rates, cpu_ms = self.rates[scenario.name], self.cpu_ms[scenario.name]
            row: dict[str, Any] = {"workflows": scenario.workflows, "steps": scenario.total,
                                   "steps_per_s": rates, "median": statistics.median(rates)}
            if cpu_ms:
                row.update({"cpu_ms_per_step": cpu_ms, "cpu_ms_median": statistics.median(cpu_ms)})
            result[scenario.name] = row
        return result


def print_table(title: str, peer: str, result: dict[str, Any]) -> None:
    print(title)
    header = f"{'scenario':<22} {'steps':>6} {peer + ' steps/s':>16} {'CPU ms/step':>11}  per rep"
    print(header)
    print("-" * len(header))
    for name in ("linear", "concurrent"):
        row = result[name]
        label = f"{name} ({row['workflows']}x{row['steps'] // row['workflows']})"
        samples = " ".join(f"{r:.1f}" for r in row["steps_per_s"])
        spent = row.get("cpu_ms_median")
        cpu_ms = "n/a" if spent is None else f"{spent:.2f}"
        print(f"{label:<22} {row['steps']:>6} {row['median']:16.1f} {cpu_ms:>11}  {samples}")


def finish(result: dict[str, Any], title: str, peer: str, path: Path | None) -> None:
    """Print the table and, with --json, write the result."""
    print_table(title, peer, result)
    if path is not None:
        path.write_text(json.dumps(result, indent=2))


def write_failure(path: Path | None, exc: BaseException, peer: str) -> None:
    """Say why the peer could not be measured, on stderr and in its JSON result."""
    log(f"{peer} peer failed: {exc}")
    if path is not None:
        path.write_text(json.dumps({"error": f"{type(exc).__name__}: {exc}"[:300]}))
