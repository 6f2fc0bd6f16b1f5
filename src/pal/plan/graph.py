"""Graph documents in the React Flow shape: parse, validate with precise errors, snapshot.

    {"nodes": [{"id": "a", "type": "tool", "data": {...}}, ...],
     "edges": [{"source": "a", "target": "b", "sourceHandle": "true"?}, ...]}

Every problem is reported at once, naming the node or edge at fault; an invalid graph raises
GraphError before anything is written.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from pal.core import templates
from pal.core.admission import concurrency_problems, priority_problem
from pal.core.anomalies import anomalies_problems
from pal.core.budgets import limits_problems
from pal.core.confidence import LOW_CONFIDENCE
from pal.core.run_filters import MAX_GRAPH_CHARS
from pal.errors import GraphError
from pal.nodes import KINDS
from pal.nodes.wait_event import NAME_RULE, SIGNAL_NAME
from pal.plan.documents import check_size, load_graph_text
from pal.plan.model import Edge, Node
from pal.plan.references import check_references, descendants, template_strings

EmbeddedCheck = Callable[[Mapping[str, Any], frozenset[str] | None], list[str]]
"""The problems of a plan a node embeds, given the known tools (empty when valid)."""

NODE_ID = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,127}\Z")
# `limits` (the run's budget), `anomalies` (thresholds), `concurrency` (its key's limit) and
# `priority` are kept in the run's snapshot; the others are the editor's and are dropped from it.
WATCH_KEYS = ("limits", "anomalies", "concurrency")
TOP_LEVEL_KEYS = frozenset({"nodes", "edges", "viewport", "name", "description", "metadata", "cancelOn",
                            "priority", *WATCH_KEYS})
MAX_CANCEL_ON = 16  # signal names in a graph's `cancelOn`
EDGE_KEYS = frozenset(
    {"id", "source", "target", "sourceHandle", "targetHandle", "type", "label", "animated",
     "data", "style", "markerEnd", "selected"}
)


@dataclass(frozen=True)
class Graph:
    """A validated graph; build it with `parse_graph`."""

    nodes: Mapping[str, Node]
    edges: tuple[Edge, ...]
    trigger_id: str
    order: tuple[str, ...]  # topological: every node after all its predecessors
    watch: Mapping[str, Any] = field(default_factory=dict)  # its `limits`, `anomalies`, `concurrency`
    name: str | None = None  # kept in the snapshot: the runs list shows and filters by it (docs/api.md)
    cancel_on: tuple[str, ...] = ()  # signals that cancel the run (docs/nodes.md, "cancelOn")
    priority: int | None = None  # its runs' default priority, 1 first .. 5 last (docs/fairness.md)

    @cached_property
    def incoming(self) -> Mapping[str, tuple[Edge, ...]]:
        result: dict[str, list[Edge]] = {node_id: [] for node_id in self.nodes}
        for edge in self.edges:
            result[edge.target].append(edge)
        return {k: tuple(v) for k, v in result.items()}

    @cached_property
    def outgoing(self) -> Mapping[str, tuple[Edge, ...]]:
        result: dict[str, list[Edge]] = {node_id: [] for node_id in self.nodes}
        for edge in self.edges:
            result[edge.source].append(edge)
        return {k: tuple(v) for k, v in result.items()}

    def document(self) -> dict[str, Any]:
        """The canonical snapshot stored with a run (positions and styling dropped)."""
        return {
            "nodes": [
                {"id": n.id, "type": n.type, "data": dict(n.data)} for n in self.nodes.values()
            ],
            "edges": [
                {"source": e.source, "target": e.target}
                | ({"sourceHandle": e.source_handle} if e.source_handle else {})
                for e in self.edges
            ],
        } | {key: self.watch[key] for key in WATCH_KEYS if key in self.watch} | (
            {"name": self.name} if self.name else {}) | (
            {"cancelOn": list(self.cancel_on)} if self.cancel_on else {}) | (
            {"priority": self.priority} if self.priority is not None else {})

    @cached_property
    def bodies(self) -> Mapping[str, Graph]:
        """The parsed body of each loop node."""
        return {n.id: parse_body(n.data["body"], known_tools=None, outer=None)
                for n in self.nodes.values() if n.type == "loop"}

    @cached_property
    def hash(self) -> str:
        canonical = json.dumps(self.document(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


def parse_graph(
    document: Any,
    *,
    known_tools: frozenset[str] | None = None,
    max_bytes: int | None = None,
    embedded: EmbeddedCheck | None = None,
) -> Graph:
    """Validate a decoded graph document and return the Graph, or raise GraphError. `embedded`
    checks the plans that nodes embed (a subagent's graph); pal.plan.programs passes it, so a node
    kind never imports the planner."""
    if isinstance(document, str):
        document = load_graph_text(document, max_bytes=max_bytes)
    else:
        check_size(document, max_bytes=max_bytes)
    problems: list[str] = []
    nodes = _parse_nodes(document, known_tools, problems, embedded)
    edges = _parse_edges(document, nodes, problems)
    trigger_id = _find_trigger(nodes, edges, problems)
    order = _topological_order(nodes, edges, problems)
    if trigger_id and order is not None:
        _check_reachable(nodes, edges, trigger_id, problems)
        check_references(nodes, edges, problems)
        _check_loop_bodies(nodes, edges, known_tools, problems, embedded)
    watch = _watch_blocks(document, problems)
    name = _name(document, problems)
    cancel_on = _cancel_on(document, problems)
    priority = document.get("priority") if isinstance(document, Mapping) else None
    problem = priority_problem(priority, "priority")
    if problem:
        problems.append(problem)
    if problems or trigger_id is None or order is None:
        raise GraphError(problems)
    return Graph(nodes=nodes, edges=tuple(edges), trigger_id=trigger_id, order=order, watch=watch, name=name,
                 cancel_on=cancel_on, priority=priority)


def _name(document: Any, problems: list[str]) -> str | None:
    """The graph's `name`, a bounded string: the runs list shows and filters by it."""
    name = document.get("name") if isinstance(document, Mapping) else None
    if name is not None and (not isinstance(name, str) or len(name) > MAX_GRAPH_CHARS):
        problems.append(f"graph name must be a string of at most {MAX_GRAPH_CHARS} characters")
        return None
    return name or None


def _cancel_on(document: Any, problems: list[str]) -> tuple[str, ...]:
    """The graph's `cancelOn`: a signal name, or a list of them, any of which cancels the run."""
    raw = document.get("cancelOn") if isinstance(document, Mapping) else None
    if raw is None:
        return ()
    names = [raw] if isinstance(raw, str) else raw
    if (not isinstance(names, list) or not names or len(names) > MAX_CANCEL_ON
            or not all(isinstance(n, str) and SIGNAL_NAME.match(n) for n in names)):
        problems.append(f"cancelOn must be a signal name or a list of 1 to {MAX_CANCEL_ON} of them, "
                        f"each {NAME_RULE}")
        return ()
    return tuple(dict.fromkeys(names))


def _watch_blocks(document: Any, problems: list[str]) -> dict[str, Any]:
    """The graph's validated `limits`, `anomalies` (docs/anomalies.md) and `concurrency` blocks."""
    if not isinstance(document, Mapping):
        return {}
    problems.extend(limits_problems(document.get("limits")))
    problems.extend(anomalies_problems(document.get("anomalies")))
    problems.extend(concurrency_problems(document.get("concurrency")))
    return {key: dict(document[key]) for key in WATCH_KEYS if isinstance(document.get(key), Mapping)}


def _parse_nodes(
    document: Any, known_tools: frozenset[str] | None, problems: list[str], embedded: EmbeddedCheck | None
) -> dict[str, Node]:
    if not isinstance(document, Mapping):
        problems.append(
            f"graph must be an object with 'nodes' and 'edges', not {type(document).__name__}"
        )
        return {}
    for key in document:
        if key not in TOP_LEVEL_KEYS:
            problems.append(f"unknown top-level key {key!r} (allowed: nodes, edges, viewport, name, "
                            "description, metadata, cancelOn, priority, limits, anomalies, concurrency)")
    raw_nodes = document.get("nodes")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        problems.append("graph needs a non-empty 'nodes' list")
        return {}
    nodes: dict[str, Node] = {}
    for index, raw in enumerate(raw_nodes):
        where = f"node #{index}"
        if not isinstance(raw, Mapping):
            problems.append(f"{where} must be an object, not {type(raw).__name__}")
            continue
        node_id = raw.get("id")
        if not isinstance(node_id, str) or not NODE_ID.fullmatch(node_id):
            problems.append(
                f"{where} has invalid id {node_id!r}: use a letter or _ then letters, digits, "
                "_ or -, at most 128 characters"
            )
            continue
        where = f"node {node_id!r}"
        if node_id in nodes:
            problems.append(f"{where}: duplicate id")
            continue
        node_type = raw.get("type")
        if not isinstance(node_type, str) or node_type not in KINDS:
            known = ", ".join(sorted(KINDS))
            problems.append(f"{where}: unknown node type {node_type!r} (known: {known})")
            continue
        data = raw.get("data", {})
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            problems.append(f"{where}: 'data' must be an object, not {type(data).__name__}")
            continue
        json_problem = _json_problem(data)
        if json_problem:
            problems.append(f"{where}: 'data' {json_problem}")
            continue
        problems.extend(f"{where}: {p}" for p in KINDS[node_type].validate(data, known_tools))
        for name in KINDS[node_type].embedded_plans:
            inner = data.get(name)
            if embedded is not None and isinstance(inner, Mapping):
                problems.extend(f"{where}: {name}: {p}" for p in embedded(inner, known_tools))
        for path, text in template_strings(KINDS[node_type], data):
            error = templates.check(text)
            if error:
                problems.append(f"{where}: data.{path}: {error}")
        nodes[node_id] = Node(id=node_id, type=node_type, data=dict(data))
    return nodes


def _json_problem(data: Any) -> str | None:
    """Node data is stored and hashed as JSON: plain values, string keys (YAML allows more)."""
    try:
        json.dumps(data, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        return f"must be plain JSON (strings, numbers, booleans, null, lists, objects): {exc}"
    return None


def _parse_edges(document: Any, nodes: Mapping[str, Node], problems: list[str]) -> list[Edge]:
    if not isinstance(document, Mapping):
        return []
    raw_edges = document.get("edges", [])
    if raw_edges is None:
        raw_edges = []
    if not isinstance(raw_edges, list):
        problems.append(f"'edges' must be a list, not {type(raw_edges).__name__}")
        return []
    edges: list[Edge] = []
    seen: set[Edge] = set()
    for index, raw in enumerate(raw_edges):
        where = f"edge #{index}"
        if not isinstance(raw, Mapping):
            problems.append(f"{where} must be an object, not {type(raw).__name__}")
            continue
        source, target, handle = raw.get("source"), raw.get("target"), raw.get("sourceHandle")
        if not isinstance(source, str) or not isinstance(target, str):
            problems.append(f"{where} needs string 'source' and 'target'")
            continue
        where = f"{where} ({source} -> {target})"
        unknown_keys = sorted(set(raw) - EDGE_KEYS)
        if unknown_keys:
            problems.append(f"{where}: unknown key(s) {', '.join(unknown_keys)}")
        if handle is not None and not isinstance(handle, str):
            problems.append(f"{where}: 'sourceHandle' must be a string")
            continue
        dangling = [end for end in (source, target) if end not in nodes]
        if dangling:
            problems.append(f"{where}: dangling, no node with id {', '.join(map(repr, dangling))}")
            continue
        if source == target and not nodes[source].kind.allows_cycles:
            problems.append(f"{where}: a node cannot feed itself")
            continue
        branches = nodes[source].kind.branches
        if branches and handle not in branches:
            problems.append(
                f"{where}: a {nodes[source].type} edge needs sourceHandle "
                f"{' or '.join(map(repr, branches))}, not {handle!r}"
            )
            continue
        if not branches and handle == LOW_CONFIDENCE and "confidence" in nodes[source].data:
            pass  # where a rejected low-confidence action goes (docs/anomalies.md)
        elif not branches and handle:
            problems.append(f"{where}: sourceHandle {handle!r} on a {nodes[source].type} node, "
                            "which has no branches")
            continue
        if nodes[target].type == "trigger":
            problems.append(f"{where}: the trigger cannot have incoming edges")
            continue
        edge = Edge(source=source, target=target, source_handle=handle or None)
        if edge in seen:
            problems.append(f"{where}: duplicate edge")
            continue
        seen.add(edge)
        edges.append(edge)
    return edges


def _find_trigger(
    nodes: Mapping[str, Node], edges: list[Edge], problems: list[str]
) -> str | None:
    triggers = [n.id for n in nodes.values() if n.type == "trigger"]
    if not nodes:
        return None
    if not triggers:
        problems.append("missing trigger: a graph needs exactly one node of type 'trigger'")
        return None
    if len(triggers) > 1:
        problems.append(f"more than one trigger: {', '.join(triggers)}")
        return None
    return triggers[0]


def _topological_order(
    nodes: Mapping[str, Node], edges: list[Edge], problems: list[str]
) -> tuple[str, ...] | None:
    indegree = {node_id: 0 for node_id in nodes}
    successors: dict[str, list[str]] = {node_id: [] for node_id in nodes}
    for edge in edges:
        indegree[edge.target] += 1
        successors[edge.source].append(edge.target)
    ready = [node_id for node_id, degree in indegree.items() if degree == 0]
    order: list[str] = []
    while ready:
        current = ready.pop(0)
        order.append(current)
        for target in successors[current]:
            indegree[target] -= 1
            if indegree[target] == 0:
                ready.append(target)
    if len(order) == len(nodes):
        return tuple(order)
    remaining = [edge for edge in edges if indegree[edge.source] > 0 and indegree[edge.target] > 0]
    in_cycle = sorted(n for n, degree in indegree.items() if degree > 0 and n in descendants(n, remaining))
    if any(nodes[n].kind.allows_cycles for n in in_cycle):
        return tuple(order) + tuple(in_cycle)
    problems.append(
        f"cycle through {', '.join(in_cycle)}: cycles are only allowed through a loop node"
    )
    return None


def _check_loop_bodies(nodes: Mapping[str, Node], edges: list[Edge], known_tools: frozenset[str] | None,
                       problems: list[str], embedded: EmbeddedCheck | None) -> None:
    reversed_edges = [Edge(source=e.target, target=e.source) for e in edges]
    for node in nodes.values():
        if node.type == "loop" and "body" in node.data:
            outer = frozenset(descendants(node.id, reversed_edges))
            try:
                parse_body(node.data["body"], known_tools=known_tools, outer=outer,
                           outer_all=frozenset(nodes), embedded=embedded)
            except GraphError as exc:
                problems.extend(f"node {node.id!r}: body: {p}" for p in exc.problems)


def parse_body(document: Any, *, known_tools: frozenset[str] | None,
               outer: frozenset[str] | None, outer_all: frozenset[str] = frozenset(),
               embedded: EmbeddedCheck | None = None) -> Graph:
    """A loop body: one node `{id, type, data}` or a sub-graph `{nodes, edges}` with no trigger.
    Its entry nodes are those without incoming edges. `outer` (the nodes that run before the
    loop) may be referenced from body templates; None skips the reference check (a stored,
    validated body)."""
    if isinstance(document, Mapping) and "nodes" not in document:
        document = {"nodes": [document], "edges": []}
    problems: list[str] = [] if not isinstance(document, Mapping) or "cancelOn" not in document else [
        "cancelOn belongs on the graph, not a loop body"]
    nodes = _parse_nodes(document, known_tools, problems, embedded)
    for node in nodes.values():
        if node.type in ("trigger", "loop"):
            problems.append(f"node {node.id!r}: a loop body cannot hold a {node.type} node")
    edges = _parse_edges(document, nodes, problems)
    order = _topological_order(nodes, edges, problems)
    if order is not None and outer is not None:
        check_references(nodes, edges, problems, outer=outer, outer_all=outer_all)
    if problems or order is None:
        raise GraphError(problems, what="loop body")
    return Graph(nodes=nodes, edges=tuple(edges), trigger_id="", order=order)


def _check_reachable(
    nodes: Mapping[str, Node], edges: list[Edge], trigger_id: str, problems: list[str]
) -> None:
    reached = descendants(trigger_id, edges) | {trigger_id}
    for node_id in nodes:
        if node_id not in reached:
            problems.append(f"node {node_id!r}: unreachable from the trigger {trigger_id!r}")


