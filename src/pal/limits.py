"""Limits on the shape of what PAL accepts and stores, checked without recursion.

Byte sizes alone do not bound the work: a 200 kB document of nested brackets makes Python's JSON
codec, and every recursive walk after it, raise RecursionError. Depth is checked first, with an
explicit stack, so such a document is refused with a clear message before anything else sees it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def json_depth(value: Any, stop_after: int) -> int:
    """How deeply lists and objects nest in `value` (a scalar is 0); stops counting past `stop_after`."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        deepest = max(deepest, depth + 1)
        if deepest > stop_after:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest


def depth_problem(value: Any, limit: int, what: str) -> str | None:
    """A message when `value` nests deeper than `limit`, else None."""
    if json_depth(value, limit) > limit:
        return f"{what} nests lists and objects more than {limit} levels deep (PAL_MAX_JSON_DEPTH)"
    return None
