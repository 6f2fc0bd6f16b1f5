"""LangGraph with its Postgres checkpointer as a peer of PAL: durable no-op steps per second on the
same Postgres.

    .venv/bin/python bench/langgraph_peer.py [--reps N] [--quick] [--json PATH]

Scenarios (the same shapes as bench/throughput.py and bench/dbos_peer.py):
  linear       one run of a graph of N sequential no-op nodes (START -> n0 -> ... -> nN-1 -> END; N = 300)
  concurrent   K runs of such a graph of M nodes, started together (default 20 x 100)
steps/s = completed nodes / wall time. The clock (time.perf_counter) starts just before the first
`ainvoke` and stops when the last run has returned; each run's final state must count its N nodes,
and so must the last checkpoint of its thread, read back from Postgres after the clock stopped.

How it runs. `langgraph` with `langgraph-checkpoint-postgres` (`AsyncPostgresSaver` on a psycopg 3
pool, with the connection settings the saver requires: autocommit, dict rows, no prepared
statements) and `durability="sync"`: the checkpoint of each superstep (here: one node) is committed
before the next starts, so a node's completion is on record before its successor runs, as in PAL.
The runs are asyncio tasks on one event loop in this one process, with async nodes: LangGraph's
async API (`ainvoke` with the async saver) is what its documentation gives for many concurrent runs
in one process; a synchronous `invoke` per thread would add a thread per run and still share one GIL.
Each run is its own thread (`thread_id`) with a recursion limit above its node count. Each process
run gets a fresh Postgres database `palbench_langgraph_<hex>` on 127.0.0.1 (the saver's `setup()`
creates its tables), a pool of K connections, one untimed round of each scenario's shape to warm
up, and the database is dropped at the end, also on failure.

CPU per step is the user + system time of this process and of every Postgres process over a
measurement, divided by its steps (bench/cpu.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TypedDict

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    # Run as a script or as `python -m bench.langgraph_peer`: the same module path either way.
    sys.path.insert(0, str(REPO))

from bench.peers import (  # noqa: E402
    Samples,
    Scenario,
    finish,
    in_process_cpu,
    in_process_ms,
    log,
    scenarios,
    warm_ups,
    write_failure,
)
from bench.throughput import bench_arguments, cleanup_on_signals  # noqa: E402

PG_URL = "postgresql://postgres@127.0.0.1:5432/{database}"
ADMIN_DATABASE = "test"
WAIT_TIMEOUT = 300.0  # seconds one scenario's runs may take before the measurement is abandoned


class Chain(TypedDict):
    done: int  # nodes run so far


async def noop_node(state: Chain) -> dict[str, int]:
    """Does nothing but count itself; the count is what the checkpoint records."""
    return {"done": state["done"] + 1}


class Graphs:
    """One compiled linear graph per length, all on the same checkpointer."""

    def __init__(self, saver: Any) -> None:
        self.saver = saver
        self.compiled: dict[int, Any] = {}

    def linear(self, nodes: int) -> Any:
        if nodes not in self.compiled:
            from langgraph.graph import END, START, StateGraph

            builder = StateGraph(Chain)
            names = [f"n{index}" for index in range(nodes)]
            for name in names:
                builder.add_node(name, noop_node)
            for before, after in zip([START, *names], [*names, END], strict=True):
                builder.add_edge(before, after)
            self.compiled[nodes] = builder.compile(checkpointer=self.saver)
        return self.compiled[nodes]


# ---------------------------------------------------------------------------- infrastructure


@contextlib.asynccontextmanager
async def fresh_database() -> AsyncIterator[str]:
    """Create a uniquely named database for the checkpointer's tables; drop it on the way out."""
    import psycopg

    name = f"palbench_langgraph_{uuid.uuid4().hex[:12]}"
    admin = PG_URL.format(database=ADMIN_DATABASE)
    # CREATE/DROP DATABASE cannot run inside a transaction, hence autocommit.
    async with await psycopg.AsyncConnection.connect(admin, autocommit=True, connect_timeout=10) as conn:
        await conn.execute(f'CREATE DATABASE "{name}"')
    log(f"created database {name}")
    try:
        yield name
    finally:
        async with await psycopg.AsyncConnection.connect(admin, autocommit=True, connect_timeout=10) as conn:
            # FORCE: a run left behind by a timeout may still hold a pooled connection.
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        log(f"dropped database {name}")


@contextlib.asynccontextmanager
async def checkpointer(database: str, connections: int) -> AsyncIterator[Any]:
    """An AsyncPostgresSaver on a pool of `connections`, its tables set up."""
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    # The settings the saver's documentation requires of the connections it is given.
    settings = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    async with AsyncConnectionPool(PG_URL.format(database=database), min_size=connections,
                                   max_size=connections, kwargs=settings, open=False) as pool:
        await pool.wait(timeout=30)
        saver = AsyncPostgresSaver(pool)  # type: ignore[arg-type]
        await saver.setup()
        yield saver


# ------------------------------------------------------------------------------ measurement


async def run_scenario(graphs: Graphs, scenario: Scenario,
                       timeout: float = WAIT_TIMEOUT) -> tuple[float, float]:
    """Run `scenario` once; its steps per second and CPU milliseconds per step (this process and
    Postgres)."""
    graph = graphs.linear(scenario.steps)
    configs = [{"configurable": {"thread_id": uuid.uuid4().hex}, "recursion_limit": scenario.steps + 10}
               for _ in range(scenario.workflows)]
    before = in_process_cpu()
    t0 = time.perf_counter()
    runs = asyncio.gather(*(graph.ainvoke({"done": 0}, config, durability="sync") for config in configs))
    finals = await asyncio.wait_for(runs, timeout)
    t1 = time.perf_counter()
    spent = in_process_ms(before, scenario.total)
    done = [final["done"] for final in finals]
    saved = [(await graph.aget_state(config)).values.get("done") for config in configs]
    if done != [scenario.steps] * scenario.workflows or saved != done:
        raise RuntimeError(f"{scenario.name}: runs returned {done} and checkpointed {saved}, "
                           f"expected {scenario.steps} each")
    return scenario.total / (t1 - t0), spent


async def measure(reps: int, quick: bool) -> dict[str, Any]:
    """Measure both scenarios `reps` times on a fresh database (see bench/peers.py for the result)."""
    plan = scenarios(quick)
    samples = Samples(plan, reps)
    connections = max(s.workflows for s in plan)
    async with fresh_database() as database, checkpointer(database, connections) as saver:
        graphs = Graphs(saver)
        for scenario in warm_ups(plan):
            await run_scenario(graphs, scenario)
        for rep in range(1, reps + 1):
            for scenario in plan:
                rate, cpu_ms = await run_scenario(graphs, scenario)
                samples.add(rep, scenario, rate, cpu_ms)
    return samples.result({
        "langgraph_version": importlib.metadata.version("langgraph"),
        "checkpoint_postgres_version": importlib.metadata.version("langgraph-checkpoint-postgres")})


# ------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    args, reps = bench_arguments(__doc__, "small graphs", None, argv)
    try:
        with cleanup_on_signals():
            result = asyncio.run(measure(reps, args.quick))
    except Exception as exc:  # bench/all.py shows why in its table; the peers around it still run
        write_failure(args.json, exc, "LangGraph")
        return 1
    finish(result, f"LangGraph {result['langgraph_version']} + langgraph-checkpoint-postgres "
           f"{result['checkpoint_postgres_version']} (durability sync), Postgres on 127.0.0.1, "
           f"reps {reps}, medians", "LangGraph", args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
