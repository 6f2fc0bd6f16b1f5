"""What every node kind provides: a data contract checked at validation, and an effect."""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pal import templates


def idempotency_key(run_id: str, step_id: str, attempt: int) -> str:
    """sha256("runID|stepID|attempt"), the key every external effect of a step carries."""
    return hashlib.sha256(f"{run_id}|{step_id}|{attempt}".encode()).hexdigest()


@dataclass(frozen=True)
class StepContext:
    """What a node sees when it runs: its run's input and the outputs of completed steps."""

    run_id: str
    step_id: str
    attempt: int
    input: Any
    outputs: Mapping[str, Any] = field(default_factory=dict)

    @property
    def idempotency_key(self) -> str:
        return idempotency_key(self.run_id, self.step_id, self.attempt)

    def template_context(self) -> dict[str, Any]:
        return {
            "input": self.input,
            "nodes": {step: {"output": out} for step, out in self.outputs.items()},
            "run": {"id": self.run_id},
        }

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


class NodeKind(ABC):
    """A node type. One module per kind in pal/nodes/, registered in pal.nodes.KINDS."""

    type_name: ClassVar[str]
    fields: ClassVar[Mapping[str, Field]] = {}
    branches: ClassVar[tuple[str, ...]] = ()  # outgoing edges pick one by sourceHandle
    allows_cycles: ClassVar[bool] = False  # only loop nodes may close a cycle

    def validate(self, data: Mapping[str, Any], known_tools: frozenset[str] | None) -> list[str]:
        """Problems with `data`, one sentence each; empty when valid."""
        problems: list[str] = []
        for key in data:
            if key not in self.fields:
                allowed = ", ".join(sorted(self.fields)) or "none"
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


def _is_instance(value: Any, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool) and bool not in types:
        return False  # True is an int to Python, not to a graph author
    return isinstance(value, types)
