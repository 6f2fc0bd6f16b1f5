"""Fairness under a flood: one tenant starts F runs at once, then another tenant starts P runs one by
one while the flood drains; how long each of the other tenant's runs waits from its start to its
first step's start. Measured in one run with PAL_TENANT_CONCURRENCY off (today's FIFO: behind the
flood) and on (the flood held, a slot free for the newcomer).

    .venv/bin/python -m bench.fairness [--flood F] [--probes P] [--limit L] [--json OUT]

Each run is trigger -> noop -> output on one solo `pal worker`, all on the local Postgres and
Redis (127.0.0.1 only); each measurement has its own schema, key prefix and queue, removed after.
The probing tenant has weight 100 (PAL_TENANT_WEIGHTS), so that its own limit never holds a probe.
Reported: the probes' wait p50, p99 and most, per set-up, and the ratio of the p99s.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.throughput import Infra, bench_schema, cleanup_on_signals, log_tail, start_process, stop_process
from pal.client import Client
from pal.config.admission import load_admission

GRAPH = {"nodes": [{"id": "t", "type": "trigger"}, {"id": "work", "type": "tool", "data": {"tool": "noop"}},
                   {"id": "out", "type": "output"}],
         "edges": [{"source": "t", "target": "work"}, {"source": "work", "target": "out"}]}
PROBE_GAP_S = 0.05


def first_step_wait(client: Client, run_id: str, deadline: float) -> float | None:
    """Seconds from the run's creation to its first step's start; None if it had none by the deadline."""
    while time.monotonic() < deadline:
        started = [e.created_at for e in client.events(run_id) if e.kind == "step_started"]
        if started:
            return (min(started) - client.get_run(run_id).created_at).total_seconds()
        time.sleep(0.02)
    return None


def measure(infra: Infra, flood: int, probes: int, limit: int, timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, bench_schema(infra, "fair", Path(tmp)) as (_, settings, env):
        # The probing tenant's own limit must never hold its probes: the wait measured is the flood's.
        env = env | {"PAL_TENANT_CONCURRENCY": str(limit), "PAL_TENANT_WEIGHTS": json.dumps({"probe": 100})}
        log = Path(tmp) / "worker.log"
        worker = start_process([sys.executable, "-m", "pal.cli", "worker", "--pool", "solo", "--loglevel",
                                "WARNING"], env, log)
        client = Client(dataclasses.replace(settings, max_runs_in_flight=2 * flood + probes,
                                            admission=load_admission(env)))
        try:
            client.wait(client.start_run(GRAPH, {"warm": True}, tenant_id="probe"), timeout=60)
            began = time.monotonic()
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(lambda n: client.start_run(GRAPH, {"n": n}, tenant_id="flood"), range(flood)))
            flooded_s = time.monotonic() - began
            probe_ids = []
            for n in range(probes):
                probe_ids.append(client.start_run(GRAPH, {"probe": n}, tenant_id="probe"))
                time.sleep(PROBE_GAP_S)
            deadline = time.monotonic() + timeout
            waits = [first_step_wait(client, run_id, deadline) for run_id in probe_ids]
            done = [w for w in waits if w is not None]
            ranked = sorted(done) or [float("nan")]
            p99 = ranked[max(0, int(len(ranked) * 0.99) - 1)]
            return {"limit": limit, "flood": flood, "probes": probes, "flood_start_s": round(flooded_s, 2),
                    "started": len(done), "wait_p50_ms": round(statistics.median(ranked) * 1000, 1),
                    "wait_p99_ms": round(p99 * 1000, 1), "wait_max_ms": round(ranked[-1] * 1000, 1)}
        finally:
            client.close()
            stop_process(worker)
            if "Error" in log.read_text(errors="replace"):
                print(log_tail(log), file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flood", type=int, default=10_000)
    parser.add_argument("--probes", type=int, default=100)
    parser.add_argument("--limit", type=int, default=4, help="PAL_TENANT_CONCURRENCY when on")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds the probes may wait, at most")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    infra = Infra()
    infra.check()
    with cleanup_on_signals():
        off = measure(infra, args.flood, args.probes, 0, args.timeout)
        on = measure(infra, args.flood, args.probes, args.limit, args.timeout)
    result = {"off": off, "on": on,
              "p99_on_over_off": round(on["wait_p99_ms"] / off["wait_p99_ms"], 4)}
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result))
    return 0 if off["started"] == on["started"] == args.probes else 1


if __name__ == "__main__":
    sys.exit(main())
