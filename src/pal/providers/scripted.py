"""`scripted`: an offline, deterministic provider for demos and tests.

The reply to a request is a pure function of the request: entry N of the node's `script` answers
the request that already holds N assistant messages; past the end of the script (or with none) it
answers with a short summary of the last user message. Tokens are counted as words. An entry's
`logprob` is the log-probability reported for its first token (the confidence gate's estimator).
"""

from __future__ import annotations

import json
from typing import Any

from pal.providers.base import ModelRequest, ModelResponse, Provider, last_user_text


def _words(value: Any) -> int:
    text = value if isinstance(value, str) else json.dumps(value)
    return len(text.split())


class ScriptedProvider(Provider):
    name = "scripted"

    def complete(self, request: ModelRequest, idempotency_key: str) -> ModelResponse:
        turn = sum(1 for m in request.messages if m.get("role") == "assistant")
        entry = request.script[turn] if turn < len(request.script) else None
        if entry is None:
            prompt = last_user_text(request.messages)
            entry = {"text": f"[{request.model}] scripted reply to: " + " ".join(prompt.split()[:40])}
        calls = tuple(
            {"id": f"call_{turn}_{index}", "name": str(call["name"]),
             "arguments": dict(call.get("arguments") or {})}
            for index, call in enumerate(entry.get("tool_calls") or [])
        )
        text = str(entry.get("text", ""))
        input_tokens = sum(_words(m.get("content", "")) for m in request.messages)
        input_tokens += _words(request.system or "")
        return ModelResponse(
            text=text, model=request.model, input_tokens=max(1, input_tokens),
            output_tokens=max(1, _words(text) + 5 * len(calls)), tool_calls=calls,
            stop_reason="tool_calls" if calls else "stop",
            logprob=float(entry["logprob"]) if request.logprobs and "logprob" in entry else None,
        )
