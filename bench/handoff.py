"""Hand-off latency and a fan-out: how long a step's successor waits after the step is on record.

    .venv/bin/python bench/handoff.py [--reps N] [--quick] [--json PATH]

For every step that another step made ready, the hand-off is the time from the `step_completed`
that made it ready (the latest of its predecessors') to its own `step_started`, both read from the
journal (each event's time is taken by the writer just before its commit): the message's publish,
the broker, the worker picking it up and the claim. Percentiles p50 and p99 over all hand-offs of
a scenario, per repetition, then the median of those:
  linear       one run of N sequential no-op tool nodes (as bench/throughput.py)
  concurrent   K such runs at once (the hand-off under load)
  fanout       one run: trigger -> B parallel no-op nodes -> one join node (B = 200); its steps/s
               and the hand-offs of the B branches (all made ready by the trigger at once)
Same settings as bench/throughput.py: a fresh schema, key prefix, queue and workers per
measurement, 127.0.0.1 only; each scenario is measured with both of its PAL set-ups, one `pal worker`
with 2 prefork processes, and 2 solo workers (whose steps take their successors' messages as they
hand off, pal.workers.inline).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.throughput import (  # noqa: E402
    CONCURRENCY,
    MEASURE_TIMEOUT,
    READY_TIMEOUT,
    SOLO_WORKERS,
    Infra,
    _wait_terminal,
    bench_arguments,
    bench_schema,
    cleanup_on_signals,
    linear_graph,
    start_pal_workers,
    stop_process,
)
from pal.client import Client  # noqa: E402
from pal.core.records import Event  # noqa: E402

FANOUT_BRANCHES = 200


def fanout_graph(branches: int) -> dict[str, Any]:
    """trigger -> b0 .. b{branches-1} (noop tools, in parallel) -> join (output): branches + 2 steps."""
    nodes: list[dict[str, Any]] = [{"id": "start", "type": "trigger"}]
    nodes += [{"id": f"b{i}", "type": "tool", "data": {"tool": "noop"}} for i in range(branches)]
    nodes.append({"id": "join", "type": "output", "data": {"value": "done"}})
    edges = [{"source": "start", "target": f"b{i}"} for i in range(branches)]
    edges += [{"source": f"b{i}", "target": "join"} for i in range(branches)]
    return {"nodes": nodes, "edges": edges}


def handoffs_ms(graph: dict[str, Any], events: Sequence[Event]) -> list[float]:
    """Each step's hand-off in ms: its first step_started minus its predecessors' last step_completed."""
    preds: dict[str, list[str]] = {}
    for edge in graph["edges"]:
        preds.setdefault(edge["target"], []).append(edge["source"])
    completed = {e.step_id: e.created_at for e in events if e.kind == "step_completed" and e.step_id}
    started: dict[str, Any] = {}
    for e in events:
        if e.kind == "step_started" and e.step_id and e.step_id not in started:
            started[e.step_id] = e.created_at
    out = []
    for step, at in started.items():
        before = [completed[p] for p in preds.get(step, []) if p in completed]
        if before:
            out.append((at - max(before)).total_seconds() * 1000)
    return out


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


SETUPS = {"prefork": f"PAL prefork, {CONCURRENCY} processes", "solo": f"PAL {SOLO_WORKERS} solo workers"}


def measure(infra: Infra, tmp: Path, graph: dict[str, Any], runs: int, setup: str) -> dict[str, float]:
    """One measurement: steps/s and hand-off p50/p99 (ms) of `runs` runs of `graph` started at once."""
    with bench_schema(infra, "handoff", tmp) as (schema, settings, env):
        workers = start_pal_workers(env, tmp / schema / "worker.log", solo=setup == "solo")
        client = Client(settings)
        try:
            _wait_terminal(client, [client.start_run(linear_graph(2)) for _ in range(4)], READY_TIMEOUT)
            t0 = time.time()
            ids = [client.start_run(graph) for _ in range(runs)]
            finished = _wait_terminal(client, ids, MEASURE_TIMEOUT)
            if any(r.status != "succeeded" for r in finished):
                raise RuntimeError(f"runs ended {[r.status for r in finished]}")
            end = max(r.finished_at.timestamp() for r in finished)
            journals = [client.events(r) for r in ids]
        finally:
            client.runtime.journal.engine.dispose()
            client.close()
            for worker in workers:
                stop_process(worker)
    steps = sum(1 for j in journals for e in j if e.kind == "step_completed")
    latencies = [ms for j in journals for ms in handoffs_ms(graph, j)]
    return {"steps_per_s": steps / (end - t0), "p50_ms": percentile(latencies, 0.5),
            "p99_ms": percentile(latencies, 0.99), "handoffs": len(latencies)}


def main(argv: list[str] | None = None) -> int:
    args, reps = bench_arguments(__doc__, "smaller graphs", None, argv)
    sizes = {"linear": (1, 60), "concurrent": (5, 40), "fanout": (1, 50)} if args.quick else {
        "linear": (1, 300), "concurrent": (20, 100), "fanout": (1, FANOUT_BRANCHES)}
    graphs = {"linear": linear_graph(sizes["linear"][1]), "concurrent": linear_graph(sizes["concurrent"][1]),
              "fanout": fanout_graph(sizes["fanout"][1])}
    samples: dict[str, list[dict[str, float]]] = {
        f"{name}/{setup}": [] for name in graphs for setup in SETUPS}
    infra = Infra()
    infra.check()
    with cleanup_on_signals(), tempfile.TemporaryDirectory(prefix="palbench-") as tmp_name:
        try:
            for rep in range(1, reps + 1):
                for name, graph in graphs.items():
                    for setup in SETUPS:
                        m = measure(infra, Path(tmp_name), graph, sizes[name][0], setup)
                        samples[f"{name}/{setup}"].append(m)
                        print(f"rep {rep}/{reps} {name:<11} {setup:<8} {m['steps_per_s']:7.1f} steps/s  "
                              f"hand-off p50 {m['p50_ms']:6.2f} ms  p99 {m['p99_ms']:7.2f} ms  "
                              f"({m['handoffs']:.0f})", flush=True)
        finally:
            infra.close()
    keys = ("steps_per_s", "p50_ms", "p99_ms")
    table = [{"scenario": f"{name} ({sizes[name][0]}x{sizes[name][1]}), {SETUPS[setup]}",
              **{k: statistics.median(s[k] for s in samples[f"{name}/{setup}"]) for k in keys}}
             for name in graphs for setup in SETUPS]
    for row in table:
        print(f"{row['scenario']:<48} {row['steps_per_s']:8.1f} steps/s  hand-off p50 {row['p50_ms']:6.2f} ms"
              f"  p99 {row['p99_ms']:7.2f} ms")
    if args.json:
        args.json.write_text(json.dumps({"table": table, "samples": samples}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
