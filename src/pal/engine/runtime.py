"""What a PAL process needs to run steps: settings, the journal, parsed plans, a publisher, the
lease heartbeat and model prices (nodes reach these through pal.engine.services)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from decimal import Decimal
from functools import cached_property
from typing import Any, Protocol

from pal.config import Settings
from pal.core import doorbell, faults, secrets
from pal.core.anomalies import AnomalyLimits, with_overrides
from pal.core.budgets import Budget, parse_budget
from pal.core.clock import utcnow
from pal.core.extras import missing_extra
from pal.core.lru import Lru
from pal.core.records import ClaimAhead, Fence, RunRecord
from pal.engine import builtin_tools  # noqa: F401  (registers the built-in tools)
from pal.engine.async_steps import AsyncSteps
from pal.engine.control import ControlPlane
from pal.engine.heartbeat import LeaseKeeper
from pal.engine.tracing import Tracing, configured
from pal.errors import GraphError, PalError
from pal.plan.documents import check_depth
from pal.plan.interpreter import Program
from pal.plan.programs import Plan, parse_plan, program_of
from pal.providers.pricing import load_prices
from pal.storage.database import shared_engine
from pal.storage.journal import Journal
from pal.tools import load_tool_modules, registered_tools

log = logging.getLogger(__name__)


class Publish(Protocol):
    def __call__(self, run_id: str, step_id: str, generation: int, *, countdown: float = 0.0,
                 prepared: object = None) -> None:
        """Ring the doorbell for one step, now or `countdown` seconds from now (`prepared`: the
        doorbell its publisher prepared ahead, if it did: PrepareDoorbell)."""


PrepareDoorbell = Callable[[str, str, int, bool], object]
"""prepare(run_id, step_id, generation, own): a doorbell prepared ahead of its ring, opaque to the
engine, passed to the ring as `prepared` (None when it cannot be prepared now); `own`: prepared as
the doorbell its worker will most likely answer itself next (RunsNext.ring_own). It belongs to the
publish it came with (`Runtime.use_publisher`)."""


class RunsNext(Protocol):
    """The worker running this step runs one message of its hand-off next, itself (a solo worker's
    chain of steps, pal.workers.inline): the completion may claim a lone successor for it. Passed
    to `execute_step` by that worker, never found on the runtime."""

    def may_claim(self) -> bool:
        """Whether the completion may claim a lone successor for this worker (it will take it back)."""

    def ring(self, run_id: str, step_id: str, generation: int, prepared: object = None) -> None:
        """Ring a successor's doorbell, as `Runtime.publish` does (the worker may take the queue's
        oldest message with it, to run next)."""

    def ring_own(self, run_id: str, step_id: str, generation: int, prepared: object = None,
                 ahead: ClaimAhead | None = None) -> bool:
        """Ring the doorbell of the successor the completion claimed (`ahead`) and keep that very
        message, for this worker to run next with its claim; False when it went to the queue
        instead (any worker may take it, finds the step started, and the sweep re-drives it)."""


PublishBatch = Callable[[], AbstractContextManager[Publish]]
"""publish_batch(): a publish whose messages may be held and sent together when the block ends (one
broker round trip for a sweep's messages); an exception out of the block may drop them."""


_PLAN_CACHE_SIZE = 256
_BASELINE_CACHE_SECONDS = 60.0  # baselines change with the beat task's pass, every few minutes


@dataclass(frozen=True)
class WatchPlan:
    budget: Budget | None  # None: no limit set (a budget of only onBreach checks nothing)
    limits: AnomalyLimits


def worker_id_of(pid: int) -> str:
    """The worker id a process of this host holds leases as (`Runtime.worker_id`)."""
    return f"{socket.gethostname()}:{pid}"


class Runtime:
    def __init__(self, settings: Settings, publish: Publish,
                 publish_batch: PublishBatch | None = None,
                 prepare_doorbell: PrepareDoorbell | None = None) -> None:
        self.settings = settings
        self.use_publisher(publish, publish_batch, prepare_doorbell)
        self.publish_vm: Callable[[str], None] = _no_vm_queue  # the VM queue's spawn (pal.engine.vms)
        self.leases = LeaseKeeper(self._renew_lease, settings.lease_ttl)
        # Awaitable effects run on an event loop: a worker's (pal.workers.pal_app); elsewhere in the thread.
        self.async_steps: AsyncSteps | None = None
        self._plans: Lru[str, Program] = Lru(_PLAN_CACHE_SIZE)
        self._valid_plans: Lru[tuple[str, frozenset[str]], Plan] = Lru(_PLAN_CACHE_SIZE)
        self._uses_secrets: Lru[str, bool] = Lru(_PLAN_CACHE_SIZE)
        self._watch_plans: Lru[str, WatchPlan] = Lru(_PLAN_CACHE_SIZE)
        self._baselines: Lru[tuple[str, str], tuple[float, dict[tuple[str, str], list[float]]]] = Lru(
            _PLAN_CACHE_SIZE)
        load_tool_modules(settings.tool_modules)

    def _renew_lease(self, run_id: str, generation: int) -> bool:
        return self.journal.steps.renew_lease(self.fence(run_id, generation))

    @cached_property
    def journal(self) -> Journal:
        return Journal(shared_engine(self.settings.database_url, self.settings.db_pool_size),
                       program_of=program_of)

    def release_connections(self) -> None:
        """Close the journal's pooled connections, if it was ever opened (it reconnects on demand)."""
        if "journal" in self.__dict__:
            self.journal.engine.dispose()

    @cached_property
    def control(self) -> ControlPlane:
        """What the API, the CLI and pal.Client read and manage (never the journal itself)."""
        return ControlPlane(self.journal)

    def uses_secrets(self, run: RunRecord) -> bool:
        """Whether the run's plan mentions `secrets` at all, or it is a child run its parent handed
        secrets to (then what its steps journal is scrubbed of secret values: pal.core.secrets); the
        plan's part is decided once per plan per process."""
        key = f"{run.kind}:{run.graph_hash or run.id}"
        found = self._uses_secrets.get(key)
        if found is None:
            found = "secrets" in json.dumps(run.graph)
            self._uses_secrets.put(key, found)
        return found or (run.parent_run_id is not None and secrets.holds_placeholder(run.input))

    def doorbell_signature(self, run_id: str, step_id: str, generation: int) -> str:
        """The signature a `pal.execute_node` message of PAL's carries (pal.core.doorbell)."""
        return doorbell.sign(self.journal.tokens.fence_key, run_id, step_id, generation)

    def doorbell_is_genuine(self, run_id: str, step_id: str, generation: int, signature: object) -> bool:
        return doorbell.verify(self.journal.tokens.fence_key, run_id, step_id, generation, signature)

    def fence(self, run_id: str, generation: int) -> Fence:
        """This process's fence for a write of `generation` now (the lease runs PAL_LEASE_TTL on)."""
        return Fence(run_id, generation, self.worker_id, utcnow(), self.settings.lease_ttl)

    def use_publisher(self, publish: Publish, publish_batch: PublishBatch | None = None,
                      prepare_doorbell: PrepareDoorbell | None = None) -> None:
        """How this runtime rings doorbells: one at a time, in a batch (else one at a time), and
        (PAL's own publisher) how it prepares a doorbell ahead of its ring, which only that publish
        can ring."""
        self._publish, self.prepare_doorbell = publish, prepare_doorbell
        self.publish_batch: PublishBatch = publish_batch or (lambda: contextlib.nullcontext(publish))

    @property
    def publish(self) -> Publish:
        return self._publish

    @publish.setter
    def publish(self, publish: Publish) -> None:
        """Another publish (a test's outbox) prepares and batches nothing: those were its predecessor's."""
        self.use_publisher(publish)

    def prepare_hand_off(self, run_id: str, successors: Sequence[str], generation: int,
                         own: bool = False) -> dict[str, object]:
        """The successors' doorbells, prepared while the completion that must commit before they are
        sent is on its way to the journal (pal.engine.steps): the worker's work overlaps the
        journal's. Empty unless the publish prepares doorbells ahead (`prepare_doorbell`). `own`: the
        completion claims a lone successor for its worker, which will run its message itself
        (RunsNext)."""
        prepare = self.prepare_doorbell
        if prepare is None:
            return {}
        own = own and len(successors) == 1
        made = ((successor, prepare(run_id, successor, generation, own)) for successor in successors)
        return {successor: doorbell for successor, doorbell in made if doorbell is not None}

    def hand_off(self, run_id: str, step_id: str, successors: Sequence[str], generation: int,
                 ahead: ClaimAhead | None = None, prepared: Mapping[str, object] | None = None,
                 kept: bool = False, runs_next: RunsNext | None = None) -> None:
        """Ring the successors of a completed step, only after its completion has committed: a
        crash before (the fault points) leaves a lease that lapses, and the sweep re-drives them.
        `ahead`: the claim of the successor whose attempt the completion started for this worker,
        which `runs_next` takes back to run next, the claim with it. `prepared`: doorbells
        `prepare_hand_off` made. `kept`: this thread runs that successor next with no message at all
        (a finisher's chain, pal.engine.async_steps)."""
        faults.point("after_complete_commit", step_id, run_id)
        for successor in successors:
            faults.point("before_publish", step_id, run_id)
            doorbell = prepared.get(successor) if prepared else None
            claimed = ahead is not None and successor == ahead.step_id
            if claimed and kept:
                continue
            if runs_next is None and doorbell is not None:
                self.publish(run_id, successor, generation, prepared=doorbell)
            elif runs_next is None:
                self.publish(run_id, successor, generation)
            elif claimed:
                # Not taken back, it goes to the queue and its claim ahead is dropped with it: the
                # worker that takes it finds the step started, and the sweep re-drives it.
                runs_next.ring_own(run_id, successor, generation, prepared=doorbell, ahead=ahead)
            else:
                runs_next.ring(run_id, successor, generation, prepared=doorbell)

    @property
    def worker_id(self) -> str:
        # Computed per call: a forked pool process must not report its parent's pid.
        return worker_id_of(os.getpid())

    def program_of(self, run: RunRecord) -> Program:
        """The run's plan (its graph, or its plain-LLM spec), parsed once per process."""
        key = f"{run.kind}:{run.graph_hash or ''}"
        plan = self._plans.get(key)
        if plan is None:
            plan = program_of(run.kind, run.graph)
            self._plans.put(key, plan)
        return plan

    def validated_plan(self, document: Any) -> Plan:
        """A new run's plan, validated (parse_plan: GraphError lists every problem); remembered
        by the document's exact JSON text and the tools registered, so a service that starts the
        same graph many times validates it once per process."""
        settings, tools = self.settings, registered_tools()
        key: str | None = document if isinstance(document, str) else None
        if isinstance(document, dict):
            try:  # within the depth limit first: a deeper document is refused by parse_plan
                check_depth(document, settings.max_json_depth)
                key = json.dumps(document, sort_keys=True, allow_nan=False)
            except (GraphError, TypeError, ValueError):
                key = None
        if key is not None and len(key) > settings.max_graph_bytes:
            key = None  # refused by parse_plan, never kept
        plan = self._valid_plans.get((key, tools)) if key is not None else None
        if plan is None:
            plan = parse_plan(document, known_tools=tools, max_bytes=settings.max_graph_bytes,
                              max_depth=settings.max_json_depth)
            if key is not None:
                self._valid_plans.put((key, tools), plan)
        return plan

    def watch_plan(self, run: RunRecord) -> WatchPlan:
        """What a claim of the run checks (docs/anomalies.md): its budget (its plan's `limits`
        under the run's own), the anomaly thresholds (PAL_ANOMALY_* under the plan's `anomalies`),
        kept once per plan, a run with its own limits apart."""
        if run.limits is not None:
            return self._watch_plan_of(run)
        key = f"{run.kind}:{run.graph_hash or run.id}"
        found = self._watch_plans.get(key)
        if found is None:
            found = self._watch_plan_of(run)
            self._watch_plans.put(key, found)
        return found

    def _watch_plan_of(self, run: RunRecord) -> WatchPlan:
        budget = parse_budget(_block(run.graph, "limits"), run.limits)
        limits = with_overrides(self.settings.anomaly_limits, _block(run.graph, "anomalies"))
        return WatchPlan(None if budget.empty else budget, limits)

    def baselines(self, tenant_id: str, graph_hash: str) -> dict[tuple[str, str], list[float]]:
        """The per-node baselines of one tenant's graph, read at most once a minute per process."""
        key = (tenant_id, graph_hash)
        cached = self._baselines.get(key)
        now = time.monotonic()
        if cached is None or now - cached[0] > _BASELINE_CACHE_SECONDS:
            cached = (now, self.journal.baselines.baselines(tenant_id, graph_hash))
            self._baselines.put(key, cached)
        return cached[1]

    @cached_property
    def tracing(self) -> Tracing | None:
        """This process's tracer when the OTEL_* variables configure one (docs/observability.md),
        made on first use: in a prefork child, after the fork. Without the SDK (pal[otel]) traces
        stay off, with one warning: a missing exporter never fails a run."""
        if not configured():
            return None
        try:
            return Tracing(salt=os.environ.get("PAL_TRACE_SALT", ""))
        except ModuleNotFoundError as exc:
            missing = missing_extra(exc, "tracing (OTEL_EXPORTER_OTLP_ENDPOINT is set)")
            if missing is None:
                raise
            log.warning("%s; traces are off", missing)
            return None

    @cached_property
    def prices(self) -> dict[str, tuple[Decimal, Decimal]]:
        """Model prices (PAL_PRICES over the built-in table), read once per process."""
        return load_prices(self.settings.prices)


def _block(document: Any, name: str) -> Mapping[str, Any] | None:
    """A top-level block of a stored plan document (validated when the run started)."""
    block = document.get(name) if isinstance(document, Mapping) else None
    return block if isinstance(block, Mapping) else None


def _no_vm_queue(vm_id: str) -> None:
    raise PalError(f"this process cannot spawn VM {vm_id}: it has no Celery app (the VM queue)")
