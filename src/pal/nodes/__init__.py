"""The node-kind registry: one module per kind, looked up by the graph's `type`."""

from __future__ import annotations

from pal.core.records import Usage
from pal.errors import GraphError
from pal.nodes.ai_step import AiStep
from pal.nodes.approval import Approval
from pal.nodes.base import NodeKind, NodeResult, StepContext, idempotency_key
from pal.nodes.condition import Condition
from pal.nodes.connector import Connector
from pal.nodes.email import Email
from pal.nodes.llm_turn import LlmTool, LlmTurn
from pal.nodes.loop import Loop, LoopItems
from pal.nodes.output import Output
from pal.nodes.sleep import Sleep
from pal.nodes.subagent import Subagent
from pal.nodes.tool import Tool
from pal.nodes.trigger import Trigger
from pal.nodes.wait_event import WaitEvent

KINDS: dict[str, NodeKind] = {
    kind.type_name: kind
    for kind in (Trigger(), Tool(), Condition(), Output(), AiStep(), Connector(), Email(), Approval(),
                 Subagent(), Loop(), Sleep(), WaitEvent())
}
# Steps PAL plans itself (plain-LLM turns, a loop's list): executable, not for graph authors.
INTERNAL_KINDS: dict[str, NodeKind] = {kind.type_name: kind for kind in (LlmTurn(), LlmTool(), LoopItems())}


def get_kind(type_name: str) -> NodeKind:
    try:
        return KINDS.get(type_name) or INTERNAL_KINDS[type_name]
    except KeyError:
        raise GraphError([f"unknown node type {type_name!r}"]) from None


__all__ = ["INTERNAL_KINDS", "KINDS", "NodeKind", "NodeResult", "StepContext", "Usage", "get_kind",
           "idempotency_key"]
