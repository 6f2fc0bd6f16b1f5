"""PAL at scale: the orphan sweep over a large journal, replay of a long run, worker memory.

    .venv/bin/python -m bench.scale [--quick | --reps N] [--json OUT] [--profile]

  sweep    A journal of 1,000,000 finished runs, 10,000 in-flight runs holding live leases and 20
           orphans (in-flight runs whose lease expired), all cloned with set-based SQL from template
           runs that PAL itself wrote: a 3-tool graph, finished (row and events cloned; the sweep
           never reads a finished run's events), or running with n0 started (row, events and
           lock row cloned). Timed: one `pal.engine.recovery.sweep` pass that re-drives the 20
           orphans (they are made orphans again before every pass), an idle pass, and the orphan
           query alone. The pass publishes with the worker's own Celery publisher to the real Redis,
           to a queue nobody consumes. Printed: the pass's SQL statements and EXPLAIN ANALYZE of the
           scans it runs once per pass. Beside that journal (12 million events): the hot path, one
           300-node linear run on 2 solo workers, paired with the same run in an empty schema.
  replay   A run of trigger -> 9,998 `noop` tools -> output (10,000 steps) whose journal holds every
           step but the last 5, and a step_started of the first of those (its worker died). Timed
           in this process, with a recording publisher: `pal.engine.recovery.redrive` from a fresh Runtime
           (cold caches, as in a sweeper that never saw the run), then the next step through
           `pal.engine.steps.execute_step`, once in the same Runtime and once in another fresh one.
  memory   VmRSS of a real `pal worker --pool solo` (the process that executes the steps) after it
           ran a 300-node linear graph of `noop` tools.
--quick: 50,000 finished / 1,000 in flight, a 1,000-step replay, 1 rep. --profile: cProfile a
sweep pass, a cold re-drive and the next step, and print their top functions.

Everything talks to 127.0.0.1 only. Each part gets its own `palbench_*` schema (and a Redis key
prefix and queue where a broker is used), removed at the end, also on failure and SIGTERM.
See docs/benchmarks.md.
"""

from __future__ import annotations

import contextlib
import cProfile
import io
import json
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg2.extensions
import psycopg2.extras
import sqlalchemy as sa

from bench.throughput import (
    Infra,
    bench_arguments,
    bench_schema,
    cleanup_on_signals,
    linear_graph,
    log_tail,
    start_pal_workers,
    start_process,
    stop_process,
)
from pal.client import Client
from pal.config import Settings
from pal.core.clock import utcnow
from pal.core.records import Fence
from pal.engine.recovery import SWEEP_BATCH, redrive, sweep
from pal.engine.runs import start_run
from pal.engine.runtime import Runtime
from pal.engine.steps import execute_step
from pal.storage.database import normalize_url
from pal.storage.journal import Journal
from pal.storage.recovery import RecoveryStore
from pal.storage.schema import journal_events, run_locks, runs

SWEEP_PASSES_PER_REP = 5  # a pass takes milliseconds: several samples per rep
QUERY_SAMPLES = 5  # orphan queries timed before each pass
LEFT = 5  # steps of the replayed run not yet completed when it is re-driven
RSS_NODES = 300
RUN_TIMEOUT = 240.0  # seconds the worker may take for one 300-node run
READY_TIMEOUT = 90.0  # seconds the worker may take to start and run its warm-up
Message = tuple[str, str, int]


@dataclass(frozen=True)
class Sizes:
    finished: int
    in_flight: int  # in-flight runs with a live lease
    orphans: int  # in-flight runs with an expired lease
    replay_steps: int  # steps of the replayed run, trigger and output included


FULL = Sizes(finished=1_000_000, in_flight=10_000, orphans=SWEEP_BATCH, replay_steps=10_000)
QUICK = Sizes(finished=50_000, in_flight=1_000, orphans=SWEEP_BATCH, replay_steps=1_000)


def say(message: str) -> None:
    print(f"[scale] {message}", file=sys.stderr, flush=True)


def ms(seconds: float) -> float:
    return 1000 * seconds


class Outbox:
    """A publisher that records messages instead of sending them."""

    def __init__(self) -> None:
        self.sent: list[Message] = []

    def __call__(self, run_id: str, step_id: str, generation: int, *, countdown: float = 0.0) -> None:
        self.sent.append((run_id, step_id, generation))


# ---------------------------------------------------------------------------- schema, SQL


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Let SIGTERM (KeyboardInterrupt) cancel a long statement server-side instead of waiting it out."""
    psycopg2.extensions.set_wait_callback(psycopg2.extras.wait_select)
    try:
        yield
    finally:
        psycopg2.extensions.set_wait_callback(None)


def clone_sql(table: sa.Table, overrides: dict[str, str], source: str) -> str:
    """INSERT ... SELECT copying one template row of `table` (alias t) once per i, with overrides."""
    names = [c.name for c in table.c if c.name != "seq"]
    values = [overrides.get(n, f"t.{n}") for n in names]
    return (f"INSERT INTO {table.name} ({', '.join(names)}) SELECT {', '.join(values)} "
            f"FROM {source}")


def run_template(rt: Runtime, outbox: Outbox, graph: dict[str, Any], steps: int | None) -> str:
    """A run written by PAL itself: `steps` steps executed (None: to the end)."""
    record, _ = start_run(rt, graph, {})
    done = 0
    while outbox.sent and (steps is None or done < steps):
        run_id, step_id, generation = outbox.sent.pop(0)
        result = execute_step(rt, run_id, step_id, generation)
        if result.outcome != "completed":
            raise RuntimeError(f"template run: step {step_id} ended {result.outcome}")
        done += 1
    outbox.sent.clear()
    return record.id


def pal_revision() -> str:
    """The commit measured, flagged when src/ has uncommitted changes (they are measured too)."""
    repo = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)
        return done.stdout.strip() if done.returncode == 0 else ""

    commit = git("rev-parse", "--short", "HEAD")
    if not commit:
        return "unknown (not a git checkout)"
    return commit + (" + uncommitted changes in src/" if git("status", "--porcelain", "--", "src") else "")


def profiled(label: str, fn: Callable[..., Any], *args: Any, top: int = 14, **kwargs: Any
             ) -> tuple[Any, list[str]]:
    """Call `fn` under cProfile: its result, and its top functions by own and by cumulative time."""
    profile = cProfile.Profile()
    result = profile.runcall(fn, *args, **kwargs)
    lines = []
    for order in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(profile, stream=out).strip_dirs().sort_stats(order).print_stats(top)
        body = [ln for ln in out.getvalue().splitlines() if ln.strip()]
        lines += [f"--- {label}, by {order}", *body[-(top + 1):]]
    return result, lines


def rss_kb(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM (peak) of a process, in kB, from /proc/<pid>/status."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0])
    return found


# ----------------------------------------------------------------------------------- sweep


@dataclass
class SweepResult:
    pass_s: list[float] = field(default_factory=list)
    idle_s: list[float] = field(default_factory=list)
    query_s: list[float] = field(default_factory=list)
    plans: dict[str, list[str]] = field(default_factory=dict)
    statements: list[str] = field(default_factory=list)
    fill_s: float = 0.0
    profile: list[str] = field(default_factory=list)
    journal_events: int = 0
    hot_big: list[float] = field(default_factory=list)  # steps/s of a linear run beside the big journal
    hot_empty: list[float] = field(default_factory=list)  # ... and in an empty schema, paired


def fill_journal(engine: sa.Engine, rt: Runtime, outbox: Outbox, sizes: Sizes) -> None:
    """Clone a finished and a crashed in-flight template run (both written by PAL) into the journal."""
    graph = linear_graph(3)
    done_id = run_template(rt, outbox, graph, None)
    live_id = run_template(rt, outbox, graph, 1)  # the trigger completed ...
    # ... and n0 started: its worker died
    rt.journal.steps.claim_step(Fence(live_id, 1, "bench-dead", utcnow(), 30.0), "n0")
    every = "INTERVAL '2 seconds' * i"  # finished runs spread over the past
    finished = clone_sql(runs, {
        "id": "'run_' || md5('finished-' || i)",
        "status": "CASE WHEN i % 100 < 95 THEN t.status WHEN i % 100 < 99 THEN 'failed' ELSE 'cancelled' END",
        "output": "CASE WHEN i % 100 < 95 THEN t.output END",
        "error": "CASE WHEN i % 100 >= 95 THEN '{\"code\": \"step_failed\"}'::jsonb END",
        "created_at": f"t.created_at - {every}", "started_at": f"t.started_at - {every}",
        "finished_at": f"t.finished_at - {every}"},
        "runs t CROSS JOIN generate_series(1, :n) AS i WHERE t.id = :template")
    # ... and each its template's journal (about 12 events): the 1,000,000 runs' 12 million events
    # are the table the hot path and the sweep must stay flat beside (docs/benchmarks.md).
    finished_events = clone_sql(journal_events, {
        "run_id": "'run_' || md5('finished-' || i)", "created_at": f"t.created_at - {every}"},
        "journal_events t CROSS JOIN generate_series(1, :n) AS i WHERE t.run_id = :template "
        "ORDER BY i, t.seq")
    with interruptible(), engine.begin() as conn:
        conn.execute(sa.text(finished), {"n": sizes.finished, "template": done_id})
        # A bulk load: no journal NOTIFY per row (nobody listens) and no per-row FK check (the
        # runs were inserted just above); both are triggers, off for this transaction only.
        conn.execute(sa.text("SET LOCAL session_replication_role = replica"))
        conn.execute(sa.text(finished_events), {"n": sizes.finished, "template": done_id})
        conn.execute(sa.text("SET LOCAL session_replication_role = DEFAULT"))
        for tag, n, expires in (("live", sizes.in_flight, "now() + INTERVAL '1 hour'"),
                                ("dead", sizes.orphans, "now() - INTERVAL '1 minute'")):
            new_id = f"'run_' || md5('{tag}-' || i)"
            series = "CROSS JOIN generate_series(1, :n) AS i WHERE t.run_id = :template"
            conn.execute(sa.text(clone_sql(runs, {"id": new_id},
                                           "runs t CROSS JOIN generate_series(1, :n) AS i "
                                           "WHERE t.id = :template")), {"n": n, "template": live_id})
            conn.execute(sa.text(clone_sql(journal_events, {"run_id": new_id},
                                           f"journal_events t {series} ORDER BY i, t.seq")),
                         {"n": n, "template": live_id})
            conn.execute(sa.text(clone_sql(run_locks, {"run_id": new_id, "worker_id": f"'bench-{tag}'",
                                                       "expires_at": expires}, f"run_locks t {series}")),
                         {"n": n, "template": live_id})
        conn.execute(sa.text("DELETE FROM runs WHERE id IN (:a, :b)"), {"a": done_id, "b": live_id})
    with interruptible(), engine.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        for table in ("runs", "run_locks", "journal_events"):
            conn.exec_driver_sql(f"VACUUM ANALYZE {table}")
        # Written out now, so that the checkpointer flushing the fill's pages is not part of the
        # first hot-path measurement that follows.
        conn.exec_driver_sql("CHECKPOINT")


def make_orphans(engine: sa.Engine) -> None:
    """Expire the leases of the orphans again (a pass gave them a fresh 10-minute lease)."""
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE run_locks SET expires_at = now() - INTERVAL '1 minute' "
                             "WHERE worker_id <> 'bench-live'"))


def explain(engine: sa.Engine, query: str, params: dict[str, Any]) -> list[str]:
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(f"EXPLAIN (ANALYZE, BUFFERS) {query}", params).scalars().all()
    return [str(r) for r in rows]


class StatementLog:
    """Every SQL statement an engine runs while active: text, parameters, seconds."""

    def __init__(self, engine: sa.Engine) -> None:
        self.engine = engine
        self.entries: list[tuple[str, Any, float]] = []
        self._started: list[float] = []

    def _before(self, *_: Any) -> None:
        self._started.append(time.perf_counter())

    def _after(self, _conn: Any, _cursor: Any, statement: str, parameters: Any, *__: Any) -> None:
        self.entries.append((statement, parameters, time.perf_counter() - self._started.pop()))

    def __enter__(self) -> StatementLog:
        sa.event.listen(self.engine, "before_cursor_execute", self._before)
        sa.event.listen(self.engine, "after_cursor_execute", self._after)
        return self

    def __exit__(self, *_: Any) -> None:
        sa.event.remove(self.engine, "before_cursor_execute", self._before)
        sa.event.remove(self.engine, "after_cursor_execute", self._after)

    def summary(self, top: int = 6) -> list[str]:
        groups: dict[str, list[float]] = {}
        for statement, _, seconds in self.entries:
            groups.setdefault(" ".join(statement.split())[:96], []).append(seconds)
        ranked = sorted(groups.items(), key=lambda kv: -sum(kv[1]))[:top]
        return [f"{len(v):4d}x {ms(sum(v)):7.2f} ms  {k}" for k, v in ranked]


def timed_sweep(rt: Runtime, expect: int) -> float:
    t = time.perf_counter()
    report = sweep(rt)
    elapsed = time.perf_counter() - t
    if report.found != expect or len(report.recovered) != expect:
        raise RuntimeError(f"sweep pass found {report.found} and re-drove {len(report.recovered)} "
                           f"runs, expected {expect}")
    return elapsed


def query_times(journal: Journal, samples: int, expect: int) -> list[float]:
    """The orphan query alone: execute and fetch on a checked-out connection (no ping, no commit)."""
    times = []
    with journal.engine.connect() as conn:
        for _ in range(samples):
            query = RecoveryStore.orphan_query(now=utcnow(), limit=SWEEP_BATCH)
            t = time.perf_counter()
            found = conn.execute(query).scalars().all()
            times.append(time.perf_counter() - t)
    if len(found) != expect:
        raise RuntimeError(f"orphan query found {len(found)} runs, expected {expect}")
    return times


def pass_plans(rt: Runtime, engine: sa.Engine, orphans: int) -> tuple[dict[str, list[str]], list[str]]:
    """One logged pass: where its SQL time goes, and EXPLAIN ANALYZE of each scan it runs once
    (the orphan query, and whichever other sweep-wide queries the pass makes)."""
    make_orphans(engine)
    with StatementLog(rt.journal.engine) as log:
        total = timed_sweep(rt, orphans)
    in_db = sum(s for _, _, s in log.entries)
    lines = [f"pass {ms(total):.1f} ms with the statement log on; {len(log.entries)} statements, "
             f"{ms(in_db):.1f} ms in cursor.execute", *log.summary(top=8)]
    query = RecoveryStore.orphan_query(now=utcnow(), limit=SWEEP_BATCH)
    compiled = query.compile(dialect=rt.journal.engine.dialect, compile_kwargs={"render_postcompile": True})
    make_orphans(engine)
    plans = {"orphan query (Journal.orphan_query)": explain(engine, str(compiled), dict(compiled.params))}
    texts = [" ".join(statement.split()) for statement, _, _ in log.entries]
    for (statement, params, _), text in zip(log.entries, texts, strict=True):
        once = texts.count(text) == 1 and text.upper().startswith("SELECT")
        if once and text != " ".join(str(compiled).split()):
            plans[text[:100]] = explain(engine, statement, params)
    return plans, lines


def measure_sweep(infra: Infra, sizes: Sizes, reps: int, tmp: Path, profile: bool) -> SweepResult:
    result = SweepResult()
    with bench_schema(infra, "sweep", tmp) as (_, settings, env):
        engine = sa.create_engine(normalize_url(settings.database_url))
        client = Client(settings)  # the worker's own publish: Redis, a queue nobody consumes
        try:
            say(f"sweep: filling {sizes.finished:,} finished + {sizes.in_flight:,} in-flight runs "
                f"+ {sizes.orphans} orphans")
            t = time.perf_counter()
            outbox = Outbox()
            fill_journal(engine, Runtime(settings, outbox), outbox, sizes)
            result.fill_s = time.perf_counter() - t
            with engine.connect() as conn:
                count = conn.execute(sa.text("SELECT count(*) FROM journal_events")).scalar_one()
            result.journal_events = int(count)
            say(f"sweep: filled and vacuumed in {result.fill_s:.1f}s; {count:,} journal events")
            for rep in range(reps):  # the hot path beside the big journal, paired with an empty one
                with bench_schema(infra, "empty", tmp) as (_, empty_settings, empty_env):
                    empty = Client(empty_settings)
                    try:
                        # Alternating which goes first: a pair's first measurement is not always
                        # the one that follows the fill (or the other's leftovers).
                        sides = [(result.hot_big, client, env), (result.hot_empty, empty, empty_env)]
                        for rates, side, side_env in sides if rep % 2 == 0 else sides[::-1]:
                            rates.append(hot_path_rate(side, side_env, tmp))
                    finally:
                        empty.close()
                say(f"hot path: {result.hot_big[-1]:.1f} steps/s beside {result.journal_events:,} events, "
                    f"{result.hot_empty[-1]:.1f} in an empty schema")
            rt = client.runtime
            make_orphans(engine)
            timed_sweep(rt, sizes.orphans)  # warm-up: connections, broker, plan cache
            result.plans, result.statements = pass_plans(rt, engine, sizes.orphans)
            if profile:
                make_orphans(engine)
                _, result.profile = profiled("sweep pass", timed_sweep, rt, sizes.orphans)
            for i in range(reps * SWEEP_PASSES_PER_REP):
                make_orphans(engine)
                result.query_s += query_times(rt.journal, QUERY_SAMPLES, sizes.orphans)
                result.pass_s.append(timed_sweep(rt, sizes.orphans))
                result.idle_s.append(timed_sweep(rt, 0))
                say(f"sweep pass {i + 1}: {ms(result.pass_s[-1]):.1f} ms with {sizes.orphans} orphans, "
                    f"{ms(result.idle_s[-1]):.1f} ms idle")
        finally:
            client.close()
            engine.dispose()
    return result


def hot_path_rate(client: Client, env: dict[str, str], tmp: Path) -> float:
    """Steps/s of one 300-node linear run on real `pal worker` processes of this schema (SOLO_WORKERS
    solo workers, the recommended deployment and the quieter measure), from its journal: run
    created to run finished, so the driver's polling adds nothing to the figure."""
    log = tmp / f"hot-{time.monotonic_ns()}.log"
    workers = start_pal_workers(env, log, solo=True)
    first_log = log.with_suffix(".0.log")  # the first worker's, whose tail a failure shows
    try:
        # Its own tenant: the cloned in-flight runs fill the default tenant's PAL_MAX_RUNS_IN_FLIGHT.
        run_to_end(client, linear_graph(2), READY_TIMEOUT, first_log, tenant_id="bench-hot")
        run_id = run_to_end(client, linear_graph(RSS_NODES), RUN_TIMEOUT, first_log, tenant_id="bench-hot")
        run = client.get_run(run_id)
        steps = sum(1 for e in client.events(run_id) if e.kind == "step_completed")
        return steps / (run.finished_at - run.created_at).total_seconds()
    finally:
        for worker in workers:
            stop_process(worker)


# ---------------------------------------------------------------------------------- replay


@dataclass
class ReplayResult:
    redrive_s: list[float] = field(default_factory=list)
    next_s: list[float] = field(default_factory=list)
    next_cold_s: list[float] = field(default_factory=list)
    build_s: float = 0.0
    profile: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class LongRun:
    run_id: str
    next_step: str  # the step a re-drive resumes
    mark: int  # the journal's last seq before any re-drive


def build_long_run(engine: sa.Engine, rt: Runtime, outbox: Outbox, steps: int) -> LongRun:
    """The trigger and n0 run through PAL; n1 .. are clones of n0's two events; then one more
    step_started (its worker died) and an expired lease."""
    run_id = run_template(rt, outbox, linear_graph(steps - 2), 2)
    last = steps - LEFT - 1  # clones complete n1 .. n{last-1}; n{last} only starts
    crashed = f"n{last}"
    source = ("journal_events t CROSS JOIN generate_series(1, :last) AS i "
              "WHERE t.run_id = :run AND t.step_id = 'n0' {}")
    step = "'n' || i"
    at = "t.created_at + INTERVAL '1 microsecond' * i"
    with interruptible(), engine.begin() as conn:
        conn.execute(sa.text(clone_sql(journal_events, {"step_id": step, "created_at": at},
                                       source.format("AND i < :last ORDER BY i, t.seq"))),
                     {"run": run_id, "last": last})
        conn.execute(sa.text(clone_sql(journal_events, {"step_id": step, "created_at": at},
                                       source.format("AND i = :last AND t.kind = 'step_started'"))),
                     {"run": run_id, "last": last})
        conn.execute(sa.text("UPDATE run_locks SET expires_at = now() - INTERVAL '1 minute' "
                             "WHERE run_id = :run"), {"run": run_id})
        completed = conn.execute(sa.text("SELECT count(*) FROM journal_events WHERE run_id = :run "
                                         "AND kind = 'step_completed'"), {"run": run_id}).scalar()
        mark = conn.execute(sa.text("SELECT max(seq) FROM journal_events WHERE run_id = :run"),
                            {"run": run_id}).scalar()
    if completed != steps - LEFT:
        raise RuntimeError(f"replay run holds {completed} completed steps, expected {steps - LEFT}")
    with engine.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql("VACUUM ANALYZE journal_events")
    return LongRun(run_id, crashed, int(mark or 0))


def reset(engine: sa.Engine, run: LongRun) -> None:
    """Back to the state before the re-drive: its events gone, generation 1, lease expired."""
    with engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM journal_events WHERE run_id = :run AND seq > :mark"),
                     {"run": run.run_id, "mark": run.mark})
        conn.execute(sa.text("UPDATE run_locks SET generation = 1, worker_id = 'bench-dead', "
                             "expires_at = now() - INTERVAL '1 minute' WHERE run_id = :run"),
                     {"run": run.run_id})


def replay_once(settings: Settings, run: LongRun, *, cold_next: bool) -> tuple[float, float]:
    """Re-drive from a fresh Runtime, then the next step (in the same Runtime, or a fresh one)."""
    rt = Runtime(settings, Outbox())
    t = time.perf_counter()
    recovery = redrive(rt, run.run_id, require_expired=False)
    redrive_s = time.perf_counter() - t
    if recovery is None or recovery.resumed_steps != (run.next_step,):
        raise RuntimeError(f"re-drive resumed {recovery and recovery.resumed_steps}, "
                           f"expected ({run.next_step!r},)")
    if cold_next:
        rt = Runtime(settings, Outbox())
    t = time.perf_counter()
    result = execute_step(rt, run.run_id, run.next_step, recovery.generation)
    next_s = time.perf_counter() - t
    if result.outcome != "completed" or len(result.dispatched) != 1:
        raise RuntimeError(f"next step {run.next_step} ended {result.outcome}, dispatched "
                           f"{result.dispatched}")
    return redrive_s, next_s


def profile_replay(settings: Settings, run: LongRun) -> list[str]:
    """cProfile of one re-drive from a fresh Runtime and of the next step in the same Runtime."""
    rt = Runtime(settings, Outbox())
    recovery, lines = profiled("re-drive", redrive, rt, run.run_id, require_expired=False)
    if recovery is None:
        raise RuntimeError("profiled re-drive did nothing")
    _, more = profiled("next step", execute_step, rt, run.run_id, run.next_step, recovery.generation)
    return lines + more


def measure_replay(infra: Infra, sizes: Sizes, reps: int, tmp: Path, profile: bool) -> ReplayResult:
    result = ReplayResult()
    with bench_schema(infra, "replay", tmp) as (_, settings, _env):
        settings = settings.with_(max_graph_bytes=max(settings.max_graph_bytes, 200 * sizes.replay_steps))
        engine = sa.create_engine(normalize_url(settings.database_url))
        try:
            say(f"replay: building a {sizes.replay_steps:,}-step run")
            t = time.perf_counter()
            outbox = Outbox()
            run = build_long_run(engine, Runtime(settings, outbox), outbox, sizes.replay_steps)
            result.build_s = time.perf_counter() - t
            say(f"replay: built in {result.build_s:.1f}s; the re-drive resumes {run.next_step}")
            for i in range(reps):
                redrive_s, next_s = replay_once(settings, run, cold_next=False)
                reset(engine, run)
                _, cold_s = replay_once(settings, run, cold_next=True)
                reset(engine, run)
                result.redrive_s.append(redrive_s)
                result.next_s.append(next_s)
                result.next_cold_s.append(cold_s)
                say(f"replay rep {i + 1}: re-drive {ms(redrive_s):.1f} ms, next step {ms(next_s):.1f} ms "
                    f"(fresh process: {ms(cold_s):.1f} ms)")
            if profile:
                result.profile = profile_replay(settings, run)
                reset(engine, run)
        finally:
            engine.dispose()
    return result


# ---------------------------------------------------------------------------------- memory


@dataclass
class RssResult:
    baseline_kb: int = 0
    after_kb: list[int] = field(default_factory=list)
    peak_kb: int = 0


def executing_pid(client: Client, run_id: str) -> int:
    """The pid of the process that ran the run's steps, from its step_started events."""
    workers = {e.payload.get("worker") for e in client.events(run_id) if e.kind == "step_started"}
    pids = {int(str(w).rsplit(":", 1)[1]) for w in workers}
    if len(pids) != 1:
        raise RuntimeError(f"run {run_id} ran in processes {pids}, expected one")
    return pids.pop()


def run_to_end(client: Client, graph: dict[str, Any], timeout: float, log: Path,
               tenant_id: str | None = None) -> str:
    run_id = client.start_run(graph, tenant_id=tenant_id)
    try:
        run = client.wait(run_id, timeout=timeout)
    except Exception as exc:
        raise RuntimeError(f"{exc}; worker log tail:\n{log_tail(log)}") from None
    if run.status != "succeeded":
        raise RuntimeError(f"run ended {run.status}; worker log tail:\n{log_tail(log)}")
    return run_id


def measure_rss(infra: Infra, reps: int, tmp: Path) -> RssResult:
    result = RssResult()
    with bench_schema(infra, "rss", tmp) as (schema, settings, env):
        log = tmp / schema / "worker.log"
        worker = start_process([sys.executable, "-m", "pal.cli", "worker", "--pool", "solo",
                                "--loglevel", "WARNING"], env, log)
        client = Client(settings)
        try:
            warm = run_to_end(client, linear_graph(2), READY_TIMEOUT, log)
            if executing_pid(client, warm) != worker.pid:
                raise RuntimeError(f"steps ran in pid {executing_pid(client, warm)}, not {worker.pid}")
            result.baseline_kb = rss_kb(worker.pid)["VmRSS"]
            say(f"memory: solo worker pid {worker.pid}, {result.baseline_kb / 1024:.1f} MB after warm-up")
            for i in range(reps):
                run_id = run_to_end(client, linear_graph(RSS_NODES), RUN_TIMEOUT, log)
                if executing_pid(client, run_id) != worker.pid:
                    raise RuntimeError("a step ran outside the measured worker process")
                usage = rss_kb(worker.pid)
                result.after_kb.append(usage["VmRSS"])
                result.peak_kb = usage["VmHWM"]
                say(f"memory: after {RSS_NODES}-node run {i + 1}: VmRSS {usage['VmRSS'] / 1024:.1f} MB, "
                    f"VmHWM {usage['VmHWM'] / 1024:.1f} MB")
        finally:
            client.close()
            stop_process(worker)
    return result


# ------------------------------------------------------------------------------------ main


def median_ms(samples: list[float]) -> float:
    return ms(statistics.median(samples))


def results_json(sizes: Sizes, reps: int, sweep_r: SweepResult, replay: ReplayResult, rss: RssResult,
                 elapsed: float, versions: dict[str, str]) -> dict[str, Any]:
    return {
        "sweep_pass_ms": median_ms(sweep_r.pass_s), "sweep_idle_pass_ms": median_ms(sweep_r.idle_s),
        "sweep_query_ms": median_ms(sweep_r.query_s), "finished_runs": sizes.finished,
        "journal_events": sweep_r.journal_events,
        "hot_path_big_steps_per_s": statistics.median(sweep_r.hot_big),
        "hot_path_empty_steps_per_s": statistics.median(sweep_r.hot_empty),
        "hot_path_big_over_empty": statistics.median(b / e for b, e in zip(sweep_r.hot_big, sweep_r.hot_empty,
                                                                           strict=True)),
        "in_flight_runs": sizes.in_flight, "orphans": sizes.orphans,
        "sweep_plans": sweep_r.plans, "sweep_statements": sweep_r.statements,
        "replay_redrive_ms": median_ms(replay.redrive_s), "replay_steps": sizes.replay_steps,
        "replay_steps_left": LEFT, "replay_next_step_ms": median_ms(replay.next_s),
        "replay_next_step_fresh_process_ms": median_ms(replay.next_cold_s),
        "worker_rss_mb": rss.after_kb[-1] / 1024, "worker_rss_baseline_mb": rss.baseline_kb / 1024,
        "worker_rss_peak_mb": rss.peak_kb / 1024,
        "samples_ms": {"sweep_pass": [ms(s) for s in sweep_r.pass_s],
                       "sweep_idle_pass": [ms(s) for s in sweep_r.idle_s],
                       "sweep_query": [ms(s) for s in sweep_r.query_s],
                       "replay_redrive": [ms(s) for s in replay.redrive_s],
                       "replay_next_step": [ms(s) for s in replay.next_s],
                       "replay_next_step_fresh_process": [ms(s) for s in replay.next_cold_s]},
        "worker_rss_after_each_run_mb": [kb / 1024 for kb in rss.after_kb],
        "setup_s": {"sweep_fill": sweep_r.fill_s, "replay_build": replay.build_s},
        "reps": reps, "elapsed_s": elapsed, "versions": versions,
        "profile": {"sweep_pass": sweep_r.profile, "replay": replay.profile},
    }


def print_table(r: dict[str, Any]) -> None:
    rows = [
        (f"sweep pass, {r['finished_runs']:,} finished + {r['in_flight_runs']:,} in flight, "
         f"{r['orphans']} orphans re-driven", f"{r['sweep_pass_ms']:.1f} ms", "< 50 ms"),
        ("sweep pass with no orphan", f"{r['sweep_idle_pass_ms']:.1f} ms", ""),
        (f"hot path: a 300-node linear run beside {r['journal_events']:,} journal events "
         f"(an empty schema: {r['hot_path_empty_steps_per_s']:.1f})",
         f"{r['hot_path_big_steps_per_s']:.1f} steps/s",
         f"{r['hot_path_big_over_empty']:.2f}x paired"),
        ("orphan query alone", f"{r['sweep_query_ms']:.2f} ms", ""),
        (f"replay (re-drive) of a {r['replay_steps']:,}-step run, fresh Runtime",
         f"{r['replay_redrive_ms']:.1f} ms", "< 1000 ms"),
        ("next step after that replay, same Runtime", f"{r['replay_next_step_ms']:.1f} ms", ""),
        ("next step after that replay, fresh Runtime",
         f"{r['replay_next_step_fresh_process_ms']:.1f} ms", ""),
        (f"worker RSS after a {RSS_NODES}-node run (solo; warm-up {r['worker_rss_baseline_mb']:.1f} MB, "
         f"peak {r['worker_rss_peak_mb']:.1f} MB)", f"{r['worker_rss_mb']:.1f} MB", "< 150 MB"),
    ]
    width = max(len(label) for label, _, _ in rows)
    print("  ".join(f"{k}={v}" for k, v in r["versions"].items()))
    print(f"reps {r['reps']} (sweep: {SWEEP_PASSES_PER_REP} passes per rep), medians; "
          f"total {r['elapsed_s']:.0f}s (setup: fill {r['setup_s']['sweep_fill']:.0f}s, "
          f"replay build {r['setup_s']['replay_build']:.0f}s)")
    for label, value, target in rows:
        print(f"{label:<{width}}  {value:>10}  {target}")
    print("\nSQL of one sweep pass (statement log on):")
    print("\n".join(f"  {line}" for line in r["sweep_statements"]))
    for name, plan in r["sweep_plans"].items():
        print(f"\nEXPLAIN (ANALYZE, BUFFERS) {name}:")
        print("\n".join(f"  {line}" for line in plan))
    for name, lines in r["profile"].items():
        if lines:
            print(f"\ncProfile of the {name.replace('_', ' ')}:")
            print("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    args, reps = bench_arguments(__doc__, "smaller sizes", lambda parser: parser.add_argument(
        "--profile", action="store_true", help="cProfile a sweep pass and a replay"), argv)
    sizes = QUICK if args.quick else FULL

    infra = Infra()
    infra.check()
    versions = infra.versions() | {"pal": pal_revision()}
    began = time.monotonic()
    with cleanup_on_signals(), tempfile.TemporaryDirectory(prefix="palbench-scale-") as tmp_name:
        tmp = Path(tmp_name)
        try:
            sweep_r = measure_sweep(infra, sizes, reps, tmp, args.profile)
            replay = measure_replay(infra, sizes, reps, tmp, args.profile)
            rss = measure_rss(infra, reps, tmp)
        finally:
            infra.close()
    result = results_json(sizes, reps, sweep_r, replay, rss, time.monotonic() - began, versions)
    print_table(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
