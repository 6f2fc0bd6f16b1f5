"""SSE latency: from a journal commit to 100 concurrent subscribers, against a real `pal api`.

    .venv/bin/python -m bench.sse [--subscribers 100] [--steps 30]

A run parks on an approval, N subscribers connect to GET /v1/runs/<id>/events, the approval is
given, and a `pal worker` runs `steps` napping tool steps. For every event each subscriber receives,
latency = arrival time - the event's created_at (the journal row's timestamp, taken just before its
commit, on the same machine's clock). The peer, measured in the same run on a second identical
run: N clients polling GET /v1/runs/<id>/journal?after=<seq> every 200 ms (what a client without
SSE does). Reported: p50 / p95 / max of both, and the ratio SSE / polling.

Everything talks to 127.0.0.1 only: a fresh Postgres schema and Redis key prefix, removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from tests.support.api_server import free_port

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
from pal.core.clock import utcnow
from pal.storage.database import create_engine
from pal.storage.schema.migrate import upgrade

POLL_PERIOD = 0.2

RUN_TIMEOUT = 120.0


def graph(steps: int) -> dict[str, Any]:
    nodes: list[dict[str, Any]] = [{"id": "start", "type": "trigger"},
                                   {"id": "gate", "type": "approval", "data": {"prompt": "go"}}]
    nodes += [{"id": f"s{i}", "type": "tool", "data": {"tool": "nap", "args": {"seconds": 0.05}}}
              for i in range(steps)]
    ids = [n["id"] for n in nodes]
    edges = [{"source": a, "target": b} | ({"sourceHandle": "approved"} if a == "gate" else {})
             for a, b in itertools.pairwise(ids)]
    return {"nodes": nodes, "edges": edges}


def latency(event: dict[str, Any], arrived: float) -> float:
    return arrived - datetime.fromisoformat(event["created_at"]).timestamp()


async def subscribe(url: str, token: str, run_id: str, out: list[float], ready: asyncio.Event,
                    counter: list[int], total: int) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(timeout=RUN_TIMEOUT) as http, \
            http.stream("GET", f"{url}/v1/runs/{run_id}/events", headers=headers) as reply:
        counter[0] += 1
        if counter[0] == total:
            ready.set()
        async for line in reply.aiter_lines():
            if line.startswith("data:"):
                event = json.loads(line[5:])
                if event["kind"] != "run_queued" and event["step_id"] not in ("start", "gate"):
                    out.append(latency(event, time.time()))


async def poll(url: str, token: str, run_id: str, out: list[float]) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    after, deadline = 0, time.monotonic() + RUN_TIMEOUT
    async with httpx.AsyncClient(timeout=30) as http:
        while time.monotonic() < deadline:
            reply = await http.get(f"{url}/v1/runs/{run_id}/journal", params={"after": after},
                                   headers=headers)
            for event in reply.json()["events"]:
                after = event["seq"]
                if event["kind"] != "run_queued" and event["step_id"] not in ("start", "gate"):
                    out.append(latency(event, time.time()))
                if event["kind"].startswith("run_") and event["kind"] not in ("run_queued", "run_recovered"):
                    return
            await asyncio.sleep(POLL_PERIOD)


async def measure(client: Client, url: str, token: str, document: dict[str, Any], n: int,
                  mode: str) -> list[float]:
    run_id = client.start_run(document, {})
    deadline = time.monotonic() + RUN_TIMEOUT
    while client.get_run(run_id).status != "waiting":
        if time.monotonic() > deadline:
            raise SystemExit(f"run {run_id} never parked on its approval")
        await asyncio.sleep(0.05)
    samples: list[float] = []
    ready, counter = asyncio.Event(), [0]
    if mode == "sse":
        tasks = [asyncio.create_task(subscribe(url, token, run_id, samples, ready, counter, n))
                 for _ in range(n)]
        await asyncio.wait_for(ready.wait(), 60)
        await asyncio.sleep(0.5)  # every stream has read the backlog and waits for news
    else:
        tasks = [asyncio.create_task(poll(url, token, run_id, samples)) for _ in range(n)]
    client.approve(run_id, "gate", by="bench")
    try:
        await asyncio.wait_for(asyncio.gather(*tasks), RUN_TIMEOUT)
    except TimeoutError:
        raise TimeoutError(f"{mode}: {sum(not t.done() for t in tasks)} of {n} clients unfinished after "
                           f"{RUN_TIMEOUT:g}s; {describe_run(client, run_id)}") from None
    return samples


def describe_run(client: Client, run_id: str) -> str:
    """Where the run stands, for a timeout's message: did it stop, or did the streams miss its end?"""
    run, events = client.get_run(run_id), client.events(run_id)
    tail = ", ".join(f"{e.seq} {e.kind} {e.step_id or ''}".strip() for e in events[-4:])
    return f"run {run_id} is {run.status} with {len(events)} events, the last: {tail}"


def describe(samples: list[float]) -> str:
    ordered = sorted(samples)
    p95 = ordered[int(0.95 * (len(ordered) - 1))]
    return (f"p50 {statistics.median(ordered) * 1000:7.1f} ms   p95 {p95 * 1000:7.1f} ms   "
            f"max {ordered[-1] * 1000:7.1f} ms   ({len(ordered)} deliveries)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--subscribers", type=int, default=100)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = parser.parse_args(argv)
    infra = Infra()
    infra.check()
    processes = []
    with cleanup_on_signals(), tempfile.TemporaryDirectory(prefix="palbench-sse-") as folder:
        tmp = Path(folder)
        try:
            _, url = infra.new_schema("sse")
            engine = create_engine(url)
            upgrade(engine)
            engine.dispose()
            settings, env = pal_settings(url, tmp / "home", f"{KEY_ROOT}sse:", "palbench-sse")
            env |= {"PAL_TOOL_MODULES": "tests.support.tools"}
            port = free_port()
            pal = [sys.executable, "-m", "pal.cli"]
            processes.append(start_process([*pal, "api", "--port", str(port)], env, tmp / "api.log"))
            processes.append(start_process([*pal, "worker", "--concurrency", "2"], env, tmp / "worker.log"))
            client = Client(settings.with_(tool_modules=("tests.support.tools",)))
            _, token = client.runtime.journal.tokens.create_token(tenant_id=settings.tenant, name="bench",
                                                                  now=utcnow())
            api = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while True:
                try:
                    httpx.get(api + "/openapi.json", timeout=2)
                    break
                except httpx.TransportError:
                    if time.monotonic() > deadline:
                        raise SystemExit("pal api did not start:\n" + log_tail(tmp / "api.log")) from None
                    time.sleep(0.2)
            document = graph(args.steps)
            try:
                sse = asyncio.run(measure(client, api, token, document, args.subscribers, "sse"))
                polled = asyncio.run(measure(client, api, token, document, args.subscribers, "poll"))
            except TimeoutError as exc:
                raise SystemExit(f"{exc}\napi log tail:\n{log_tail(tmp / 'api.log')}\n"
                                 f"worker log tail:\n{log_tail(tmp / 'worker.log')}") from None
            print(f"SSE, {args.subscribers} subscribers:      {describe(sse)}")
            print(f"polling every {POLL_PERIOD * 1000:.0f} ms (peer):  {describe(polled)}")
            print(f"ratio SSE / polling: p50 {statistics.median(sse) / statistics.median(polled):.2f}x")
            if args.json:
                args.json.write_text(json.dumps({
                    "subscribers": args.subscribers, "sse_p50_ms": 1000 * statistics.median(sse),
                    "poll_p50_ms": 1000 * statistics.median(polled)}, indent=2))
            client.close()
        finally:
            for process in processes:
                stop_process(process)
            infra.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
