"""What a PAL process needs to run steps: settings, the journal, parsed plans, a publisher,
and the services effectful nodes use (providers, prices, delivery settings)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from decimal import Decimal
from functools import cached_property
from typing import Any, Protocol

from pal.config import Settings
from pal.core import doorbell
from pal.core.lru import Lru
from pal.engine import builtin_tools  # noqa: F401  (registers the built-in tools)
from pal.engine.heartbeat import LeaseKeeper
from pal.nodes.base import StepContext
from pal.plan.interpreter import Program
from pal.plan.programs import program_of
from pal.providers import Provider, get_provider
from pal.providers.pricing import cost, load_prices
from pal.storage.database import shared_engine
from pal.storage.journal import Journal, RunRecord
from pal.tools import load_tool_modules


class Publish(Protocol):
    def __call__(self, run_id: str, step_id: str, generation: int, *, countdown: float = 0.0) -> None:
        """Ring the doorbell for one step, now or `countdown` seconds from now."""


PublishBatch = Callable[[], AbstractContextManager[None]]
"""publish_batch(): within it, this thread's publishes may be buffered and sent together at its
end (one broker round trip for a sweep's messages); an exception out of it may drop them."""


_PLAN_CACHE_SIZE = 256


class Runtime:
    def __init__(self, settings: Settings, publish: Publish,
                 publish_batch: PublishBatch = contextlib.nullcontext) -> None:
        self.settings = settings
        self.publish = publish
        self.publish_batch = publish_batch
        self._plans: Lru[str, Program] = Lru(_PLAN_CACHE_SIZE)
        self._uses_secrets: Lru[str, bool] = Lru(_PLAN_CACHE_SIZE)
        self.leases = LeaseKeeper(self._renew_lease, settings.lease_ttl)
        load_tool_modules(settings.tool_modules)

    def _renew_lease(self, run_id: str, generation: int) -> bool:
        return self.journal.renew_lease(run_id=run_id, generation=generation, worker_id=self.worker_id,
                                        now=datetime.now(UTC), lease_ttl=self.settings.lease_ttl)

    @cached_property
    def journal(self) -> Journal:
        return Journal(shared_engine(self.settings.database_url))

    def uses_secrets(self, run: RunRecord) -> bool:
        """Whether the run's plan mentions `secrets` at all (then what its steps journal is scrubbed
        of secret values: pal.core.secrets); decided once per plan per process."""
        key = f"{run.kind}:{run.graph_hash or run.id}"
        found = self._uses_secrets.get(key)
        if found is None:
            found = "secrets" in json.dumps(run.graph)
            self._uses_secrets.put(key, found)
        return found

    def doorbell_signature(self, run_id: str, step_id: str, generation: int) -> str:
        """The signature a `pal.execute_node` message of PAL's carries (pal.core.doorbell)."""
        return doorbell.sign(self.journal.fence_key, run_id, step_id, generation)

    def doorbell_is_genuine(self, run_id: str, step_id: str, generation: int, signature: object) -> bool:
        return doorbell.verify(self.journal.fence_key, run_id, step_id, generation, signature)

    @property
    def worker_id(self) -> str:
        # Computed per call: a forked pool process must not report its parent's pid.
        return f"{socket.gethostname()}:{os.getpid()}"

    def program_of(self, run: RunRecord) -> Program:
        """The run's plan (its graph, or its plain-LLM spec), parsed once per process."""
        key = f"{run.kind}:{run.graph_hash or ''}"
        plan = self._plans.get(key)
        if plan is None:
            plan = program_of(run.kind, run.graph)
            self._plans.put(key, plan)
        return plan

    # ------------------------------------------------ services for nodes (pal.nodes.base.Services)

    @cached_property
    def _prices(self) -> dict[str, tuple[Decimal, Decimal]]:
        return load_prices(self.settings.prices)

    def provider(self, name: str) -> Provider:
        base_urls = {"openai": self.settings.openai_base_url,
                     "anthropic": self.settings.anthropic_base_url}
        return get_provider(name, base_urls=base_urls, timeout=self.settings.provider_timeout)

    def price(self, model: str, input_tokens: int, output_tokens: int,
              answered_model: str | None = None) -> Decimal | None:
        return cost(self._prices, model, input_tokens, output_tokens, answered_model)

    def setting(self, name: str) -> Any:
        return getattr(self.settings, name)

    def start_child(self, ctx: StepContext, document: Mapping[str, Any], child_input: Any) -> str:
        from pal.engine.runs import start_child_run

        return start_child_run(self, ctx.run_id, ctx.step_id, ctx.attempt, dict(document), child_input)
