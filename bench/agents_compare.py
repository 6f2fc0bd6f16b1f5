"""`make bench`'s agent-shaped scenario: PAL's set-ups, LangGraph (bench/langgraph_agents.py) and
Restate (bench/restate_agents.py) on the load of bench/agents.py,
one repetition of each in turn (a drift of the machine hits every side alike), then 10,000 runs
started at once on PAL (memory stays flat, nothing is lost).

    .venv/bin/python -m bench.agents_compare [--reps N] [--runs R] [--quick] [--json OUT]

Each measurement runs in a process of its own with a stand-in of its own (bench/model_standin.py).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

# (label, the module and its arguments); PAL's workers are solo (one per core: each its own event
# loop and GIL); `pal worker`'s default (prefork) is measured too.
TWO = ["--workers", "2", "--pool-size", "10"]  # 10 connections each: 20 for the host, the client's aside
SETUPS: dict[str, list[str]] = {
    "PAL, ai-step, 1 solo worker": ["bench.agents", "--variant", "ai-step", "--workers", "1"],
    "PAL, ai-step, 2 solo workers": ["bench.agents", "--variant", "ai-step", *TWO],
    "PAL, ai-step, prefork x2 (the default)": ["bench.agents", "--variant", "ai-step", "--worker-args",
                                               "--pool prefork --concurrency 2", "--pool-size", "10"],
    "PAL, async tool, 2 solo workers": ["bench.agents", "--variant", "tool", *TWO],
    "LangGraph, ainvoke + AsyncPostgresSaver, 1 process": ["bench.langgraph_agents"],
    "Restate, ctx.run around each call, 1 service process": ["bench.restate_agents"],
}
FLOOD = "PAL, ai-step, 2 solo workers, 10,000 runs"


def measure(module: list[str], runs: int, folder: Path, name: str) -> dict[str, Any] | None:
    out = folder / f"{name}.json"
    command = [sys.executable, "-m", *module, "--runs", str(runs), "--json", str(out)]
    print(f"== agents: {' '.join(command[2:])}", file=sys.stderr, flush=True)
    subprocess.run(command, cwd=REPO, timeout=1800)
    result: dict[str, Any] | None = json.loads(out.read_text()) if out.exists() else None
    return result


def once(result: dict[str, Any]) -> bool | None:
    """Every step completed once and called the model once (None: the peer does not say)."""
    if "steps_completed" not in result:
        return result.get("finished") and result.get("repeated_keys") == 0
    return bool(result["finished"] and result["steps_completed"] == result["steps_expected"]
                == result["model_calls"] and result["repeated_keys"] == 0)


def summary(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the repetitions; the worst of peaks; whether every one was exactly once."""
    def median(key: str) -> float | None:
        values = [s[key] for s in samples if isinstance(s.get(key), int | float)]
        return statistics.median(values) if values else None

    memory = [s.get("peak_worker_mb") or s.get("peak_mb") or 0 for s in samples]
    cpu = [sum(s["cpu_ms_per_step"].values()) if isinstance(s.get("cpu_ms_per_step"), dict)
           else s.get("cpu_ms_per_step") for s in samples]
    return {"reps": len(samples), "wall_s": median("wall_s"), "wall_over_ideal": median("wall_over_ideal"),
            "start_runs_s": median("start_runs_s"), "steps_per_s": median("steps_per_s"),
            "peak_connections": max(s.get("peak_connections") or 0 for s in samples),
            "peak_mb": max(memory), "cpu_ms_per_step": statistics.median(c for c in cpu if c is not None)
            if any(c is not None for c in cpu) else None,
            "exactly_once": all(once(s) for s in samples), "samples": samples}


def run(reps: int, runs: int, flood: int | None) -> dict[str, Any]:
    kept: dict[str, list[dict[str, Any]]] = {label: [] for label in SETUPS}
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="palbench-agents-") as tmp:
        folder = Path(tmp)
        for rep in range(reps):
            for index, (label, module) in enumerate(SETUPS.items()):
                result = measure(module, runs, folder, f"r{rep}-{index}")
                if result is None:
                    failed.append(label)
                else:
                    kept[label].append(result)
        table = {label: summary(samples) for label, samples in kept.items() if samples}
        if flood:
            result = measure(SETUPS["PAL, ai-step, 2 solo workers"], flood, folder, "flood")
            if result is None:
                failed.append(FLOOD)
            else:
                table[FLOOD] = summary([result])
    return {"runs": runs, "ideal_s": 3.0, "table": table, "failed": failed}


def report_lines(result: dict[str, Any] | None) -> list[str]:
    """The agent-shaped table of docs/benchmarks.md's `make bench` block."""
    if not result:
        return []
    rows = [f"| {label} | {_n(row['wall_s'], '.1f')} | {_n(row['wall_over_ideal'], '.1f')}x "
            f"| {_n(row['start_runs_s'], '.1f')} | {_n(row['steps_per_s'], '.0f')} "
            f"| {row['peak_connections']} | {row['peak_mb']} | {_n(row['cpu_ms_per_step'], '.1f')} "
            f"| {'yes' if row['exactly_once'] else '**no**'} |"
            for label, row in result["table"].items()]
    failed = ["", f"No result in this run: {', '.join(result['failed'])}."] if result.get("failed") else []
    return [f"Agents (bench/agents_compare.py): {result['runs']:,} runs of 3 steps, each step one call to a "
            "model stand-in answering after 1 s, all started at once; ideal 3 s. Medians over the "
            "repetitions; peaks are the worst seen; memory is the worker processes' RSS (LangGraph: its "
            "one process; Restate: its server and service after the load); connections are the "
            "workers' and the starting client's together (Restate keeps its journal outside Postgres).",
            "",
            "| set-up | wall s | wall / ideal | starting s | steps/s | peak Postgres connections | peak MB "
            "| CPU ms / step, all processes | every step once |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---|", *rows, *failed]


def _n(value: Any, spec: str) -> str:
    return "n/a" if not isinstance(value, int | float) else format(value, spec)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--flood", type=int, default=10_000, help="runs started at once on PAL (0: none)")
    parser.add_argument("--quick", action="store_true", help="100 runs, no flood: a smoke test")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    runs, flood = (100, None) if args.quick else (args.runs, args.flood or None)
    result = run(args.reps, runs, flood)
    print("\n".join(report_lines(result)))
    if args.json:
        args.json.write_text(json.dumps(result))
    return 0 if not result["failed"] else 1


if __name__ == "__main__":
    sys.exit(main())
