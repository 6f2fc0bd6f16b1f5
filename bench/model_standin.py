"""A model stand-in for the agent-shaped benchmarks: an OpenAI-compatible `POST /v1/chat/completions`
on 127.0.0.1 that answers every request after a fixed delay, as a model would, on one asyncio event
loop (uvicorn), so a thousand calls wait at once without a thread each.

    .venv/bin/python -m bench.model_standin --port P [--delay 1.0]

`GET /stats` gives the requests seen and how many carried each `Idempotency-Key` more than once, so
a benchmark can check that every step attempt called the model once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

MAX_BODY = 1 << 20


class ModelStandIn:
    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.keys: Counter[str] = Counter()
        self.requests = 0
        self.in_flight = 0
        self.most_in_flight = 0

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        if scope["method"] == "GET" and scope["path"] == "/stats":
            twice = sum(1 for n in self.keys.values() if n > 1)
            await _answer(send, 200, {"requests": self.requests, "keys": len(self.keys),
                                      "repeated_keys": twice, "most_in_flight": self.most_in_flight})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if len(body) > MAX_BODY or not message.get("more_body"):
                break
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        self.requests += 1
        self.keys[headers.get("idempotency-key", "")] += 1
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
        finally:
            self.in_flight -= 1
        try:
            model = json.loads(body).get("model", "stand-in")
        except ValueError:
            model = "stand-in"
        await _answer(send, 200, {
            "id": f"chatcmpl-{self.requests}", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "a considered answer"}}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}})


async def _answer(send: Send, status: int, payload: dict[str, Any]) -> None:
    data = json.dumps(payload).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--delay", type=float, default=1.0)
    args = parser.parse_args()
    uvicorn.run(ModelStandIn(args.delay), host="127.0.0.1", port=args.port, log_level="warning",
                backlog=4096, timeout_keep_alive=30)


if __name__ == "__main__":
    main()
