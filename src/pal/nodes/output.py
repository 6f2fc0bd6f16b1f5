"""`output`: render `value`; the run's output is what its output node produced."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pal.nodes.base import ANY, Field, NodeKind, StepContext


class Output(NodeKind):
    type_name = "output"
    instant: ClassVar[bool] = True
    fields: ClassVar[Mapping[str, Field]] = {"value": Field(ANY), "label": Field((str,), templated=False)}

    def execute(self, data: Mapping[str, Any], ctx: StepContext) -> Any:
        return ctx.render(data.get("value"))
