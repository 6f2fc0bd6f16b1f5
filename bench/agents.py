"""Agent-shaped load on one worker host: R runs of 3 steps, each step one HTTP call to a local
OpenAI-compatible model stand-in that answers after 1 s (bench/model_standin.py), all started at
once. Ideal wall time: 3 s.

    .venv/bin/python -m bench.agents [--runs R] [--variant ai-step|tool] [--pool solo] [--json OUT]

PAL: the runs' steps are `ai-step` nodes on the `openai` provider (the SDK's async client; variant
`ai-step`) or an `async def` tool calling the stand-in with httpx (variant `tool`), on one `pal
worker` (`--pool`, `--concurrency`), started by `Client.start_run` from this process. The peers,
on the same stand-in and Postgres in the same run: bench/langgraph_agents.py.

Reported: the wall time from the first start to the last finish against the ideal, the time the
starts alone took, steps/s, the peak of Postgres connections of the worker and the starting
client together (pg_stat_activity, by application_name), the peak memory of the worker's process
tree and of this process (RSS), CPU per step by process group (bench/cpu.py), and whether every
step completed once and called the model once (the journal, the stand-in's count per
Idempotency-Key). Loopback only; the schema and keys are removed at the end.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import resource
import socket
import sys
import tempfile
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import sqlalchemy as sa

import bench.agent_tools  # noqa: F401  (registers bench_ask in this process, for validation)
from bench import cpu
from bench.throughput import Infra, bench_schema, cleanup_on_signals, log_tail, start_process, stop_process
from pal.client import Client

STEPS = 3
DELAY_S = 1.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class StandIn:
    """The model stand-in in a process of its own, on a free loopback port."""

    def __init__(self, folder: Path, delay: float = DELAY_S) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = start_process([sys.executable, "-m", "bench.model_standin", "--port", str(self.port),
                                      "--delay", str(delay)], {}, folder / f"standin-{self.port}.log")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                self.stats()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("the model stand-in did not start")

    def stats(self) -> dict[str, int]:
        with urllib.request.urlopen(f"{self.url}/stats", timeout=5) as answer:
            stats: dict[str, int] = json.loads(answer.read())
        return stats

    def stop(self) -> None:
        stop_process(self.process, timeout=5)


def graph(variant: str) -> dict[str, Any]:
    nodes: list[dict[str, Any]] = [{"id": "start", "type": "trigger"}]
    for i in range(STEPS):
        if variant == "tool":
            data: dict[str, Any] = {"tool": "bench_ask", "args": {"prompt": f"step {i}: {{{{ input.task }}}}",
                                                                  "key": f"{{{{ run.id }}}}-w{i}"}}
            nodes.append({"id": f"w{i}", "type": "tool", "data": data})
        else:
            nodes.append({"id": f"w{i}", "type": "ai-step", "data": {
                "provider": "openai", "model": "stand-in", "prompt": f"step {i}: {{{{ input.task }}}}"}})
    nodes.append({"id": "out", "type": "output", "data": {"value": "{{ nodes.w2.output.text }}"}})
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


def measure_pal(runs: int, variant: str, worker_args: list[str], workers: int, pool_size: int,
                starters: int) -> dict[str, Any]:
    infra = Infra()
    infra.check()
    with tempfile.TemporaryDirectory() as tmp, \
            bench_schema(infra, "agents", Path(tmp)) as (schema, settings, env):
        standin = StandIn(Path(tmp))
        name = f"palbench-agents-{uuid.uuid4().hex[:8]}"
        url = f"{settings.database_url}&application_name={name}"
        env = env | {"PAL_DATABASE_URL": url, "PAL_DB_POOL_SIZE": str(pool_size),
                     "PAL_TOOL_MODULES": "bench.agent_tools", "PAL_OPENAI_BASE_URL": f"{standin.url}/v1",
                     "OPENAI_API_KEY": "sk-bench", "BENCH_MODEL_URL": f"{standin.url}/v1"}
        logs = [Path(tmp) / f"worker{i}.log" for i in range(workers)]
        started_workers = [start_process([sys.executable, "-m", "pal.cli", "worker", *worker_args,
                                          "--loglevel", "WARNING", "--hostname", f"agents{i}@%h"], env, log)
                           for i, log in enumerate(logs)]
        # All the runs are in flight at once: a tenant's quota of runs in flight must admit them.
        client = Client(dataclasses.replace(settings, database_url=url,
                                            max_runs_in_flight=max(settings.max_runs_in_flight, 2 * runs)))
        admin = sa.create_engine("postgresql+psycopg2://postgres@127.0.0.1:5432/test",
                                 isolation_level="AUTOCOMMIT")
        try:
            warm = client.start_run(graph(variant), {"task": "warm-up"})  # imports, connections, the plan
            client.wait(warm, timeout=60)
            before = cpu.snapshot(*(w.pid for w in started_workers))
            began = time.monotonic()
            with ThreadPoolExecutor(starters) as pool:  # as a service's request threads would
                list(pool.map(lambda r: client.start_run(graph(variant), {"task": f"task {r}"}), range(runs)))
            started = time.monotonic() - began
            peak_connections, peak_rss, finished = 0, 0, False
            deadline = began + 60 + runs  # bounded
            while time.monotonic() < deadline:
                with admin.connect() as conn:
                    opened = conn.execute(sa.text("SELECT count(*) FROM pg_stat_activity "
                                                  "WHERE application_name = :n"), {"n": name}).scalar_one()
                    left = conn.execute(sa.text(f'SELECT count(*) FROM "{schema}".runs WHERE status NOT IN '
                                                "('succeeded', 'failed', 'cancelled')")).scalar_one()
                peak_connections = max(peak_connections, opened)
                peak_rss = max(peak_rss, sum(tree_rss(w.pid) for w in started_workers))
                if left == 0:
                    finished = True
                    break
                time.sleep(0.05)
            wall = time.monotonic() - began
            spent = cpu.ms_per_step(before, cpu.snapshot(*(w.pid for w in started_workers)), runs * STEPS)
            with admin.connect() as conn:
                done = dict(conn.execute(sa.text(f'SELECT kind, count(*) FROM "{schema}".journal_events '
                                                 "WHERE step_id LIKE 'w%' GROUP BY kind")).all())
                statuses = dict(conn.execute(sa.text(f'SELECT status, count(*) FROM "{schema}".runs '
                                                     "GROUP BY status")).all())
            calls = standin.stats()
            return {"peer": "pal", "variant": variant, "runs": runs, "worker": " ".join(worker_args),
                    "workers": workers,
                    "pool_size": pool_size, "starters": starters, "finished": finished, "statuses": statuses,
                    "wall_s": round(wall, 2), "ideal_s": STEPS * DELAY_S,
                    "wall_over_ideal": round(wall / (STEPS * DELAY_S), 2), "start_runs_s": round(started, 2),
                    "steps_per_s": round(runs * STEPS / wall, 1),
                    "peak_connections": peak_connections, "peak_worker_mb": round(peak_rss / 2**20),
                    "driver_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                    "cpu_ms_per_step": {k: round(v, 2) for k, v in spent.items()},
                    "steps_completed": done.get("step_completed", 0) - STEPS,  # less the warm-up's
                    "steps_expected": runs * STEPS,
                    "model_calls": calls["requests"] - STEPS, "repeated_keys": calls["repeated_keys"],
                    "most_calls_at_once": calls["most_in_flight"]}
        finally:
            client.close()
            admin.dispose()
            for worker in started_workers:
                stop_process(worker)
            standin.stop()
            for log in logs:
                if not log.exists() or "Error" in log.read_text(errors="replace"):
                    print(log_tail(log), file=sys.stderr)


def exactly_once(result: dict[str, Any]) -> bool:
    return bool(result["finished"] and result["steps_completed"] == result["steps_expected"]
                == result["model_calls"] and result["repeated_keys"] == 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--variant", choices=("ai-step", "tool"), default="ai-step")
    parser.add_argument("--worker-args", default="--pool solo", help="how `pal worker` runs")
    parser.add_argument("--workers", type=int, default=1, help="`pal worker` processes")
    parser.add_argument("--pool-size", type=int, default=20)
    parser.add_argument("--starters", type=int, default=8, help="threads of this process starting runs")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    with cleanup_on_signals():
        result = measure_pal(args.runs, args.variant, args.worker_args.split(), args.workers, args.pool_size,
                             args.starters)
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result))
    return 0 if exactly_once(result) else 1


if __name__ == "__main__":
    sys.exit(main())
