"""`condition`: evaluate a template and follow the edge whose sourceHandle is "true" or "false"."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pal.nodes.base import Field, NodeKind, StepContext


class Condition(NodeKind):
    type_name = "condition"
    instant: ClassVar[bool] = True
    fields: ClassVar[Mapping[str, Field]] = {
        "expression": Field((str, bool), required=True),
        "label": Field((str,), templated=False),
    }
    branches: ClassVar[tuple[str, ...]] = ("true", "false")

    def execute(self, data: Mapping[str, Any], ctx: StepContext) -> Any:
        value = ctx.render(data["expression"])
        if isinstance(value, str):
            # A rendered text such as "False" or "0" means false, as a reader would expect.
            result = value.strip().lower() not in ("", "false", "0", "no", "none", "null")
        else:
            result = bool(value)
        return {"result": result, "branch": "true" if result else "false"}
