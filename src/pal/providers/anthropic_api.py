"""`anthropic`: the Anthropic Messages API through the official SDK.

The SDK's own retries are off (max_retries=0): retries are PAL's per-step policy, journaled. The
API key comes from ANTHROPIC_API_KEY and only ever travels in the auth header.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic

from pal.providers.base import AsyncClients, ModelRequest, ModelResponse, Provider, sdk_errors


def _messages(request: ModelRequest) -> list[dict[str, Any]]:
    """Anthropic wants tool results as user turns of tool_result blocks, consecutive ones merged."""
    out: list[dict[str, Any]] = []
    for m in request.messages:
        if m["role"] == "assistant":
            blocks: list[dict[str, Any]] = []
            if m.get("content"):
                blocks.append({"type": "text", "text": m["content"]})
            blocks += [{"type": "tool_use", "id": c["id"], "name": c["name"], "input": c["arguments"]}
                       for c in m.get("tool_calls") or []]
            out.append({"role": "assistant", "content": blocks or ""})
        elif m["role"] == "tool":
            block = {"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]}
            if out and out[-1]["role"] == "user" and isinstance(out[-1]["content"], list):
                out[-1]["content"].append(block)
            else:
                out.append({"role": "user", "content": [block]})
        else:
            out.append({"role": "user", "content": m.get("content", "")})
    return out


class AnthropicProvider(Provider):
    name = "anthropic"
    speaks_async = True

    def __init__(self, *, api_key: str | None, base_url: str | None, timeout: float) -> None:
        options: dict[str, Any] = {"api_key": api_key or "unset", "base_url": base_url, "timeout": timeout,
                                   "max_retries": 0}
        self._client = anthropic.Anthropic(**options)
        self._async = AsyncClients(lambda: anthropic.AsyncAnthropic(**options))

    def complete(self, request: ModelRequest, idempotency_key: str) -> ModelResponse:
        with sdk_errors("anthropic", anthropic.APIError, anthropic.APITimeoutError):
            reply = self._client.messages.create(
                **_arguments(request), extra_headers={"Idempotency-Key": idempotency_key})
        return _response(reply, request)

    async def acomplete(self, request: ModelRequest, idempotency_key: str) -> ModelResponse:
        with sdk_errors("anthropic", anthropic.APIError, anthropic.APITimeoutError):
            reply = await self._async.client().messages.create(
                **_arguments(request), extra_headers={"Idempotency-Key": idempotency_key})
        return _response(reply, request)


def _arguments(request: ModelRequest) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"model": request.model, "messages": _messages(request),
                              "max_tokens": request.max_tokens}
    if request.system:
        kwargs["system"] = request.system
    if request.temperature is not None:
        # This SDK release has no `temperature` argument; the API takes it in the body.
        kwargs["extra_body"] = {"temperature": request.temperature}
    if request.tools:
        kwargs["tools"] = [{"name": t.name, "description": t.description,
                            "input_schema": t.parameters} for t in request.tools]
    return kwargs


def _response(reply: Any, request: ModelRequest) -> ModelResponse:
    texts, calls = [], []
    for block in reply.content:
        if block.type == "text":
            texts.append(block.text)
        elif block.type == "tool_use":
            calls.append({"id": block.id, "name": block.name,
                          "arguments": json.loads(json.dumps(block.input))})
    return ModelResponse(
        text="".join(texts), model=reply.model or request.model,
        input_tokens=reply.usage.input_tokens, output_tokens=reply.usage.output_tokens,
        tool_calls=tuple(calls), stop_reason=reply.stop_reason,
    )
