"""`ai-step`: one model call through a provider, journaled with its text, tokens and cost.

The call carries `Idempotency-Key: sha256("runID|stepID|attempt")`. Once the step has
`step_completed`, a replay reads the output from the journal and the provider is never called
again (the completed-step check of the step protocol; docs/specification.md, Replay).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Coroutine, Mapping
from decimal import Decimal
from typing import Any, ClassVar

from pal.core.records import Usage
from pal.errors import StepError
from pal.nodes.base import Field, NodeKind, NodeResult, Services, StepContext
from pal.providers import PROVIDERS, ModelRequest, ModelResponse, ToolSpec

DEFAULT_PROVIDER = "scripted"
DEFAULT_MODEL = "scripted-1"


def call_model(ctx: StepContext, provider_name: str, request: ModelRequest) -> NodeResult:
    """Call the model for this step attempt and price the answer (shared by plain-LLM turns)."""
    services = ctx.need_services()
    response = services.provider(provider_name).complete(request, ctx.idempotency_key)
    return priced_result(ctx, provider_name, request.model, response)


class ModelCall(NodeKind):
    """A node whose effect is one model call: awaited on the provider's async client where the
    provider has one (a worker's event loop), else called in the worker's thread."""

    @abstractmethod
    def request(self, data: Mapping[str, Any], ctx: StepContext) -> ModelRequest:
        """The call this node makes, rendered from its data and the run so far."""

    def execute(self, data: Mapping[str, Any], ctx: StepContext) -> Any:
        return call_model(ctx, str(data.get("provider", DEFAULT_PROVIDER)), self.request(data, ctx))

    def chainable(self, data: Mapping[str, Any], services: Services) -> bool:
        return services.provider(str(data.get("provider", DEFAULT_PROVIDER))).speaks_async

    def awaitable(self, data: Mapping[str, Any], ctx: StepContext) -> Coroutine[Any, Any, Any] | None:
        name = str(data.get("provider", DEFAULT_PROVIDER))
        provider = ctx.need_services().provider(name)
        if not provider.speaks_async:
            return None
        request = self.request(data, ctx)

        async def call() -> NodeResult:
            response = await provider.acomplete(request, ctx.idempotency_key)
            return priced_result(ctx, name, request.model, response)

        return call()


def priced_result(ctx: StepContext, provider_name: str, asked_model: str,
                  response: ModelResponse) -> NodeResult:
    # Priced by the model asked for: providers answer with dated snapshot names.
    price = ctx.need_services().price(asked_model, response.input_tokens, response.output_tokens,
                                      response.model)
    usage = Usage(response.input_tokens, response.output_tokens, price or Decimal(0))
    output: dict[str, Any] = {
        "text": response.text,
        "provider": provider_name,
        "model": response.model,
        "usage": {"input_tokens": response.input_tokens, "output_tokens": response.output_tokens},
        "cost_usd": str(usage.cost_usd),
        "priced": price is not None,
    }
    if response.tool_calls:
        output["tool_calls"] = [dict(c) for c in response.tool_calls]
    return NodeResult(output, usage)


def provider_problems(data: Mapping[str, Any]) -> list[str]:
    name = data.get("provider", DEFAULT_PROVIDER)
    if isinstance(name, str) and name not in PROVIDERS:
        return [f"unknown provider {name!r} (known: {', '.join(PROVIDERS)})"]
    return []


def script_of(data: Mapping[str, Any]) -> tuple[dict[str, Any], ...]:
    script = data.get("script") or []
    if isinstance(script, list) and all(isinstance(e, Mapping) for e in script):
        return tuple(dict(e) for e in script)
    raise StepError("data field 'script' must be a list of objects")


class AiStep(ModelCall):
    type_name = "ai-step"
    gateable: ClassVar[bool] = True  # the confidence gate may stand before its effect
    fields: ClassVar[Mapping[str, Field]] = {
        "prompt": Field((str,), required=True),
        "system": Field((str,)),
        "provider": Field((str,), templated=False),
        "model": Field((str,), templated=False),
        "maxTokens": Field((int,), templated=False),
        "temperature": Field((int, float), templated=False),
        "script": Field((list,), templated=False),
        "label": Field((str,), templated=False),
    }

    def validate(self, data: Mapping[str, Any], known_tools: frozenset[str] | None) -> list[str]:
        return super().validate(data, known_tools) + provider_problems(data)

    def request(self, data: Mapping[str, Any], ctx: StepContext) -> ModelRequest:
        prompt = ctx.render(data["prompt"])
        system = ctx.render(data["system"]) if data.get("system") else None
        return ModelRequest(
            model=str(data.get("model", DEFAULT_MODEL)),
            messages=({"role": "user", "content": str(prompt)},),
            system=str(system) if system is not None else None,
            max_tokens=int(data.get("maxTokens", 1024)),
            temperature=data.get("temperature"),
            script=script_of(data),
        )


__all__ = ["AiStep", "ModelCall", "ToolSpec", "call_model"]
