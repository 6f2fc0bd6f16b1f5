"""Recovery latency after a worker is SIGKILLed mid-step, with real `pal worker` and `pal beat` processes.

    .venv/bin/python -m bench.recovery [--kills N] [--lease-ttl 2s] [--interval 1s]

One `pal beat` runs throughout. For each kill: a solo worker armed with
PAL_FAULT_POINT=before_effect:s1 runs trigger -> s0 -> s1 -> s2 -> output (`noop` tools) and
SIGKILLs itself inside s1; the kill time is the `created_at` of the last step_started for s1.
A fresh unarmed worker is started, the run must succeed, and the recovery latency is the
`created_at` of the next step_started for s1 (generation >= 2) minus the kill time.
Target: p95 within PAL_LEASE_TTL + PAL_RECOVERY_INTERVAL + 2 s.

Everything talks to 127.0.0.1 only: a fresh Postgres schema and Redis key prefix, removed at the end.
See docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.throughput import (
    KEY_ROOT,
    Infra,
    cleanup_on_signals,
    log_tail,
    pal_settings,
    start_process,
    stop_process,
)
from pal.client import Client
from pal.core.durations import parse_go_duration
from pal.storage.database import create_engine
from pal.storage.schema.migrate import upgrade

RUN_TIMEOUT = 120.0  # seconds a run may take to succeed after the fresh worker starts
KILL_TIMEOUT = 90.0  # seconds the armed worker may take to start, reach s1 and kill itself
OVERALL_TIMEOUT = 900.0  # the whole benchmark is abandoned after this


def graph() -> dict[str, Any]:
    ids = ["trigger", "s0", "s1", "s2", "output"]
    nodes: list[dict[str, Any]] = [{"id": "trigger", "type": "trigger"}]
    nodes += [{"id": s, "type": "tool", "data": {"tool": "noop"}} for s in ("s0", "s1", "s2")]
    nodes.append({"id": "output", "type": "output", "data": {"value": "done"}})
    return {"nodes": nodes, "edges": [{"source": a, "target": b} for a, b in itertools.pairwise(ids)]}


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def worker_argv() -> list[str]:
    return [sys.executable, "-m", "pal.cli", "worker", "--pool", "solo", "--loglevel", "INFO"]


def one_kill(i: int, client: Client, env: dict[str, str], tmp: Path, deadline: float) -> float:
    """Kill one armed worker inside s1, recover with a fresh one; return the latency in seconds."""
    once = tmp / f"fired-{i}"
    armed_log, fresh_log = tmp / f"doomed-{i}.log", tmp / f"fresh-{i}.log"
    doomed = start_process(worker_argv(), env | {"PAL_FAULT_POINT": "before_effect:s1",
                                                 "PAL_FAULT_ONCE_FILE": str(once)}, armed_log)
    fresh: subprocess.Popen[bytes] | None = None
    try:
        run_id = client.start_run(graph(), {})
        try:
            doomed.wait(timeout=min(KILL_TIMEOUT, max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"kill {i}: armed worker did not die; log tail:\n"
                               f"{log_tail(armed_log)}") from None
        if doomed.returncode != -signal.SIGKILL or not once.exists():
            raise RuntimeError(f"kill {i}: armed worker exited {doomed.returncode}; log tail:\n"
                               f"{log_tail(armed_log)}")
        s1 = [e for e in client.events(run_id) if e.kind == "step_started" and e.step_id == "s1"]
        if not s1:
            raise RuntimeError(f"kill {i}: no step_started for s1 before the kill")
        killed_at = s1[-1]
        fresh = start_process(worker_argv(), env, fresh_log)
        run = client.wait(run_id, timeout=min(RUN_TIMEOUT, max(1.0, deadline - time.monotonic())))
        if run.status != "succeeded":
            raise RuntimeError(f"kill {i}: run ended {run.status}; log tail:\n{log_tail(fresh_log)}")
        again = [e for e in client.events(run_id) if e.kind == "step_started" and e.step_id == "s1"
                 and e.seq > killed_at.seq and e.generation >= 2]
        if not again:
            raise RuntimeError(f"kill {i}: no step_started for s1 at generation >= 2")
        return (again[0].created_at - killed_at.created_at).total_seconds()
    finally:
        stop_process(doomed)
        if fresh is not None:
            stop_process(fresh)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=20, help="workers to kill (default 20)")
    parser.add_argument("--lease-ttl", default="2s", help="PAL_LEASE_TTL (default 2s)")
    parser.add_argument("--interval", default="1s", help="PAL_RECOVERY_INTERVAL (default 1s)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    if not 1 <= args.kills <= 200:
        parser.error("--kills must be between 1 and 200")
    try:
        ttl, interval = parse_go_duration(args.lease_ttl), parse_go_duration(args.interval)
    except ValueError as exc:
        parser.error(str(exc))
    bound = ttl + interval + 2.0

    infra = Infra()
    infra.check()
    began = time.monotonic()
    deadline = began + OVERALL_TIMEOUT
    latencies: list[float] = []
    with cleanup_on_signals(), tempfile.TemporaryDirectory(prefix="palbench-recovery-") as tmp_name:
        tmp = Path(tmp_name)
        schema, url = infra.new_schema("recovery")
        prefix = f"{KEY_ROOT}{schema}:"
        beat: subprocess.Popen[bytes] | None = None
        client: Client | None = None
        try:
            engine = create_engine(url)
            upgrade(engine)
            engine.dispose()
            settings, env = pal_settings(url, tmp, prefix, f"palbench-{schema}")
            env |= {"PAL_LEASE_TTL": args.lease_ttl, "PAL_RECOVERY_INTERVAL": args.interval}
            settings = settings.with_(lease_ttl=ttl, recovery_interval=interval)
            beat = start_process([sys.executable, "-m", "pal.cli", "beat", "--loglevel", "INFO"],
                                 env, tmp / "beat.log")
            client = Client(settings)
            for i in range(1, args.kills + 1):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"overall timeout ({OVERALL_TIMEOUT:g}s) after {i - 1} kills")
                if beat.poll() is not None:
                    raise RuntimeError(f"pal beat exited {beat.returncode}; log tail:\n"
                                       f"{log_tail(tmp / 'beat.log')}")
                latency = one_kill(i, client, env, tmp, deadline)
                latencies.append(latency)
                print(f"kill {i:3d}/{args.kills}: recovered in {latency:6.2f}s", flush=True)
        finally:
            if client is not None:
                client.runtime.journal.engine.dispose()
                client.close()
            if beat is not None:
                stop_process(beat)
            infra.close()

    p95 = percentile(latencies, 0.95)
    print()
    print(f"PAL_LEASE_TTL={args.lease_ttl} PAL_RECOVERY_INTERVAL={args.interval} kills={len(latencies)} "
          f"total {time.monotonic() - began:.0f}s")
    print(f"recovery latency (s): min {min(latencies):.2f}  median {statistics.median(latencies):.2f}  "
          f"p95 {p95:.2f}  max {max(latencies):.2f}")
    met = p95 <= bound
    if args.json:
        args.json.write_text(json.dumps({"lease_ttl_s": ttl, "interval_s": interval, "kills": len(latencies),
                                         "median_s": statistics.median(latencies), "p95_s": p95,
                                         "max_s": max(latencies), "bound_s": bound}, indent=2))
    print(f"bound PAL_LEASE_TTL + PAL_RECOVERY_INTERVAL + 2s = {bound:.2f}s: p95 "
          f"{'within' if met else 'NOT within'} the bound")
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
