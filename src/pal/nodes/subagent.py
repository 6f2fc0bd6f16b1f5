"""`subagent`: run another graph (or a plain-LLM spec) as a child run and wait for its result.

The child's id is derived from (parent run, step, attempt), so a re-driven parent finds the child
it already started and never spawns a second one. The parent parks with no worker held; the child's
terminal event wakes it, and the child's output (or failure, code `child_run_failed`) becomes the
step's result. A child that stops on an approval keeps the parent waiting and its approval is
listed from the parent; `onChildApproval: "fail"` instead fails the step with code
`child_run_paused` (ErrChildRunPaused in docs/specification.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pal.nodes.base import ANY, Field, NodeKind, Park, StepContext

CHILD_APPROVAL_MODES = ("wait", "fail")


class Subagent(NodeKind):
    type_name = "subagent"
    fields: ClassVar[Mapping[str, Field]] = {
        "graph": Field((dict,), required=True, templated=False),
        "input": Field(ANY),
        "onChildApproval": Field((str,), templated=False),
        "label": Field((str,), templated=False),
    }
    embedded_plans = ("graph",)  # validated by the planner (pal.plan.programs)
    opaque_fields = ("graph",)

    def validate(self, data: Mapping[str, Any], known_tools: frozenset[str] | None) -> list[str]:
        problems = super().validate(data, known_tools)
        mode = data.get("onChildApproval", "wait")
        if mode not in CHILD_APPROVAL_MODES:
            problems.append(f"onChildApproval must be one of {', '.join(CHILD_APPROVAL_MODES)}, not {mode!r}")
        return problems

    def execute(self, data: Mapping[str, Any], ctx: StepContext) -> Any:
        child_input = ctx.render(data["input"]) if "input" in data else ctx.input
        child_id = ctx.need_services().start_child(ctx, data["graph"], child_input)
        return Park({"kind": "subagent", "child_run_id": child_id}, None)
