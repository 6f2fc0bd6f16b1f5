"""The run's graph as a DAG the dashboard draws: the plan snapshot's nodes and edges (the React Flow
shape, docs/nodes.md) placed in layers, each node coloured by its step's state.

Pure: `plan_view` asks the interpreter which nodes an untaken branch skipped, `layout` places the
nodes (layer = the longest path from a source, so every edge points right; order within a layer
follows the previous layer, which keeps most edges short). The browser only draws what it is given
(static/dag.js), with no layout library."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pal.plan.interpreter import GraphProgram, Program, progress

X_STEP, Y_STEP, NODE_W, NODE_H = 190, 64, 150, 40
# What a row's status means for its node's colour; a node with no row has not been reached.
_STATE = {"completed": "completed", "failed": "failed", "waiting": "waiting", "skipped": "skipped",
          "running": "running", "retrying": "running", "recovering": "running", "reused": "reused"}


@dataclass(frozen=True)
class PlanView:
    nodes: tuple[str, ...]  # the plan's nodes, in its topological order
    skipped: frozenset[str]  # on an untaken branch (or downstream of one)
    document: Mapping[str, Any] | None  # the graph snapshot; None for a plain-LLM or microVM run


def plan_view(program: Program | None, completed: Mapping[str, Any]) -> PlanView:
    """What the waterfall and the DAG need of the run's plan, given its completed outputs."""
    if not isinstance(program, GraphProgram):
        return PlanView((), frozenset(), None)
    graph = program.graph
    return PlanView(graph.order, progress(graph, completed).skipped, graph.document())


def node_states(nodes: Iterable[str], rows: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Each plan node's state from the waterfall's rows. A loop node `L` is its own row once it
    finished, else the steps of its expansion (`L[...]`) say it runs or failed."""
    # A node the run never reached is a skipped row of the waterfall but not a skipped node.
    by_step = {row["step_id"]: None if row.get("skip_reason") == "not reached" else row["status"]
               for row in rows}
    states: dict[str, str] = {}
    for node in nodes:
        status = by_step.get(node)
        if status is None:
            expansion = [s for step, s in by_step.items() if s and step.startswith(f"{node}[")]
            status = ("failed" if "failed" in expansion else "running") if expansion else None
        states[node] = _STATE.get(status or "", "not reached")
    return states


def layout(document: Mapping[str, Any], states: Mapping[str, str]) -> dict[str, Any]:
    """Positions (x, y of each node's top-left corner) and the edges, with the drawing's size."""
    ids = [str(n["id"]) for n in document.get("nodes", [])]
    edges = [(str(e["source"]), str(e["target"]), e.get("sourceHandle")) for e in document.get("edges", [])
             if e.get("source") in ids and e.get("target") in ids]
    layer = _layers(ids, edges)
    columns: dict[int, list[str]] = {}
    for node in ids:
        columns.setdefault(layer[node], []).append(node)
    row_of: dict[str, float] = {}
    for depth in sorted(columns):
        # Order a layer by the mean row of its predecessors: fewer crossings than document order.
        def rank(node: str) -> float:
            above = [row_of[s] for s, t, _ in edges if t == node and s in row_of]
            return sum(above) / len(above) if above else 0.0
        columns[depth].sort(key=lambda node: (rank(node), ids.index(node)))
        for index, node in enumerate(columns[depth]):
            row_of[node] = index
    types = {str(n["id"]): str(n.get("type", "")) for n in document.get("nodes", [])}
    placed = [{"id": node, "type": types[node], "state": states.get(node, "not reached"),
               "x": 10 + layer[node] * X_STEP, "y": 10 + int(row_of[node]) * Y_STEP} for node in ids]
    tallest = max((len(c) for c in columns.values()), default=0)
    return {"nodes": placed, "edges": [{"source": s, "target": t, "handle": h} for s, t, h in edges],
            "node_width": NODE_W, "node_height": NODE_H,
            "width": 20 + len(columns) * X_STEP, "height": 20 + tallest * Y_STEP}


def _layers(ids: Sequence[str], edges: Sequence[tuple[str, str, Any]]) -> dict[str, int]:
    """Each node's longest-path depth from a source (Kahn's order; a validated plan has no cycle,
    and a node left on one anyway is put after everything else rather than looping)."""
    incoming = {node: 0 for node in ids}
    for _, target, _ in edges:
        incoming[target] += 1
    depth = dict.fromkeys(ids, 0)
    ready = [node for node in ids if incoming[node] == 0]
    seen: set[str] = set()
    while ready:
        node = ready.pop(0)
        seen.add(node)
        for source, target, _ in edges:
            if source == node:
                depth[target] = max(depth[target], depth[node] + 1)
                incoming[target] -= 1
                if incoming[target] == 0:
                    ready.append(target)
    deepest = max(depth.values(), default=0)
    return {node: depth[node] if node in seen else deepest + 1 for node in ids}
