"""What effectful nodes may use (pal.nodes.base.Services), built on a runtime: providers, prices,
settings and child runs. Nodes get this object, never the runtime, so they cannot reach storage."""

from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from pal.engine.runs import start_child_run
from pal.engine.runtime import Runtime
from pal.nodes.base import StepContext
from pal.providers import Provider, get_provider
from pal.providers.pricing import cost


class NodeServices:
    def __init__(self, rt: Runtime) -> None:
        self._rt = rt

    def provider(self, name: str) -> Provider:
        settings = self._rt.settings
        base_urls = {"openai": settings.openai_base_url, "anthropic": settings.anthropic_base_url}
        return get_provider(name, base_urls=base_urls, timeout=settings.provider_timeout)

    def price(self, model: str, input_tokens: int, output_tokens: int,
              answered_model: str | None = None) -> Decimal | None:
        return cost(self._rt.prices, model, input_tokens, output_tokens, answered_model)

    def setting(self, name: str) -> Any:
        return getattr(self._rt.settings, name)

    def start_child(self, ctx: StepContext, document: Mapping[str, Any], child_input: Any) -> str:
        return start_child_run(self._rt, ctx.run_id, ctx.step_id, ctx.attempt, dict(document), child_input)
