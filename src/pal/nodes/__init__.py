"""The node-kind registry: one module per kind, looked up by the graph's `type`."""

from __future__ import annotations

from pal.errors import GraphError
from pal.nodes.base import NodeKind, StepContext, idempotency_key
from pal.nodes.condition import Condition
from pal.nodes.output import Output
from pal.nodes.tool import Tool
from pal.nodes.trigger import Trigger

KINDS: dict[str, NodeKind] = {kind.type_name: kind for kind in (Trigger(), Tool(), Condition(), Output())}


def get_kind(type_name: str) -> NodeKind:
    try:
        return KINDS[type_name]
    except KeyError:
        raise GraphError([f"unknown node type {type_name!r}"]) from None


__all__ = ["KINDS", "NodeKind", "StepContext", "get_kind", "idempotency_key"]
