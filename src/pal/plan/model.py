"""The parts of a graph: nodes and edges as the planner and the interpreter see them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pal.nodes import NodeKind, get_kind


@dataclass(frozen=True)
class Node:
    id: str
    type: str
    data: Mapping[str, Any]

    @property
    def kind(self) -> NodeKind:
        return get_kind(self.type)


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    source_handle: str | None = None

    def describe(self) -> str:
        handle = f" [{self.source_handle}]" if self.source_handle else ""
        return f"edge {self.source}{handle} -> {self.target}"
