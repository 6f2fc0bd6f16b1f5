"""`tool`: call a Python function registered with @pal.tool, with rendered keyword arguments (an
`async def` tool is awaited on the worker's event loop)."""

from __future__ import annotations

import inspect
from collections.abc import Coroutine, Mapping
from typing import Any, ClassVar

from pal.errors import ToolError
from pal.nodes.base import Field, NodeKind, Services, StepContext, run_to_end
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
        result = self._call(data, ctx)
        return run_to_end(result) if inspect.iscoroutine(result) else result

    def chainable(self, data: Mapping[str, Any], services: Services) -> bool:
        return inspect.iscoroutinefunction(get_tool(str(data["tool"])))

    def awaitable(self, data: Mapping[str, Any], ctx: StepContext) -> Coroutine[Any, Any, Any] | None:
        if not inspect.iscoroutinefunction(get_tool(str(data["tool"]))):
            return None
        effect: Coroutine[Any, Any, Any] = self._call(data, ctx)
        return effect

    def _call(self, data: Mapping[str, Any], ctx: StepContext) -> Any:
        """The tool called with its rendered arguments: its value, or an `async def` tool's coroutine."""
        function = get_tool(str(data["tool"]))
        args = ctx.render(data.get("args", {}))
        if not isinstance(args, dict):
            raise ToolError(f"args of tool {data['tool']!r} rendered to {type(args).__name__}")
        return function(**args)
