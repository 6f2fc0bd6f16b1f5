"""`tool`: call a Python function registered with @pal.tool, with rendered keyword arguments."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from pal.errors import ToolError
from pal.nodes.base import Field, NodeKind, StepContext
from pal.tools import get_tool


class Tool(NodeKind):
    type_name = "tool"
    gateable: ClassVar[bool] = True  # the confidence gate may stand before its effect
    fields: ClassVar[Mapping[str, Field]] = {
        "tool": Field((str,), required=True, templated=False),
        "args": Field((dict,)),
        "label": Field((str,), templated=False),
    }

    def validate(self, data: Mapping[str, Any], known_tools: frozenset[str] | None) -> list[str]:
        problems = super().validate(data, known_tools)
        name = data.get("tool")
        if known_tools is not None and isinstance(name, str) and name not in known_tools:
            known = ", ".join(sorted(known_tools)) or "none"
            problems.append(f"unknown tool {name!r} (registered: {known}; see PAL_TOOL_MODULES)")
        return problems

    def execute(self, data: Mapping[str, Any], ctx: StepContext) -> Any:
        function = get_tool(str(data["tool"]))
        args = ctx.render(data.get("args", {}))
        if not isinstance(args, dict):
            raise ToolError(f"args of tool {data['tool']!r} rendered to {type(args).__name__}")
        return function(**args)
