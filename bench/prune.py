"""Retention's cost: `pal runs prune` over a journal of finished runs, and the step path beside it.

    .venv/bin/python -m bench.prune [--runs N] [--batch N] [--keep-receipts] [--quick] [--json OUT]

Fills a fresh Postgres schema with N finished runs (default 100,000) of a 3-tool linear graph,
12 journal events each, cloned with set-based SQL (INSERT ... SELECT generate_series) from a
template run PAL itself wrote, finished over the past days. Then, in this process, the step path
(`pal.engine.steps.execute_step` of 5-tool linear runs, one after another, with a recording
publisher) is timed for a few seconds alone and then while `pal runs prune --finished-before
<an hour ago>` runs as a subprocess, as an operator runs it beside live workers. Printed: the
prune's runs/s and events/s, its batches, and the step latency p50/p99 alone and during the prune.
--quick: 10,000 runs. Everything talks to 127.0.0.1 only; the schema is removed at the end, also on
failure and SIGTERM. See docs/retention.md and docs/benchmarks.md.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from bench.scale import Outbox, clone_sql, interruptible, pal_revision, run_template
from bench.throughput import Infra, bench_arguments, bench_schema, cleanup_on_signals, linear_graph
from pal.core import dsse
from pal.core.clock import utcnow
from pal.engine.runs import start_run
from pal.engine.runtime import Runtime
from pal.engine.steps import execute_step
from pal.storage.database import create_engine
from pal.storage.schema import journal_events, runs

ALONE_SECONDS = 5.0  # the step path timed with no prune running
PRUNE_TIMEOUT = 1800.0


def say(message: str) -> None:
    print(f"[prune] {message}", file=sys.stderr, flush=True)


def fill(engine: sa.Engine, rt: Runtime, outbox: Outbox, count: int) -> int:
    """`count` finished runs cloned from one PAL wrote; the events per run."""
    template = run_template(rt, outbox, linear_graph(3), None)
    every = "(INTERVAL '1 day' + INTERVAL '1 second' * i)"  # finished over the past days
    new_id = "'old_' || md5('old-' || i)"
    with interruptible(), engine.begin() as conn:
        per_run = conn.execute(sa.select(sa.func.count()).select_from(journal_events)
                               .where(journal_events.c.run_id == template)).scalar_one()
        conn.execute(sa.text(clone_sql(runs, {
            "id": new_id, "created_at": f"t.created_at - {every}", "started_at": f"t.started_at - {every}",
            "finished_at": f"t.finished_at - {every}"},
            "runs t CROSS JOIN generate_series(1, :n) AS i WHERE t.id = :template")),
            {"n": count, "template": template})
        events = {"run_id": new_id, "created_at": f"t.created_at - {every}"}
        conn.execute(sa.text(clone_sql(journal_events, events, "journal_events t CROSS JOIN "
                                       "generate_series(1, :n) AS i WHERE t.run_id = :template "
                                       "ORDER BY i, t.seq")),
                     {"n": count, "template": template})
        conn.execute(sa.text("DELETE FROM runs WHERE id = :t"), {"t": template})
    with interruptible(), engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        for table in ("runs", "journal_events"):
            conn.exec_driver_sql(f"VACUUM ANALYZE {table}")
    return int(per_run)


class StepPath:
    """execute_step of one linear run after another; each step's latency recorded."""

    def __init__(self, rt: Runtime, outbox: Outbox) -> None:
        self.rt, self.outbox = rt, outbox

    def steps_for(self, keep_going: Any) -> list[float]:
        latencies: list[float] = []
        while keep_going():
            if not self.outbox.sent:
                start_run(self.rt, linear_graph(5), {})
            run_id, step_id, generation = self.outbox.sent.pop(0)
            started = time.perf_counter()
            execute_step(self.rt, run_id, step_id, generation)
            latencies.append(time.perf_counter() - started)
        return latencies


def percentiles(latencies: list[float]) -> dict[str, float]:
    if len(latencies) < 2:
        return {"steps": len(latencies), "p50_ms": float("nan"), "p99_ms": float("nan")}
    cuts = statistics.quantiles(latencies, n=100)
    return {"steps": len(latencies), "p50_ms": round(1000 * cuts[49], 2), "p99_ms": round(1000 * cuts[98], 2)}


def measure(infra: Infra, tmp: Path, count: int, batch: int, keep_receipts: bool) -> dict[str, Any]:
    with bench_schema(infra, "prune", tmp) as (_schema, settings, env):
        engine = create_engine(settings.database_url)
        try:
            outbox = Outbox()
            rt = Runtime(settings, outbox)
            say(f"filling {count:,} finished runs")
            began = time.monotonic()
            per_run = fill(engine, rt, outbox, count)
            say(f"filled {count:,} runs, {count * per_run:,} events in {time.monotonic() - began:.1f}s")
            path = StepPath(rt, outbox)
            warm = time.monotonic() + 1.0  # caches and prepared statements, not measured
            path.steps_for(lambda: time.monotonic() < warm)
            until = time.monotonic() + ALONE_SECONDS
            alone = path.steps_for(lambda: time.monotonic() < until)
            if keep_receipts:
                env = env | {"PAL_SIGNING_KEY": dsse.private_text(dsse.new_private_key())}
            cutoff = (utcnow() - timedelta(hours=1)).isoformat()
            args = [sys.executable, "-m", "pal.cli", "runs", "prune", "--finished-before", cutoff,
                    "--batch", str(batch), "--json", *(["--keep-receipts"] if keep_receipts else [])]
            pruner = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True)
            during = path.steps_for(lambda: pruner.poll() is None)
            out, err = pruner.communicate(timeout=PRUNE_TIMEOUT)
            if pruner.returncode != 0:
                raise RuntimeError(f"pal runs prune exited {pruner.returncode}: {err[-2000:]}")
            summary = json.loads(out)
            with engine.connect() as conn:
                left = conn.execute(sa.select(sa.func.count()).select_from(runs)
                                    .where(runs.c.id.like("old\\_%", escape="\\"))).scalar_one()
            if left or summary["runs"] != count:
                raise RuntimeError(f"the prune left {left} of the filled runs ({summary})")
        finally:
            engine.dispose()
    seconds = summary["seconds"]
    return {"revision": pal_revision(), "runs": count, "events_per_run": per_run, "batch": batch,
            "keep_receipts": keep_receipts, "prune_seconds": seconds, "batches": summary["batches"],
            "runs_per_s": round(count / seconds), "events_per_s": round(summary["events"] / seconds),
            "step_alone": percentiles(alone), "step_during_prune": percentiles(during)}


def main(argv: list[str] | None = None) -> int:
    def options(parser: Any) -> None:
        parser.add_argument("--runs", type=int, default=None, help="finished runs to fill (default 100,000)")
        parser.add_argument("--batch", type=int, default=500, help="--batch of the prune (default 500)")
        parser.add_argument("--keep-receipts", action="store_true", help="prune with --keep-receipts")

    args, _reps = bench_arguments(__doc__, "10,000 runs", options, argv)
    count = args.runs if args.runs is not None else (10_000 if args.quick else 100_000)
    if not 1 <= count <= 2_000_000:
        sys.exit("--runs must be between 1 and 2,000,000 (the machine is shared)")
    infra = Infra()
    infra.check()
    with cleanup_on_signals(), tempfile.TemporaryDirectory(prefix="palbench-prune-") as folder:
        result = measure(infra, Path(folder), count, args.batch, args.keep_receipts)
    alone, during = result["step_alone"], result["step_during_prune"]
    print(f"pal runs prune, {result['runs']:,} finished runs x {result['events_per_run']} events, batch "
          f"{result['batch']}{', --keep-receipts' if result['keep_receipts'] else ''} ({result['revision']})")
    print(f"  {result['prune_seconds']:.1f}s in {result['batches']} batches: "
          f"{result['runs_per_s']:,} runs/s, {result['events_per_s']:,} events/s")
    for label, figures in (("alone", alone), ("during it", during)):
        print(f"  step path {label + ':':<11} {figures['steps']:>6} steps, p50 {figures['p50_ms']} ms, "
              f"p99 {figures['p99_ms']} ms")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
