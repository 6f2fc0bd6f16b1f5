"""The tool registry: `@pal.tool` registers a Python callable that `tool` nodes call by name."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, overload

from pal.errors import ToolError

ToolFunction = Callable[..., Any]
F = TypeVar("F", bound=ToolFunction)

_registry: dict[str, ToolFunction] = {}
_loaded_modules: set[str] = set()


@overload
def tool(function: F, /) -> F: ...
@overload
def tool(*, name: str | None = None) -> Callable[[F], F]: ...


def tool(function: F | None = None, /, *, name: str | None = None) -> F | Callable[[F], F]:
    """Register `function` as a tool, under its own name or `name`.

    A tool receives the node's rendered `args` as keyword arguments and returns a JSON value.
    It must tolerate being called again for the same step after a crash (see docs/guarantees).
    """

    def register(fn: F) -> F:
        tool_name = name or fn.__name__
        existing = _registry.get(tool_name)
        if existing is not None and existing is not fn and _qualname(existing) != _qualname(fn):
            raise ToolError(f"tool {tool_name!r} is already registered by {_qualname(existing)}")
        _registry[tool_name] = fn
        return fn

    return register(function) if function is not None else register


def _qualname(fn: ToolFunction) -> str:
    return f"{fn.__module__}.{getattr(fn, '__qualname__', fn)}"


def get_tool(name: str) -> ToolFunction:
    try:
        return _registry[name]
    except KeyError:
        known = ", ".join(sorted(_registry)) or "none"
        raise ToolError(f"unknown tool {name!r} (registered: {known})") from None


def registered_tools() -> frozenset[str]:
    return frozenset(_registry)


def load_tool_modules(modules: Iterable[str]) -> None:
    """Import each module so that its @pal.tool decorators run (PAL_TOOL_MODULES). A module found
    neither installed nor on PYTHONPATH is looked for in the current folder too, as `celery -A`
    does, so `PAL_TOOL_MODULES=myapp.tools pal worker` works from the folder holding `myapp/`."""
    for module in modules:
        if module in _loaded_modules:
            continue
        try:
            _import_here_too(module)
        except ImportError as exc:
            raise ToolError(f"cannot import tool module {module!r}: {exc}") from exc
        _loaded_modules.add(module)


def _import_here_too(module: str) -> None:
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        here = os.getcwd()
        if exc.name != module.split(".")[0] or here in sys.path or "" in sys.path:
            raise
        sys.path.append(here)  # after every installed package: the folder never shadows one
        importlib.import_module(module)


_JSON_TYPES = {"str": "string", "int": "integer", "float": "number", "bool": "boolean",
               "list": "array", "dict": "object"}


def describe_tool(name: str) -> dict[str, Any]:
    """{name, description, parameters}: a JSON-schema description of a registered tool, read
    from its signature and docstring, for models that call tools."""
    import inspect

    function = get_tool(name)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in inspect.signature(function).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        annotation = param.annotation
        type_name = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
        json_type = _JSON_TYPES.get(str(type_name).split("[")[0])
        properties[param.name] = {"type": json_type} if json_type else {}
        if param.default is param.empty:
            required.append(param.name)
    description = (inspect.getdoc(function) or f"the {name} tool").split("\n\n")[0]
    return {"name": name, "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required}}
