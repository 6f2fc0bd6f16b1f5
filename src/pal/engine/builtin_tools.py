"""Tools every PAL process knows: small, side-effect free, useful in tests and benchmarks."""

from __future__ import annotations

from typing import Any

from pal.tools import tool


@tool(name="noop")
def noop(**_: Any) -> None:
    """Do nothing; the benchmark's unit of work."""


@tool(name="echo")
def echo(**kwargs: Any) -> dict[str, Any]:
    """Return the arguments it was given."""
    return kwargs
