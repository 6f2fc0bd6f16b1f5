"""`trigger`: where every run starts; its output is the run input."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pal.nodes.base import Field, NodeKind, StepContext


class Trigger(NodeKind):
    type_name = "trigger"
    instant: ClassVar[bool] = True
    fields: ClassVar[Mapping[str, Field]] = {"label": Field((str,), templated=False)}

    def execute(self, data: Mapping[str, Any], ctx: StepContext) -> Any:
        return ctx.input
