"""Template references between nodes: `{{ nodes.X... }}` must name a node that runs before the one
that uses it. Checked when a graph (or a loop body) is parsed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jinja2
from jinja2 import nodes as jnodes

from pal.core import templates
from pal.nodes import NodeKind
from pal.plan.model import Edge, Node


def template_strings(kind: NodeKind, data: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(path, text) of every string in a node's data that is rendered in this graph's context;
    fields holding an embedded plan (a subagent's graph, a loop's body) are checked by their own."""
    return [(path, text) for key, value in data.items() if key not in kind.opaque_fields
            for path, text in templates.iter_strings(value, str(key))]


def descendants(start: str, edges: list[Edge]) -> set[str]:
    successors: dict[str, list[str]] = {}
    for edge in edges:
        successors.setdefault(edge.source, []).append(edge.target)
    seen: set[str] = set()
    stack = [start]
    while stack:
        for nxt in successors.get(stack.pop(), []):
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


def check_references(
    nodes: Mapping[str, Node], edges: list[Edge], problems: list[str],
    outer: frozenset[str] = frozenset(), outer_all: frozenset[str] = frozenset(),
) -> None:
    """`{{ nodes.X... }}` must name a node upstream of the one that uses it (in a loop body:
    upstream in the body, or in `outer`, the nodes that run before the loop)."""
    reversed_edges = [Edge(source=e.target, target=e.source) for e in edges]
    for node in nodes.values():
        ancestors: set[str] | None = None
        for path, text in template_strings(node.kind, node.data):
            for ref in _referenced_nodes(text):
                if ref in outer and ref not in nodes:
                    continue
                if ref in outer_all and ref not in nodes:
                    problems.append(f"node {node.id!r}: data.{path} refers to node {ref!r}, which does "
                                    "not run before the loop")
                    continue
                if ref not in nodes:
                    problems.append(
                        f"node {node.id!r}: data.{path} refers to unknown node {ref!r}"
                    )
                    continue
                if ancestors is None:
                    ancestors = descendants(node.id, reversed_edges)
                if ref not in ancestors:
                    problems.append(
                        f"node {node.id!r}: data.{path} refers to node {ref!r}, which does not "
                        "run before it"
                    )


def _referenced_nodes(text: str) -> set[str]:
    if not templates.has_template(text):
        return set()
    found: set[str] = set()
    try:
        ast = jinja2.Environment().parse(text)
        for getattr_node in ast.find_all(jnodes.Getattr):
            inner = getattr_node.node
            if isinstance(inner, jnodes.Name) and inner.name == "nodes":
                found.add(getattr_node.attr)
        for getitem in ast.find_all(jnodes.Getitem):
            inner = getitem.node
            if (isinstance(inner, jnodes.Name) and inner.name == "nodes"
                    and isinstance(getitem.arg, jnodes.Const) and isinstance(getitem.arg.value, str)):
                found.add(getitem.arg.value)
    except (jinja2.TemplateSyntaxError, RecursionError):
        return set()  # already reported by templates.check: a syntax error, or nested too deeply
    return found
