"""`loop`: run a body (one node or a sub-graph) once per item of a list, durably.

    {"id": "each", "type": "loop",
     "data": {"items": "{{ input.tickets }}", "maxIterations": 50,
              "body": {"id": "draft", "type": "ai-step", "data": {"prompt": "Answer {{ loop.item }}"}}}}

The loop's steps are `each[items]` (the list, rendered once and journaled), then the body's steps of
iteration i, `each[i].draft` (iterations run one after another, i from 0), then `each` itself, whose
output is the list of the iterations' outputs. Every one is an ordinary journaled step, so a crash in
iteration 7 replays iterations 0 to 6 from the journal. Without `items` the body runs
`maxIterations` times with `loop.item` = the index. Body templates see `loop.item`, `loop.index`,
`loop.count`, the body's own nodes of this iteration, and the nodes before the loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pal.errors import StepError
from pal.nodes.base import Field, NodeKind, StepContext

MAX_ITERATIONS = 1000  # the hard cap; a node may set less with maxIterations


class LoopTooLong(StepError):
    """The loop's list is longer than its maxIterations."""

    code = "loop_too_long"


class Loop(NodeKind):
    type_name = "loop"
    fields: ClassVar[Mapping[str, Field]] = {
        "items": Field((list,)),
        "maxIterations": Field((int,), templated=False),
        "body": Field((dict,), required=True, templated=False),
        "label": Field((str,), templated=False),
    }
    opaque_fields = ("body",)

    def validate(self, data: Mapping[str, Any], known_tools: frozenset[str] | None) -> list[str]:
        problems = super().validate(data, known_tools)
        limit = data.get("maxIterations")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                                  or not 1 <= limit <= MAX_ITERATIONS):
            problems.append(f"maxIterations must be a whole number from 1 to {MAX_ITERATIONS}, not {limit!r}")
        if "items" not in data and limit is None:
            problems.append("a loop needs 'items' (a list or a template) or 'maxIterations'")
        return problems

    def execute(self, data: Mapping[str, Any], ctx: StepContext) -> Any:
        """The loop's last step: collect the iterations' outputs."""
        return list((ctx.loop or {}).get("results", []))


class LoopItems(NodeKind):
    """The loop's first step: render the list once, so every replay iterates over the same items."""

    type_name = "loop-items"

    def execute(self, data: Mapping[str, Any], ctx: StepContext) -> Any:
        limit = int(data.get("maxIterations") or MAX_ITERATIONS)
        if "items" not in data:
            return {"items": list(range(limit))}
        items = ctx.render(data["items"])
        if not isinstance(items, list):
            raise StepError(f"loop items rendered to {type(items).__name__}, not a list")
        if len(items) > limit:
            raise LoopTooLong(f"loop has {len(items)} items, over its maxIterations of {limit}")
        return {"items": items}
