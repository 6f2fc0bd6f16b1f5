"""LangGraph on the agent-shaped load of bench/agents.py: R runs of 3 nodes, each node one call to the
same model stand-in through the OpenAI SDK's async client, all started at once.

    .venv/bin/python -m bench.langgraph_agents --model-url URL [--runs R] [--json OUT]

How it runs: the way LangGraph's documentation gives for many concurrent runs in one process,
`ainvoke` of each run as an asyncio task on one event loop, with `AsyncPostgresSaver` on a psycopg
pool of 20 connections and `durability="sync"` (each node's checkpoint committed before the next
node starts, as PAL journals each step before the next). One `AsyncOpenAI` client is shared by every
node (its connection pool reused), with the SDK's retries off, as PAL's provider has them, and an
Idempotency-Key per node call. A fresh database per measurement, dropped at the end.

Reported as bench/agents.py reports PAL: wall time from the first `ainvoke` to the last return
against the ideal, steps/s, peak Postgres connections of this process (by application_name), this
process's peak memory, CPU per step (this process and Postgres), and the stand-in's call counts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
import uuid
from pathlib import Path
from typing import Any, TypedDict

import sqlalchemy as sa

from bench.agents import DELAY_S, STEPS, StandIn
from bench.langgraph_peer import fresh_database
from bench.peers import in_process_cpu, in_process_ms

PG_URL = "postgresql://postgres@127.0.0.1:5432/{database}?application_name={name}"
CONNECTIONS = 20


class Agent(TypedDict):
    key: str  # the run's own, for its calls' Idempotency-Keys
    task: str
    answers: list[str]


def build(saver: Any, model: Any) -> Any:
    from langgraph.graph import END, START, StateGraph

    def node(index: int) -> Any:
        async def ask(state: Agent) -> dict[str, Any]:
            thread = state["key"]
            reply = await model.chat.completions.create(
                model="stand-in", messages=[{"role": "user", "content": f"step {index}: {state['task']}"}],
                extra_headers={"Idempotency-Key": f"{thread}-{index}"})
            return {"answers": [*state["answers"], reply.choices[0].message.content or ""]}
        return ask

    builder = StateGraph(Agent)
    names = [f"w{i}" for i in range(STEPS)]
    for i, name in enumerate(names):
        builder.add_node(name, node(i))
    for before, after in zip([START, *names], [*names, END], strict=True):
        builder.add_edge(before, after)
    return builder.compile(checkpointer=saver)


async def measure(runs: int, model_url: str) -> dict[str, Any]:
    import openai
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    name = f"palbench-lg-{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine("postgresql+psycopg2://postgres@127.0.0.1:5432/test",
                             isolation_level="AUTOCOMMIT")
    model = openai.AsyncOpenAI(api_key="sk-bench", base_url=model_url, max_retries=0, timeout=60)
    settings = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    try:
        async with fresh_database() as database, AsyncConnectionPool(
                PG_URL.format(database=database, name=name), min_size=CONNECTIONS, max_size=CONNECTIONS,
                kwargs=settings, open=False) as pool:
            await pool.wait(timeout=30)
            saver = AsyncPostgresSaver(pool)  # type: ignore[arg-type]
            await saver.setup()
            graph = build(saver, model)
            warm = {"configurable": {"thread_id": uuid.uuid4().hex}}
            await graph.ainvoke({"key": "warm", "task": "warm-up", "answers": []}, warm, durability="sync")
            configs = [{"configurable": {"thread_id": uuid.uuid4().hex}} for _ in range(runs)]
            peak = 0

            async def watch() -> None:
                nonlocal peak
                while True:
                    with admin.connect() as conn:
                        peak = max(peak, conn.execute(sa.text(
                            "SELECT count(*) FROM pg_stat_activity WHERE application_name = :n"),
                            {"n": name}).scalar_one())
                    await asyncio.sleep(0.2)

            watcher = asyncio.create_task(watch())
            before = in_process_cpu()
            began = time.monotonic()
            finals = await asyncio.wait_for(asyncio.gather(*(
                graph.ainvoke({"key": config["configurable"]["thread_id"], "task": f"task {r}",
                               "answers": []}, config, durability="sync")
                for r, config in enumerate(configs))), 60 + runs)
            wall = time.monotonic() - began
            spent = in_process_ms(before, runs * STEPS)
            watcher.cancel()
            saved = [(await graph.aget_state(config)).values.get("answers") for config in configs]
    finally:
        await model.close()
        admin.dispose()
    complete = all(len(f["answers"]) == STEPS for f in finals) and saved == [f["answers"] for f in finals]
    return {"peer": "langgraph", "runs": runs, "finished": complete, "wall_s": round(wall, 2),
            "ideal_s": STEPS * DELAY_S, "wall_over_ideal": round(wall / (STEPS * DELAY_S), 2),
            "steps_per_s": round(runs * STEPS / wall, 1), "peak_connections": peak,
            "peak_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "cpu_ms_per_step": round(spent, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--model-url", default=None, help="a running stand-in's /v1 (else one is started)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    standin = None if args.model_url else StandIn(Path("/tmp"))
    try:
        result = asyncio.run(measure(args.runs, args.model_url or f"{standin.url}/v1"))  # type: ignore[union-attr]
        if standin is not None:
            calls = standin.stats()
            result |= {"model_calls": calls["requests"] - STEPS, "repeated_keys": calls["repeated_keys"],
                       "most_calls_at_once": calls["most_in_flight"]}
    finally:
        if standin is not None:
            standin.stop()
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result))
    return 0 if result["finished"] else 1


if __name__ == "__main__":
    sys.exit(main())
