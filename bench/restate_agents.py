"""Restate on the agent-shaped load of bench/agents.py: R invocations of a handler of 3 steps, each
step a `ctx.run` around one call to the same model stand-in through the OpenAI SDK's async client,
all sent at once.

    .venv/bin/python -m bench.restate_agents [--runs R] [--json OUT]

How it runs: as bench/restate_peer.py runs Restate (its server from the npm registry, the Python
SDK served by hypercorn, in a network namespace with only loopback), with the stand-in started
inside that namespace too. Each `ctx.run` result (the model's answer) is journaled by the server
before the handler goes on, as PAL journals each step. One `AsyncOpenAI` client in the service,
retries off, an Idempotency-Key per call. Restate keeps its journal in its own log, not Postgres.

Reported as bench/agents.py reports PAL: wall time from the first request to the last response
against the ideal, steps/s, the peak memory of the server and the service (RSS), CPU per step
(the server, the service and this driver), and the stand-in's call counts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from bench import cpu
from bench.agents import DELAY_S, STEPS, StandIn, tree_rss
from bench.restate_peer import (
    INGRESS,
    NETNS_MARK,
    SERVICE_PORT,
    bring_up_loopback,
    reexec_in_netns,
    running_restate,
    server_binary,
)
from bench.throughput import cleanup_on_signals

SERVICE = "PalbenchAgent"


def serve(port: int, model_url: str) -> None:
    """Serve the agent handler with hypercorn on 127.0.0.1:`port` until SIGTERM."""
    import openai
    import restate
    from hypercorn.asyncio import serve as hypercorn_serve
    from hypercorn.config import Config
    from restate.server import install_shutdown_hook

    agent = restate.Service(SERVICE)
    model = openai.AsyncOpenAI(api_key="sk-bench", base_url=model_url, max_retries=0, timeout=60)

    @agent.handler("run")
    async def run(ctx: Any, task: str) -> list[str]:
        answers: list[str] = []
        for index in range(STEPS):
            async def ask(index: int = index) -> str:
                reply = await model.chat.completions.create(
                    model="stand-in", messages=[{"role": "user", "content": f"step {index}: {task}"}],
                    extra_headers={"Idempotency-Key": f"{ctx.request().id}-{index}"})
                return reply.choices[0].message.content or ""
            answers.append(await ctx.run_typed(f"w{index}", ask, restate.RunOptions()))
        return answers

    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.h2_max_concurrent_streams = 1 << 20
    config.keep_alive_timeout = 3600
    config.graceful_timeout = 1
    stop = asyncio.Event()

    async def main() -> None:
        install_shutdown_hook(asyncio.get_running_loop(), stop.set)
        await hypercorn_serve(restate.app(services=[agent]), config,  # type: ignore[arg-type]
                              shutdown_trigger=stop.wait)

    asyncio.run(main())


async def invoke_all(runs: int, timeout: float) -> tuple[list[Any], float]:
    import httpx
    async with httpx.AsyncClient(base_url=INGRESS, timeout=timeout,
                                 limits=httpx.Limits(max_connections=runs + 1)) as client:
        async def one(r: int) -> Any:
            response = await client.post(f"/{SERVICE}/run", json=f"task {r}")
            response.raise_for_status()
            return response.json()

        began = time.monotonic()
        results = await asyncio.wait_for(asyncio.gather(*(one(r) for r in range(runs))), timeout)
        return list(results), time.monotonic() - began


def measure(runs: int) -> dict[str, Any]:
    bring_up_loopback()
    standin = StandIn(Path("/tmp"))
    try:
        service = ["bench.restate_agents", "--serve", str(SERVICE_PORT), "--model-url", f"{standin.url}/v1"]
        with running_restate(server_binary(), service) as pids:
            deadline = time.monotonic() + 60
            while True:  # the first answer waits until the ingress knows the new deployment
                try:
                    asyncio.run(invoke_all(1, 30))
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            measured = [*pids, os.getpid()]
            before = cpu.seconds(measured)
            results, wall = asyncio.run(invoke_all(runs, 60 + runs))
            spent = cpu.seconds(measured) - before
            peak = sum(tree_rss(pid) for pid in pids)
        calls = standin.stats()
    finally:
        standin.stop()
    return {"peer": "restate", "runs": runs, "finished": all(len(r) == STEPS for r in results),
            "wall_s": round(wall, 2), "ideal_s": STEPS * DELAY_S,
            "wall_over_ideal": round(wall / (STEPS * DELAY_S), 2),
            "steps_per_s": round(runs * STEPS / wall, 1), "peak_connections": 0,
            "peak_mb": round(peak / 2**20), "cpu_ms_per_step": round(1000 * spent / (runs * STEPS), 2),
            "model_calls": calls["requests"] - STEPS, "repeated_keys": calls["repeated_keys"],
            "most_calls_at_once": calls["most_in_flight"]}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--model-url", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.serve is not None:
        serve(args.serve, args.model_url)
        return 0
    with cleanup_on_signals():
        if not os.environ.get(NETNS_MARK):
            server_binary()  # outside the namespace: it needs the registry
            return reexec_in_netns(argv, "bench.restate_agents")
        result = measure(args.runs)
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result))
    return 0 if result["finished"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
