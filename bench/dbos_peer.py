"""DBOS (the `dbos` package) as a peer of PAL: durable no-op steps per second on the same Postgres.

    .venv/bin/python bench/dbos_peer.py [--reps N] [--quick] [--json PATH]

Scenarios (the same shapes as bench/throughput.py):
  linear       one workflow of N sequential no-op `@DBOS.step()` calls (default N = 300)
  concurrent   K such workflows of M steps, started back to back (default 20 x 100)
steps/s = completed steps / wall time. The clock (time.perf_counter) starts just before the first
`DBOS.start_workflow` and stops when the last workflow's result is back in this process; each
result is checked to be the number of steps that workflow ran.

DBOS is a library, not a worker fleet: workflows run on threads of this one Python process
(`DBOS.start_workflow` submits them to DBOS's thread pool) and every step runs inline on its
workflow's thread, checkpointing its output to the system database before the next step starts.
Each process run gets a fresh Postgres database `palbench_dbos_<hex>` on 127.0.0.1 as the DBOS
system database; DBOS is launched once per run, warmed up with one untimed round of each
scenario's shape, destroyed at the end, and the database is dropped, also on failure.

CPU per step is the user + system time of this process and of every Postgres process over a
measurement, divided by its steps (bench/cpu.py).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import sqlalchemy as sa

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    # Run as a script or imported as `bench.dbos_peer` by bench/all.py: the same module path either way.
    sys.path.insert(0, str(REPO))

from dbos import DBOS, DBOSConfig, WorkflowHandle  # noqa: E402

from bench.peers import (  # noqa: E402
    Samples,
    Scenario,
    finish,
    in_process_cpu,
    in_process_ms,
    log,
    scenarios,
    warm_ups,
)
from bench.throughput import bench_arguments, cleanup_on_signals  # noqa: E402

ADMIN_URL = "postgresql+psycopg2://postgres@127.0.0.1:5432/test"
SYSDB_URL = "postgresql://postgres@127.0.0.1:5432/{database}"  # DBOS swaps in its own driver (psycopg 3)
APP_NAME = "palbench-dbos"
WAIT_TIMEOUT = 300.0  # seconds one scenario's workflows may take before the measurement is abandoned


# ------------------------------------------------------------------------------ workflows


@DBOS.step()
def noop_step(index: int) -> int:
    """Does nothing; the small return value is what DBOS checkpoints."""
    return index


@DBOS.workflow()
def chain(steps: int) -> int:
    """`steps` no-op steps, one after the other; returns how many ran."""
    done = 0
    for index in range(steps):
        noop_step(index)
        done += 1
    return done


# ---------------------------------------------------------------------------- infrastructure


@contextlib.contextmanager
def fresh_database() -> Iterator[str]:
    """Create a uniquely named database for DBOS's system tables; drop it on the way out."""
    name = f"palbench_dbos_{uuid.uuid4().hex[:12]}"
    # CREATE/DROP DATABASE cannot run inside a transaction, hence AUTOCOMMIT.
    admin = sa.create_engine(ADMIN_URL, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 10})
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        log(f"created database {name}")
        try:
            yield name
        finally:
            with admin.connect() as conn:
                # FORCE: a workflow thread left behind by a timeout may still hold a connection.
                conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            log(f"dropped database {name}")
    finally:
        admin.dispose()


@contextlib.contextmanager
def launched_dbos(database: str) -> Iterator[None]:
    """DBOS configured in code (no dbos-config.yaml), launched, and destroyed afterwards."""
    config: DBOSConfig = {
        "name": APP_NAME,
        "system_database_url": SYSDB_URL.format(database=database),
        # INFO logs a line per launch phase; per-step logging is debug-level either way.
        "log_level": "WARNING",
    }
    DBOS(config=config)
    try:
        DBOS.launch()
        yield
    finally:
        # Keep the registry: the decorated functions above were registered once, at import.
        DBOS.destroy(destroy_registry=False)


# ------------------------------------------------------------------------------ measurement


def await_results(handles: list[WorkflowHandle[int]], timeout: float) -> tuple[list[int], float]:
    """Every handle's result and the perf_counter time the last one arrived, within `timeout`.

    `WorkflowHandle.get_result` takes no timeout, so a daemon thread collects the results and
    this thread waits on it with one; a stuck workflow then ends the measurement, not the run.
    """
    results: list[int] = []
    errors: list[BaseException] = []
    finished: list[float] = []
    done = threading.Event()

    def collect() -> None:
        try:
            results.extend(handle.get_result() for handle in handles)
            finished.append(time.perf_counter())
        except BaseException as exc:  # handed over to the waiting thread below
            errors.append(exc)
        finally:
            done.set()

    threading.Thread(target=collect, name="palbench-dbos-wait", daemon=True).start()
    if not done.wait(timeout):
        raise TimeoutError(f"{len(handles) - len(results)} of {len(handles)} DBOS workflows unfinished "
                           f"after {timeout:g}s")
    if errors:
        raise RuntimeError(f"a DBOS workflow failed: {errors[0]!r}") from errors[0]
    return results, finished[0]


def run_scenario(scenario: Scenario, timeout: float = WAIT_TIMEOUT) -> tuple[float, float]:
    """Run `scenario` once; its steps per second and CPU milliseconds per step (this process and
    Postgres)."""
    before = in_process_cpu()
    t0 = time.perf_counter()
    # start_workflow records the workflow row, then hands it to DBOS's thread pool and returns.
    handles = [DBOS.start_workflow(chain, scenario.steps) for _ in range(scenario.workflows)]
    results, t1 = await_results(handles, timeout)
    spent = in_process_ms(before, scenario.total)
    if results != [scenario.steps] * scenario.workflows:
        raise RuntimeError(f"{scenario.name}: workflows returned {results}, expected {scenario.steps} each")
    return scenario.total / (t1 - t0), spent


def measure(reps: int, quick: bool) -> dict[str, Any]:
    """Measure both scenarios `reps` times on a fresh DBOS system database.

    Returns {"dbos_version", "linear": {...}, "concurrent": {...}}; each scenario has "workflows",
    "steps" (all workflows' steps in one repetition), "steps_per_s" (one figure per repetition)
    and their "median".
    DBOS is a process-wide singleton: call this while no other DBOS instance exists.
    """
    plan = scenarios(quick)
    samples = Samples(plan, reps)
    with fresh_database() as database, launched_dbos(database):
        for scenario in warm_ups(plan):
            run_scenario(scenario)
        for rep in range(1, reps + 1):
            for scenario in plan:
                samples.add(rep, scenario, *run_scenario(scenario))
    return samples.result({"dbos_version": importlib.metadata.version("dbos")})


# ------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    args, reps = bench_arguments(__doc__, "small workflows", None, argv)
    with cleanup_on_signals():
        result = measure(reps, args.quick)
    finish(result, f"DBOS {result['dbos_version']}, system database on 127.0.0.1, reps {reps}, medians",
           "DBOS", args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
