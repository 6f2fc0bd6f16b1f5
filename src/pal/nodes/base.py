"""What every node kind provides: a data contract checked at validation, and an effect."""

from __future__ import annotations

import asyncio
import hashlib
from abc import ABC, abstractmethod
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

from pal.core import retry, templates
from pal.core.confidence import confidence_problems
from pal.core.durations import parse_go_duration
from pal.core.records import Receipt, Usage
from pal.core.views import AsNodeOutputs

if TYPE_CHECKING:
    from pal.providers import Provider

T = TypeVar("T")


def idempotency_key(run_id: str, step_id: str, attempt: int) -> str:
    """sha256("runID|stepID|attempt"), the key every external effect of a step carries."""
    return hashlib.sha256(f"{run_id}|{step_id}|{attempt}".encode()).hexdigest()



@dataclass(frozen=True)
class NodeResult:
    """A node's output together with what it cost (a plain return value costs nothing)."""

    output: Any
    usage: Usage = field(default_factory=Usage)


@dataclass(frozen=True)
class Park:
    """Returned by a node that waits (approval, subagent, sleep): journal `step_waiting {payload}`
    and park the run, with no lease and no worker held, until a decision, a child's end or its time
    wakes it. `wake_at` asks the sweep to look again then (an approval's expiry, a timer's due time);
    `event` (kind, payload) is journaled with the wait (a sleep's `timer_set`)."""

    payload: Mapping[str, Any]
    wake_at: datetime | None = None
    event: tuple[str, Mapping[str, Any]] | None = None



class ReceiptBook(Protocol):
    """Claims and confirmations of this step attempt's external delivery (one per attempt)."""

    def claim(self, effect_kind: str, target: str) -> Receipt: ...

    def settle(self, status: str, response: Any) -> None: ...

    def in_doubt(self, detail: Mapping[str, Any]) -> None: ...


class Services(Protocol):
    """What effectful nodes may use, provided by the runtime (so nodes never touch storage)."""

    def provider(self, name: str) -> Provider: ...

    def price(self, model: str, input_tokens: int, output_tokens: int,
              answered_model: str | None = None) -> Decimal | None:
        """Dollars for a call to `model` (or, failing that, the `answered_model` snapshot)."""
        ...

    def setting(self, name: str) -> Any: ...

    def start_child(self, ctx: StepContext, document: Mapping[str, Any], child_input: Any) -> str:
        """Start (or find) the child run of this step attempt; returns its id."""
        ...


@dataclass(frozen=True)
class StepContext:
    """What a node sees when it runs: its run's input and the outputs of completed steps."""

    run_id: str
    step_id: str
    attempt: int
    input: Any
    outputs: Mapping[str, Any] = field(default_factory=dict)
    services: Services | None = None
    receipts: ReceiptBook | None = None
    started_at: datetime | None = None  # when the step was claimed: the node's "now"
    loop: Mapping[str, Any] | None = None  # inside a loop body: {"item", "index"}

    def now(self) -> datetime:
        return self.started_at or datetime.now(UTC)

    def need_services(self) -> Services:
        if self.services is None:
            raise RuntimeError("this node needs runtime services; run it through the step protocol")
        return self.services

    def need_receipts(self) -> ReceiptBook:
        if self.receipts is None:
            raise RuntimeError("this node delivers; run it through the step protocol")
        return self.receipts

    @property
    def idempotency_key(self) -> str:
        return idempotency_key(self.run_id, self.step_id, self.attempt)

    def template_context(self) -> dict[str, Any]:
        context: dict[str, Any] = {
            "input": self.input,
            "nodes": AsNodeOutputs(self.outputs),
            "run": {"id": self.run_id},
        }
        if self.loop is not None:
            context["loop"] = dict(self.loop)
        return context

    def render(self, value: Any) -> Any:
        return templates.render(value, self.template_context())


@dataclass(frozen=True)
class Field:
    """One key of a node's `data`: the JSON types it accepts and whether it must be there."""

    types: tuple[type, ...]
    required: bool = False
    templated: bool = True  # a template string is accepted in place of any type

    def describe(self) -> str:
        names = {str: "string", dict: "object", list: "array", bool: "boolean", int: "integer",
                 float: "number", type(None): "null"}
        return " or ".join(names.get(t, t.__name__) for t in self.types)


ANY = (str, dict, list, bool, int, float, type(None))
COMMON_FIELDS = ("retry", "timeoutMs")  # every node kind accepts these (pal.core.retry, time limit)
MAX_TIMEOUT_MS = 86_400_000  # a day: the longest time limit a node may ask for


class NodeKind(ABC):
    """A node type. One module per kind in pal/nodes/, registered in pal.nodes.KINDS."""

    type_name: ClassVar[str]
    fields: ClassVar[Mapping[str, Field]] = {}
    branches: ClassVar[tuple[str, ...]] = ()  # outgoing edges pick one by sourceHandle
    allows_cycles: ClassVar[bool] = False  # only loop nodes may close a cycle
    embedded_plans: ClassVar[tuple[str, ...]] = ()  # fields holding a whole plan (subagent: graph)
    opaque_fields: ClassVar[tuple[str, ...]] = ()  # hold an embedded plan, validated on its own
    gateable: ClassVar[bool] = False  # may carry a `confidence` block (pal.core.confidence)
    instant: ClassVar[bool] = False  # its effect computes on the run's data alone: no I/O, no wait

    def validate(self, data: Mapping[str, Any], known_tools: frozenset[str] | None) -> list[str]:
        """Problems with `data`, one sentence each; empty when valid."""
        problems: list[str] = []
        if "retry" in data:
            problems.extend(retry.policy_problems(data["retry"]))
        timeout = data.get("timeoutMs", 1)
        if isinstance(timeout, bool) or not isinstance(timeout, int) or not 1 <= timeout <= MAX_TIMEOUT_MS:
            problems.append(f"timeoutMs must be a whole number of milliseconds from 1 to {MAX_TIMEOUT_MS}, "
                            f"not {timeout!r}")
        if "confidence" in data and self.gateable:
            problems.extend(confidence_problems(data["confidence"]))
        for key in data:
            if key in COMMON_FIELDS or (key == "confidence" and self.gateable):
                continue
            if key not in self.fields:
                gate = ("confidence",) if self.gateable else ()
                allowed = ", ".join(sorted({*self.fields, *COMMON_FIELDS, *gate}))
                problems.append(f"unknown data field {key!r} (allowed: {allowed})")
        for key, spec in self.fields.items():
            if key not in data:
                if spec.required:
                    problems.append(f"data field {key!r} is required ({spec.describe()})")
                continue
            value = data[key]
            is_template = isinstance(value, str) and templates.has_template(value)
            if not (spec.templated and is_template) and not _is_instance(value, spec.types):
                problems.append(
                    f"data field {key!r} must be {spec.describe()}, not {type(value).__name__}"
                )
        return problems

    @abstractmethod
    def execute(self, data: Mapping[str, Any], ctx: StepContext) -> Any:
        """Run the node's effect and return its JSON output."""

    def chainable(self, data: Mapping[str, Any], services: Services) -> bool:
        """Whether a step of this node may run on the thread that journals its predecessor's
        awaited effect, straight after that completion: it is instant, or its effect is awaited
        (pal.engine.async_steps). A step that may block runs from its own message instead."""
        return self.instant

    def awaitable(self, data: Mapping[str, Any], ctx: StepContext) -> Coroutine[Any, Any, Any] | None:
        """The node's effect as a coroutine, when it has one (an `async def` tool, a provider's
        async client): a worker awaits it on its event loop, holding no thread while it waits.
        None: the effect is `execute`, run in the worker's thread."""
        return None


def expiry_problems(data: Mapping[str, Any]) -> list[str]:
    """What is wrong with a waiting node's `expiresIn` (a positive duration), if it has one."""
    expires = data.get("expiresIn")
    if not isinstance(expires, str):
        return []
    try:
        return [f"expiresIn {expires!r} must be positive"] if parse_go_duration(expires) <= 0 else []
    except ValueError:
        return [f"expiresIn {expires!r} is not a duration (examples: 30m, 2h, 90s)"]


def expiry(data: Mapping[str, Any], now: datetime) -> datetime | None:
    """When a waiting node's wait expires (`expiresIn` after `now`), if it does."""
    expires = data.get("expiresIn")
    return now + timedelta(seconds=parse_go_duration(str(expires))) if expires else None


def run_to_end(effect: Coroutine[Any, Any, T]) -> T:
    """An awaitable effect run where no event loop serves it (a step run in a thread of its own):
    on a loop of its own, in this thread."""
    return asyncio.run(effect)


def _is_instance(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool) and bool not in types:
        return False  # True is an int to Python, not to a graph author
    return isinstance(value, types)
