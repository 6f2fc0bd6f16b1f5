"""PAL throughput against raw Celery, measured in one run on the same broker and database.

    .venv/bin/python bench/throughput.py [--reps N] [--quick] [--no-anatomy]

Scenarios (steps/s = completed steps / wall time from the first publish to the last finish):
  linear       one graph: trigger -> N `noop` tool nodes -> output (one message per node)
  concurrent   K such graphs of M nodes started together
Peers, on the same Redis, the same worker concurrency (2 prefork processes) and the same Celery
delivery settings (bench/celery_floor.py):
  raw          a successor chain of no-op Celery tasks, each task sends the next
  floor        the same chain, each hop also journals two Postgres rows in two commits (a started
               row before the hop's work, a completed row after it): the floor of journaling
  floor1       the same two rows in one transaction, for reference (no engine can journal a start
               that way: the start must be on record before the work runs)

Everything talks to 127.0.0.1 only. Each PAL measurement gets a fresh Postgres schema, a fresh Redis
key prefix and queue and a fresh `pal worker`; everything is dropped or deleted at the end.
See docs/benchmarks.md for what the numbers mean.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import redis
import sqlalchemy as sa

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import celery  # noqa: E402

from bench import cpu  # noqa: E402
from pal.client import Client  # noqa: E402
from pal.config import Settings, load_settings  # noqa: E402
from pal.engine.runs import start_run  # noqa: E402
from pal.engine.runtime import Runtime  # noqa: E402
from pal.engine.steps import execute_step  # noqa: E402
from pal.storage.database import create_engine, normalize_url  # noqa: E402
from pal.storage.schema.migrate import upgrade  # noqa: E402
from pal.storage.sql.queries import Query  # noqa: E402

PG_URL = "postgresql://postgres@127.0.0.1:5432/test"
REDIS_URL = "redis://127.0.0.1:6379/0"
CONCURRENCY = 2
# What each peer kind commits per hop (bench/celery_floor.py); PAL is measured first in each rep.
COMMITS = {"raw": 0, "floor": 2, "floor1": 1}
# PAL is measured twice: `pal worker` as it starts by default (prefork, 2 processes; or
# BENCH_PAL_WORKER_ARGS), and as two solo workers, one per core, each running its steps inline
# (pal.workers.inline; docs/decisions/solo-worker-delivery.md).
SOLO_WORKERS = 2
KINDS = ("pal", "pal_solo", *COMMITS)
MEASURE_TIMEOUT = 240.0  # seconds one measurement may take before it is abandoned
READY_TIMEOUT = 90.0  # seconds a worker may take to start and finish its warm-up
POLL = 0.1
TOKEN = uuid.uuid4().hex[:8]
KEY_ROOT = f"palbench:{TOKEN}:"


# ------------------------------------------------------------------------------------ graphs


def linear_graph(length: int) -> dict[str, Any]:
    """trigger -> n0 .. n{length-1} (noop tools) -> output: length + 2 steps."""
    ids = ["start", *(f"n{i}" for i in range(length)), "out"]
    nodes: list[dict[str, Any]] = [{"id": "start", "type": "trigger"}]
    nodes += [{"id": f"n{i}", "type": "tool", "data": {"tool": "noop"}} for i in range(length)]
    nodes.append({"id": "out", "type": "output", "data": {"value": "done"}})
    edges = [{"source": a, "target": b} for a, b in itertools.pairwise(ids)]
    return {"nodes": nodes, "edges": edges}


# --------------------------------------------------------------------------------- processes


def start_process(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                start_new_session=True)


def stop_process(process: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    """SIGTERM (Celery's warm shutdown), then SIGKILL the process group after `timeout`."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
    # Pool children that outlived their parent (they share its session/group).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)


def log_tail(log: Path, lines: int = 30) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def base_env() -> dict[str, str]:
    # PAL_CELERY_FAST_PATHS passes through: the fast paths against their public ones is a comparison
    # this benchmark makes (docs/benchmarks.md, "Fast paths against public paths").
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PAL_", "BENCH_")) or k == "PAL_CELERY_FAST_PATHS"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(REPO)])
    return env


# ---------------------------------------------------------------------------- infrastructure


class Infra:
    """Admin connections, and the schemas and key prefixes to remove at the end."""

    def __init__(self) -> None:
        self.admin = sa.create_engine(normalize_url(PG_URL), isolation_level="AUTOCOMMIT")
        self.redis = redis.Redis.from_url(REDIS_URL)
        self.schemas: list[str] = []
        self.counter = 0

    def check(self) -> None:
        try:
            with self.admin.connect() as conn:
                conn.execute(sa.text("select 1"))
            self.redis.ping()
        except Exception as exc:
            sys.exit(f"bench needs Postgres at {PG_URL} and Redis at {REDIS_URL}: {exc}")

    def new_schema(self, label: str) -> tuple[str, str]:
        """A fresh schema and a URL whose search_path is that schema."""
        self.counter += 1
        schema = f"palbench_{TOKEN}_{self.counter}_{label}"
        with self.admin.connect() as conn:
            conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
        self.schemas.append(schema)
        return schema, f"{PG_URL}?options={quote(f'-csearch_path={schema}')}"

    def drop_schema(self, schema: str) -> None:
        with self.admin.connect() as conn:
            conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        if schema in self.schemas:
            self.schemas.remove(schema)

    def delete_keys(self, prefix: str) -> int:
        keys = list(self.redis.scan_iter(match=f"{prefix}*", count=1000))
        for start in range(0, len(keys), 500):
            self.redis.delete(*keys[start:start + 500])
        return len(keys)

    def close(self) -> None:
        for schema in list(self.schemas):
            with contextlib.suppress(Exception):
                self.drop_schema(schema)
        with contextlib.suppress(Exception):
            self.delete_keys(KEY_ROOT)
        self.admin.dispose()
        self.redis.close()

    def versions(self) -> dict[str, str]:
        with self.admin.connect() as conn:
            pg = conn.execute(sa.text("show server_version")).scalar()
            sync = conn.execute(sa.text("show synchronous_commit")).scalar()
        return {
            "python": platform.python_version(),
            "celery": celery.__version__,
            "sqlalchemy": sa.__version__,
            "postgres": f"{pg} (synchronous_commit={sync})",
            "redis": str(self.redis.info("server").get("redis_version")),
            "cpus": str(os.cpu_count()),
            "platform": platform.platform(),
        }


# ------------------------------------------------------------------------------ measurements


@dataclass
class Measurement:
    steps: int
    seconds: float
    cpu_ms: dict[str, float] = field(default_factory=dict)  # per step, by bench.cpu group

    @property
    def rate(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else float("nan")


@dataclass(frozen=True)
class Scenario:
    name: str
    graphs: int
    nodes: int  # tool nodes per PAL graph = hops per peer chain


def _wait_terminal(client: Client, run_ids: list[str], timeout: float) -> list[Any]:
    """Wait until every run is terminal, asking about one run per tick (the first unfinished
    one), as the peers' drivers make one call per tick: polling every run each tick cost the
    measured machine about 1 ms of driver and Postgres CPU per step of 20 concurrent graphs."""
    deadline = time.monotonic() + timeout
    finished: list[Any] = []
    while len(finished) < len(run_ids):
        run = client.get_run(run_ids[len(finished)])
        if run.terminal:
            finished.append(run)
            continue
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(run_ids) - len(finished)} of {len(run_ids)} PAL runs "
                               f"unfinished after {timeout:g}s")
        time.sleep(POLL)
    return finished


def pal_settings(url: str, home: Path, prefix: str, queue: str,
                 broker_env: dict[str, str] | None = None) -> tuple[Settings, dict[str, str]]:
    env = base_env()
    env.update(PAL_HOME=str(home), PAL_DATABASE_URL=url, PAL_BROKER_URL=REDIS_URL,
               PAL_BROKER_KEY_PREFIX=prefix, PAL_QUEUE=queue)
    env.update(broker_env or {})  # another broker (bench/brokers.py): its URL, options, TLS files
    return load_settings({k: v for k, v in env.items() if k.startswith("PAL_")}), env


@contextlib.contextmanager
def bench_schema(infra: Infra, label: str, tmp: Path, broker_env: dict[str, str] | None = None
                 ) -> Iterator[tuple[str, Settings, dict[str, str]]]:
    """A fresh migrated schema with its settings and worker environment (own key prefix and
    queue); the schema and the keys are removed on the way out."""
    schema, url = infra.new_schema(label)
    prefix = f"{KEY_ROOT}{schema}:"
    try:
        engine = create_engine(url)
        upgrade(engine)
        engine.dispose()
        home = tmp / schema
        home.mkdir()
        settings, env = pal_settings(url, home, prefix, f"palbench-{schema}", broker_env)
        yield schema, settings, env
    finally:
        infra.drop_schema(schema)
        infra.delete_keys(prefix)


def measure_pal(infra: Infra, scenario: Scenario, tmp: Path, extra_env: dict[str, str] | None = None,
                *, solo: bool = False, broker_env: dict[str, str] | None = None) -> Measurement:
    """One PAL measurement: fresh schema, prefix, queue and `pal worker` (with `extra_env` on top
    of its settings; `solo`: SOLO_WORKERS solo workers instead; `broker_env`: the client's and the
    workers' broker, else the local Redis); all removed after."""
    with bench_schema(infra, "pal", tmp, broker_env) as (schema, settings, env):
        log = tmp / schema / "worker.log"
        workers = start_pal_workers(env | (extra_env or {}), log, solo=solo)
        client = Client(settings)
        try:
            return _timed_runs(client, scenario, log.with_suffix(".0.log"), *(w.pid for w in workers))
        finally:
            client.runtime.journal.engine.dispose()
            client.close()
            for worker in workers:
                stop_process(worker)


def start_pal_workers(env: dict[str, str], log: Path, *, solo: bool) -> list[subprocess.Popen[bytes]]:
    """The measured `pal worker` processes, logging to `log` with .0, .1, ... suffixes: SOLO_WORKERS
    solo workers, or one prefork worker (BENCH_PAL_WORKER_ARGS and BENCH_PAL_WORKERS override)."""
    if solo:
        pool, count = ["--pool", "solo"], SOLO_WORKERS
    else:
        pool = os.environ.get("BENCH_PAL_WORKER_ARGS", f"--concurrency {CONCURRENCY}").split()
        count = int(os.environ.get("BENCH_PAL_WORKERS", "1"))
    return [start_process([sys.executable, "-m", "pal.cli", "worker", *pool, "--loglevel", "WARNING",
                           "--hostname", f"pal{i}@%h"], env, log.with_suffix(f".{i}.log"))
            for i in range(count)]


def _timed_runs(client: Client, scenario: Scenario, log: Path, *worker_pids: int) -> Measurement:
    # Warm-up: both pool processes import, connect and parse a graph before the clock starts.
    warm = [client.start_run(linear_graph(2)) for _ in range(4)]
    try:
        _wait_terminal(client, warm, READY_TIMEOUT)
    except TimeoutError:
        raise RuntimeError(f"pal worker not ready; log tail:\n{log_tail(log)}") from None
    graph = linear_graph(scenario.nodes)
    cpu_before = cpu.snapshot(*worker_pids)
    t0 = time.time()
    run_ids = [client.start_run(graph) for _ in range(scenario.graphs)]
    try:
        runs = _wait_terminal(client, run_ids, MEASURE_TIMEOUT)
    except TimeoutError as exc:
        raise RuntimeError(f"{exc}; worker log tail:\n{log_tail(log)}") from None
    cpu_after = cpu.snapshot(*worker_pids)
    bad = [r.status for r in runs if r.status != "succeeded"]
    if bad:
        raise RuntimeError(f"PAL runs ended {bad}; worker log tail:\n{log_tail(log)}")
    end = max(r.finished_at.timestamp() for r in runs)
    steps = sum(sum(1 for e in client.events(r) if e.kind == "step_completed") for r in run_ids)
    return Measurement(steps, end - t0, cpu.ms_per_step(cpu_before, cpu_after, steps))


class Floor:
    """The peer Celery worker (bench/celery_floor.py), started once for every peer measurement."""

    def __init__(self, infra: Infra, tmp: Path) -> None:
        self.infra = infra
        self.schema, _ = infra.new_schema("floor")
        self.prefix = f"{KEY_ROOT}floor:"
        self.queue = f"palbench-floor-{TOKEN}"
        with infra.admin.connect() as conn:
            conn.execute(sa.text(
                f'CREATE TABLE "{self.schema}".bench_hops (id bigserial PRIMARY KEY, '
                "chain text NOT NULL, hop integer NOT NULL, kind text NOT NULL, "
                "created_at timestamptz NOT NULL DEFAULT now())"))
        env = base_env()
        env.update(BENCH_BROKER_URL=REDIS_URL, BENCH_KEY_PREFIX=self.prefix, BENCH_QUEUE=self.queue,
                   BENCH_DATABASE_URL=PG_URL, BENCH_SCHEMA=self.schema,
                   # =pal: the floor on PAL's Redis transport (docs/decisions/celery-fast-paths.md)
                   BENCH_FLOOR_TRANSPORT=os.environ.get("BENCH_FLOOR_TRANSPORT", ""))
        self.log = tmp / "floor-worker.log"
        self.worker = start_process(
            [sys.executable, "-m", "celery", "-A", "bench.celery_floor", "worker",
             f"--concurrency={CONCURRENCY}", "--pool=prefork", "--loglevel=WARNING",
             f"--queues={self.queue}"], env, self.log)
        self.producer = celery.Celery("bench-driver", broker=REDIS_URL, set_as_current=False)
        self.producer.conf.update(
            broker_transport_options={"visibility_timeout": 3600, "global_keyprefix": self.prefix},
            task_serializer="json", task_send_sent_event=True)
        self.runs = 0

    def warm_up(self) -> None:
        try:
            for commits in COMMITS.values():
                self.measure(Scenario("warm-up", 4, 3), commits=commits, timeout=READY_TIMEOUT)
        except TimeoutError:
            raise RuntimeError(f"peer worker not ready; log tail:\n{log_tail(self.log)}") from None

    def measure(self, scenario: Scenario, *, commits: int, timeout: float = MEASURE_TIMEOUT
                ) -> Measurement:
        self.runs += 1
        tag = f"m{self.runs}"
        key = f"{self.prefix}done:{tag}"
        cpu_before = cpu.snapshot(self.worker.pid)
        t0 = time.time()
        for chain in range(scenario.graphs):
            self.producer.send_task("bench.hop", args=[tag, chain, 0, scenario.nodes, commits],
                                    queue=self.queue)
        deadline = time.monotonic() + timeout
        while self.infra.redis.hlen(key) < scenario.graphs:
            if time.monotonic() > deadline:
                raise TimeoutError(f"peer chains unfinished after {timeout:g}s; log tail:\n"
                                   f"{log_tail(self.log)}")
            time.sleep(POLL)
        cpu_after = cpu.snapshot(self.worker.pid)
        end = max(float(v) for v in self.infra.redis.hvals(key))
        self.infra.redis.delete(key)
        if commits:
            with self.infra.admin.connect() as conn:
                rows = conn.execute(sa.text(f'SELECT count(*) FROM "{self.schema}".bench_hops')).scalar()
                conn.execute(sa.text(f'TRUNCATE "{self.schema}".bench_hops'))
            if rows != 2 * scenario.graphs * scenario.nodes:
                raise RuntimeError(f"floor chain wrote {rows} rows, expected "
                                   f"{2 * scenario.graphs * scenario.nodes}")
        steps = scenario.graphs * scenario.nodes
        return Measurement(steps, end - t0, cpu.ms_per_step(cpu_before, cpu_after, steps))

    def close(self) -> None:
        stop_process(self.worker)
        self.producer.close()
        with contextlib.suppress(Exception):
            self.infra.drop_schema(self.schema)
        self.infra.delete_keys(self.prefix)


# -------------------------------------------------------------------------------- anatomy


@dataclass
class StepCost:
    statements: int = 0
    commits: int = 0
    rows: int = 0
    db_seconds: float = 0.0
    seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)


def anatomy(infra: Infra, length: int, tmp: Path) -> list[tuple[str, StepCost]]:
    """Run one linear graph in this process (no broker), counting what each step does.

    Every SQL statement and COMMIT is one Postgres round trip (a pooled connection is pinged only
    after 1 s idle, which a busy step loop never is), except a one-call statement (pal.storage.one_call):
    one round trip that is its own commit, counted as a statement and a commit (one row each).
    Publishing is recorded, not sent.
    """
    schema, url = infra.new_schema("anatomy")
    try:
        engine = create_engine(url)
        upgrade(engine)
        engine.dispose()
        settings, _ = pal_settings(url, tmp / "anatomy", f"{KEY_ROOT}anatomy:", "unused")
        queue: collections.deque[tuple[str, str, int]] = collections.deque()
        publishes = [0]

        def publish(run_id: str, step_id: str, generation: int, *, countdown: float = 0.0) -> None:
            publishes[0] += 1
            queue.append((run_id, step_id, generation))

        rt = Runtime(settings, publish)
        journal = rt.journal
        engine = journal.engine
        cost = StepCost()
        started: list[float] = []

        @sa.event.listens_for(engine, "before_cursor_execute")
        def _before(*_: Any) -> None:
            cost.statements += 1
            started.append(time.perf_counter())

        @sa.event.listens_for(engine, "after_cursor_execute")
        def _after(_conn: Any, cursor: Any, *__: Any) -> None:
            cost.db_seconds += time.perf_counter() - started.pop()
            cost.rows += max(cursor.rowcount, 0) if cursor.description is not None else 0

        @sa.event.listens_for(engine, "commit")
        def _commit(*_: Any) -> None:
            cost.commits += 1

        if journal.calls is not None:  # Postgres: each one-call statement is its own commit
            one_call = journal.calls.rows

            def counted_rows(call: Query, params: Any, meanwhile: Any = None) -> list[tuple[Any, ...]]:
                cost.statements += 1
                cost.commits += 1
                t = time.perf_counter()
                try:
                    rows = one_call(call, params, meanwhile)
                finally:
                    cost.db_seconds += time.perf_counter() - t
                cost.rows += len(rows)
                return rows

            journal.calls.rows = counted_rows  # type: ignore[method-assign]

        def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
            def wrapper(*args: Any, **kwargs: Any) -> Any:
                t = time.perf_counter()
                try:
                    return fn(*args, **kwargs)
                finally:
                    cost.phases[name] = cost.phases.get(name, 0.0) + time.perf_counter() - t
            return wrapper

        journal.steps.claim_step = timed("claim", journal.steps.claim_step)  # type: ignore[method-assign]
        journal.steps.complete_step = timed("complete", journal.steps.complete_step)  # type: ignore[method-assign]

        start_run(rt, linear_graph(length))
        per_step: list[tuple[str, StepCost]] = []
        for _ in range(length + 10):
            if not queue:
                break
            run_id, step_id, generation = queue.popleft()
            cost = StepCost()
            before = publishes[0]
            t = time.perf_counter()
            result = execute_step(rt, run_id, step_id, generation)
            cost.seconds = time.perf_counter() - t
            cost.phases["publishes"] = publishes[0] - before
            if result.outcome != "completed":
                raise RuntimeError(f"anatomy: step {step_id} ended {result.outcome}")
            per_step.append((step_id, cost))
        engine.dispose()
        return per_step
    finally:
        infra.drop_schema(schema)


def summarize_anatomy(per_step: list[tuple[str, StepCost]]) -> list[str]:
    def row(label: str, items: list[StepCost]) -> str:
        n = len(items)
        mean: Callable[[Callable[[StepCost], float]], float] = lambda f: sum(map(f, items)) / n  # noqa: E731
        return (f"  {label:<22} {mean(lambda c: c.statements):6.1f} {mean(lambda c: c.commits):5.1f} "
                f"{mean(lambda c: c.rows):7.1f} "
                f"{mean(lambda c: c.phases.get('publishes', 0)):4.1f} "
                f"{1000 * mean(lambda c: c.phases.get('claim', 0.0)):7.2f} "
                f"{1000 * mean(lambda c: c.phases.get('complete', 0.0)):8.2f} "
                f"{1000 * mean(lambda c: c.db_seconds):6.2f} {1000 * mean(lambda c: c.seconds):7.2f}")

    tools = [c for s, c in per_step if s.startswith("n")]
    k = min(20, max(1, len(tools) // 4))
    lines = [f"  {'steps':<22} {'stmts':>6} {'commit':>5} {'rows':>7} {'pub':>4} "
             f"{'claimms':>7} {'complms':>8} {'dbms':>6} {'stepms':>7}"]
    lines.append(row(f"first {k} tool steps", tools[:k]))
    lines.append(row(f"last {k} tool steps", tools[-k:]))
    lines.append(row(f"all {len(per_step)} steps", [c for _, c in per_step]))
    return lines


# ------------------------------------------------------------------------------------- main


def cpu_lines(table: list[dict[str, Any]]) -> list[str]:
    """CPU ms per step by process group, medians over the repetitions, for every scenario and kind."""
    lines = [f"CPU per step, ms (medians; {'  '.join(f'{g:>8}' for g in cpu.GROUPS)}     total)"]
    for row in table:
        for kind, samples in row["cpu_samples"].items():
            spent = cpu.medians(samples)
            if spent:
                lines.append(f"  {row['scenario']:<22} {kind:<6} "
                             + "  ".join(f"{spent[g]:8.2f}" for g in cpu.GROUPS)
                             + f"  {sum(spent.values()):8.2f}")
    return lines if len(lines) > 1 else []


def median_rate(samples: list[Measurement]) -> float:
    rates = [m.rate for m in samples]
    return statistics.median(rates) if rates else float("nan")


def fmt(value: float, spec: str) -> str:
    return "n/a" if value != value else format(value, spec)  # NaN check


@contextlib.contextmanager
def cleanup_on_signals() -> Iterator[None]:
    """Turn SIGTERM into KeyboardInterrupt so `finally` blocks stop workers and drop schemas."""
    def _raise(*_: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def bench_arguments(doc: str | None, quick: str, extra: Callable[[argparse.ArgumentParser], object] | None,
                    argv: list[str] | None) -> tuple[argparse.Namespace, int]:
    """The options every sized benchmark takes (--reps, --quick, --json, plus `extra`'s): the
    parsed arguments and the repetitions (default 3, 1 with --quick)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=None, help="repetitions per measurement (default 3)")
    parser.add_argument("--quick", action="store_true", help=f"1 rep, {quick} (a smoke test)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    if extra is not None:
        extra(parser)
    args = parser.parse_args(argv)
    reps: int = args.reps if args.reps is not None else (1 if args.quick else 3)
    if not 1 <= reps <= 20:
        parser.error("--reps must be between 1 and 20")
    return args, reps


def main(argv: list[str] | None = None) -> int:
    args, reps = bench_arguments(__doc__, "smaller graphs", lambda parser: parser.add_argument(
        "--no-anatomy", action="store_true", help="skip the in-process per-step count"), argv)
    if args.quick:
        scenarios = [Scenario("linear", 1, 60), Scenario("concurrent", 5, 40)]
    else:
        scenarios = [Scenario("linear", 1, 300), Scenario("concurrent", 20, 100)]

    infra = Infra()
    infra.check()
    versions = infra.versions()
    began = time.monotonic()
    results: dict[str, dict[str, list[Measurement]]] = {
        s.name: {kind: [] for kind in KINDS} for s in scenarios}
    anatomy_lines: list[str] = []
    with cleanup_on_signals(), tempfile.TemporaryDirectory(prefix="palbench-") as tmp_name:
        tmp = Path(tmp_name)
        floor: Floor | None = None
        try:
            floor = Floor(infra, tmp)
            floor.warm_up()
            for rep in range(1, reps + 1):
                for s in scenarios:
                    label = f"{s.name} ({s.graphs}x{s.nodes})"
                    for kind in KINDS:
                        if kind in ("pal", "pal_solo"):
                            m = measure_pal(infra, s, tmp, solo=kind == "pal_solo")
                        else:
                            m = floor.measure(s, commits=COMMITS[kind])
                        results[s.name][kind].append(m)
                        print(f"rep {rep}/{reps} {label:<22} {kind:<6} {m.steps:5d} steps "
                              f"{m.seconds:7.2f}s {m.rate:8.1f} steps/s", flush=True)
            floor.close()
            floor = None
            if not args.no_anatomy:
                length = scenarios[0].nodes
                anatomy_lines = summarize_anatomy(anatomy(infra, length, tmp))
        finally:
            if floor is not None:
                floor.close()
            infra.close()

    elapsed = time.monotonic() - began
    print()
    print("  ".join(f"{k}={v}" for k, v in versions.items()))
    print(f"worker concurrency {CONCURRENCY} (prefork), reps {reps}, medians; total {elapsed:.0f}s")
    header = (f"{'scenario':<22} {'PAL steps/s':>11} {'raw steps/s':>11} {'floor steps/s':>13} "
              f"{'floor1 steps/s':>14} {'PAL/raw':>8} {'PAL/floor':>9} {'PAL/floor1':>10}")
    print(header)
    print("-" * len(header))
    table: list[dict[str, Any]] = []
    for s in scenarios:
        pal, solo, raw, flo, flo1 = (median_rate(results[s.name][k]) for k in KINDS)
        label = f"{s.name} ({s.graphs}x{s.nodes})"
        print(f"{label:<22} {fmt(pal, '11.1f')} {fmt(raw, '11.1f')} {fmt(flo, '13.1f')} "
              f"{fmt(flo1, '14.1f')} {fmt(pal / raw, '8.2f')} {fmt(pal / flo, '9.2f')} "
              f"{fmt(pal / flo1, '10.2f')}")
        print(f"{'':<22} PAL, {SOLO_WORKERS} solo workers: {fmt(solo, '.1f')} steps/s, "
              f"{fmt(solo / flo, '.2f')}x the floor")
        table.append({"scenario": label, "pal": pal, "pal_solo": solo, "raw": raw, "floor": flo,
                      "floor1": flo1,
                      "samples": {k: [m.rate for m in v] for k, v in results[s.name].items()},
                      "cpu_samples": {k: [m.cpu_ms for m in v if m.cpu_ms]
                                      for k, v in results[s.name].items()}})
    print("paired per-rep ratios (same rep, minutes apart at most):")
    for s in scenarios:
        pairs = zip(*(results[s.name][k] for k in ("pal", "raw", "floor")), strict=True)
        ratios = [(p.rate / r.rate, p.rate / f.rate) for p, r, f in pairs]
        print(f"  {s.name:<12} PAL/raw " + " ".join(f"{a:.2f}" for a, _ in ratios)
              + "   PAL/floor " + " ".join(f"{b:.2f}" for _, b in ratios))
    print("\n".join(cpu_lines(table)))
    if anatomy_lines:
        print()
        print(f"per-step anatomy, in process, no broker (linear graph of {scenarios[0].nodes} tools):")
        print("\n".join(anatomy_lines))
    if args.json:
        args.json.write_text(json.dumps({"versions": versions, "reps": reps, "table": table,
                                         "anatomy": anatomy_lines}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
