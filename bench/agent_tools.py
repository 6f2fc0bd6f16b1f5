"""The agent benchmark's tool (bench/agents.py, tool variant): one call to the model stand-in over
HTTP, awaited, as an agent's own tool would make it (an async client shared by the process)."""

from __future__ import annotations

import os
from typing import Any

import httpx

from pal.tools import tool

_clients: dict[str, httpx.AsyncClient] = {}


@tool(name="bench_ask")
async def bench_ask(prompt: str, key: str) -> dict[str, Any]:
    base = os.environ["BENCH_MODEL_URL"]
    client = _clients.get(base)
    if client is None:
        # The OpenAI SDK's limits: a connection per call in flight, up to 1,000, and 100 kept idle
        # (httpx's pool looks through its idle connections on every request).
        client = _clients[base] = httpx.AsyncClient(base_url=base, timeout=30, limits=httpx.Limits(
            max_connections=1000, max_keepalive_connections=100))
    reply = await client.post("/chat/completions", headers={"Idempotency-Key": key}, json={
        "model": "stand-in", "messages": [{"role": "user", "content": prompt}]})
    reply.raise_for_status()
    return {"text": reply.json()["choices"][0]["message"]["content"]}
