"""`openai`: the OpenAI Chat Completions API through the official SDK.

Steps on a worker's event loop use the SDK's async client (one per loop, its connections reused
across steps). The SDK's own retries are off (max_retries=0): retries are PAL's per-step policy,
journaled. The API key comes from OPENAI_API_KEY and only ever travels in the Authorization header.
"""

from __future__ import annotations

import json
from typing import Any

import openai

from pal.errors import ProviderError
from pal.providers.base import AsyncClients, ModelRequest, ModelResponse, Provider, sdk_errors


def _messages(request: ModelRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if request.system:
        out.append({"role": "system", "content": request.system})
    for m in request.messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            out.append({"role": "assistant", "content": m.get("content") or None, "tool_calls": [
                {"id": c["id"], "type": "function",
                 "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}}
                for c in m["tool_calls"]]})
        elif m["role"] == "tool":
            out.append({"role": "tool", "tool_call_id": m["tool_call_id"], "content": m["content"]})
        else:
            out.append({"role": m["role"], "content": m.get("content", "")})
    return out


class OpenAIProvider(Provider):
    name = "openai"
    speaks_async = True

    def __init__(self, *, api_key: str | None, base_url: str | None, timeout: float) -> None:
        options: dict[str, Any] = {"api_key": api_key or "unset", "base_url": base_url, "timeout": timeout,
                                   "max_retries": 0}
        self._client = openai.OpenAI(**options)
        self._async = AsyncClients(lambda: openai.AsyncOpenAI(**options))

    def complete(self, request: ModelRequest, idempotency_key: str) -> ModelResponse:
        with sdk_errors("openai", openai.APIError, openai.APITimeoutError):
            reply = self._client.chat.completions.create(
                **_arguments(request), extra_headers={"Idempotency-Key": idempotency_key})
        return _response(reply, request)

    async def acomplete(self, request: ModelRequest, idempotency_key: str) -> ModelResponse:
        with sdk_errors("openai", openai.APIError, openai.APITimeoutError):
            reply = await self._async.client().chat.completions.create(
                **_arguments(request), extra_headers={"Idempotency-Key": idempotency_key})
        return _response(reply, request)


def _arguments(request: ModelRequest) -> dict[str, Any]:
    # max_completion_tokens: the name every current chat model accepts (reasoning models
    # refuse the older max_tokens).
    kwargs: dict[str, Any] = {"model": request.model, "messages": _messages(request),
                              "max_completion_tokens": request.max_tokens}
    if request.temperature is not None:
        kwargs["temperature"] = request.temperature
    if request.logprobs:
        kwargs["logprobs"] = True
    if request.tools:
        kwargs["tools"] = [{"type": "function", "function": t.as_dict()} for t in request.tools]
    return kwargs


def _response(reply: Any, request: ModelRequest) -> ModelResponse:
    choice = reply.choices[0]
    try:
        calls = tuple(
            {"id": c.id, "name": c.function.name, "arguments": json.loads(c.function.arguments or "{}")}
            for c in (choice.message.tool_calls or []) if getattr(c, "function", None) is not None
        )
    except json.JSONDecodeError as exc:
        raise ProviderError(f"openai: a tool call's arguments are not JSON: {exc}") from exc
    usage = reply.usage
    tokens = choice.logprobs.content if choice.logprobs is not None else None
    return ModelResponse(
        logprob=tokens[0].logprob if tokens else None,
        text=choice.message.content or "", model=reply.model or request.model,
        input_tokens=usage.prompt_tokens if usage else 0,
        output_tokens=usage.completion_tokens if usage else 0,
        tool_calls=calls, stop_reason=choice.finish_reason,
    )
