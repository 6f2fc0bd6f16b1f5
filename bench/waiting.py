"""Steps that wait, on one worker host: R runs of 3 steps, each step waiting 1 s (a `bench_wait`
tool, as on a model call), all started at once on one `pal worker --pool threads`.

    .venv/bin/python -m bench.waiting [--runs R] [--threads C] [--pool-size N] [--json OUT]

Reports the wall time from the first start to the last finish against the ideal (3 s), the peak of
the worker's Postgres connections (pg_stat_activity, by the worker's application_name), the peak
memory of the worker's process tree (RSS), and whether every step ran exactly once (the journal).
Loopback only; the schema and keys are removed at the end. The agent-shaped scenario of `make bench`
(a model stand-in over HTTP, LangGraph and Restate beside) is still to come (issue 40).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import bench.waiting_tools  # noqa: F401  (registers bench_wait in this process, for validation)
from bench.throughput import Infra, bench_schema, cleanup_on_signals, log_tail, start_process, stop_process
from pal.client import Client

STEP_SECONDS = 1.0
STEPS = 3


def graph() -> dict[str, Any]:
    nodes: list[dict[str, Any]] = [{"id": "start", "type": "trigger"}]
    wait = {"tool": "bench_wait", "args": {"seconds": STEP_SECONDS}}
    nodes += [{"id": f"w{i}", "type": "tool", "data": wait} for i in range(STEPS)]
    nodes.append({"id": "out", "type": "output", "data": {"value": "{{ nodes.w2.output }}"}})
    ids = [n["id"] for n in nodes]
    return {"nodes": nodes, "edges": [{"source": a, "target": b} for a, b in itertools.pairwise(ids)]}


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its descendants."""
    total, todo = 0, [pid]
    while todo:
        current = todo.pop()
        try:
            with open(f"/proc/{current}/status") as status:
                total += next((int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS")), 0)
            with open(f"/proc/{current}/task/{current}/children") as children:
                todo += [int(c) for c in children.read().split()]
        except OSError:
            continue
    return total


def measure(runs: int, threads: int, pool_size: int) -> dict[str, Any]:
    infra = Infra()
    infra.check()
    with tempfile.TemporaryDirectory() as tmp, \
            bench_schema(infra, "waiting", Path(tmp)) as (schema, settings, env):
        name = f"palbench-waiting-{uuid.uuid4().hex[:8]}"
        env = env | {"PAL_DATABASE_URL": f"{settings.database_url}&application_name={name}",
                     "PAL_DB_POOL_SIZE": str(pool_size), "PAL_TOOL_MODULES": "bench.waiting_tools"}
        log = Path(tmp) / "worker.log"
        worker = start_process([sys.executable, "-m", "pal.cli", "worker", "--pool", "threads",
                                "--concurrency", str(threads), "--loglevel", "WARNING"], env, log)
        client = Client(settings)
        admin = sa.create_engine("postgresql+psycopg2://postgres@127.0.0.1:5432/test",
                                 isolation_level="AUTOCOMMIT")
        try:
            time.sleep(3)  # the worker's start-up (its threads, its broker connection)
            began = time.monotonic()
            for _ in range(runs):
                client.start_run(graph(), {})
            started = time.monotonic() - began
            peak_connections, peak_rss, finished = 0, 0, False
            deadline = began + 60 + runs  # bounded
            while time.monotonic() < deadline:
                with admin.connect() as conn:
                    opened = conn.execute(sa.text("SELECT count(*) FROM pg_stat_activity "
                                                  "WHERE application_name = :n"), {"n": name}).scalar_one()
                peak_connections = max(peak_connections, opened)
                peak_rss = max(peak_rss, tree_rss(worker.pid))
                with admin.connect() as conn:
                    left = conn.execute(sa.text(f'SELECT count(*) FROM "{schema}".runs WHERE status NOT IN '
                                                "('succeeded', 'failed', 'cancelled')")).scalar_one()
                if left == 0:
                    finished = True
                    break
                time.sleep(0.1)
            wall = time.monotonic() - began
            with admin.connect() as conn:
                done = dict(conn.execute(sa.text(f'SELECT kind, count(*) FROM "{schema}".journal_events '
                                                 "WHERE step_id LIKE 'w%' GROUP BY kind")).all())
                statuses = dict(conn.execute(sa.text(f'SELECT status, count(*) FROM "{schema}".runs '
                                                     "GROUP BY status")).all())
            return {"runs": runs, "threads": threads, "pool_size": pool_size, "finished": finished,
                    "statuses": statuses, "wall_s": round(wall, 2), "ideal_s": STEPS * STEP_SECONDS,
                    "wall_over_ideal": round(wall / (STEPS * STEP_SECONDS), 2),
                    "start_runs_s": round(started, 2),
                    "peak_connections": peak_connections, "peak_rss_mb": round(peak_rss / 2**20),
                    "steps_completed": done.get("step_completed", 0), "steps_expected": runs * STEPS,
                    "step_started": done.get("step_started", 0)}
        finally:
            client.close()
            admin.dispose()
            stop_process(worker)
            if not log.exists() or "Error" in log.read_text(errors="replace"):
                print(log_tail(log), file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--threads", type=int, default=512)
    parser.add_argument("--pool-size", type=int, default=20)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    with cleanup_on_signals():
        result = measure(args.runs, args.threads, args.pool_size)
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result))
    return 0 if result["finished"] and result["steps_completed"] == result["steps_expected"] else 1


if __name__ == "__main__":
    sys.exit(main())
