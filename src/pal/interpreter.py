"""Pure decisions over (graph, journal): what is done, what is ready, whether the run is over.

This is the replay walk. From the trigger, in topological order, each node is:
  completed  it has a step_completed event (its cached output is reused, never recomputed);
  ready      every incoming edge is resolved and at least one is live;
  skipped    every incoming edge is dead (an untaken condition branch, or a skipped source);
  pending    some predecessor is not resolved yet (joins wait for all of them).
An edge is live when its source completed and, for a branching source, the branch it chose
matches the edge's sourceHandle; it is dead when its source was skipped or chose another branch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from pal.graph import Edge, Graph, Node


class EdgeState(Enum):
    LIVE = "live"
    DEAD = "dead"
    PENDING = "pending"


@dataclass(frozen=True)
class Progress:
    completed: frozenset[str]
    ready: frozenset[str]
    skipped: frozenset[str]
    pending: frozenset[str]

    @property
    def finished(self) -> bool:
        return not self.ready and not self.pending


@dataclass(frozen=True)
class Handoff:
    """What completing one step leads to: steps to dispatch now, and whether the run is over."""

    dispatch: tuple[str, ...]
    finished: bool
    output: Any = None
    error: Mapping[str, Any] | None = None  # a finished run that failed (e.g. a turn limit)


def _edge_state(graph: Graph, edge: Edge, completed: Mapping[str, Any],
                skipped: set[str]) -> EdgeState:
    if edge.source in skipped:
        return EdgeState.DEAD
    if edge.source not in completed:
        return EdgeState.PENDING
    if graph.nodes[edge.source].kind.branches:
        output = completed[edge.source]
        chosen = output.get("branch") if isinstance(output, Mapping) else None
        return EdgeState.LIVE if chosen == edge.source_handle else EdgeState.DEAD
    return EdgeState.LIVE


def progress(graph: Graph, completed: Mapping[str, Any]) -> Progress:
    """Classify every node of `graph` given the outputs of its completed steps."""
    ready: set[str] = set()
    skipped: set[str] = set()
    pending: set[str] = set()
    for node_id in graph.order:
        if node_id in completed:
            continue
        incoming = graph.incoming[node_id]
        if not incoming:  # the trigger
            ready.add(node_id)
            continue
        states = {_edge_state(graph, edge, completed, skipped) for edge in incoming}
        if EdgeState.PENDING in states:
            pending.add(node_id)
        elif EdgeState.LIVE in states:
            ready.add(node_id)
        else:
            skipped.add(node_id)
    done = frozenset(n for n in completed if n in graph.nodes)
    return Progress(done, frozenset(ready), frozenset(skipped), frozenset(pending))


def run_output(graph: Graph, completed: Mapping[str, Any]) -> Any:
    """The run output: the value of its completed output node (several: keyed by node id)."""
    outputs = {n: completed[n] for n in graph.order
               if graph.nodes[n].type == "output" and n in completed}
    if not outputs:
        return None
    if len(outputs) == 1:
        return next(iter(outputs.values()))
    return outputs


def handoff(graph: Graph, completed: Mapping[str, Any], step_id: str) -> Handoff:
    """Decide what follows the completion of `step_id`; `completed` already includes it.

    Only steps that became ready because of this completion are dispatched: a step that was
    ready before was dispatched by whoever made it ready, so concurrent completions (serialized
    by the run's lease row) never dispatch the same step twice.
    """
    before = {k: v for k, v in completed.items() if k != step_id}
    was_ready = progress(graph, before).ready
    now = progress(graph, completed)
    dispatch = tuple(n for n in graph.order if n in now.ready and n not in was_ready)
    if now.finished:
        return Handoff(dispatch=(), finished=True, output=run_output(graph, completed))
    return Handoff(dispatch=dispatch, finished=False)


def redrive_steps(graph: Graph, completed: Mapping[str, Any]) -> tuple[str, ...]:
    """The first incomplete steps of a re-driven run; empty for a finished graph."""
    state = progress(graph, completed)
    return tuple(n for n in graph.order if n in state.ready)


class Program(Protocol):
    """What the step protocol needs of a run's plan: a graph, or a plain-LLM conversation."""

    @property
    def first_step(self) -> str: ...

    def node(self, step_id: str) -> Node:
        """The node a step executes; KeyError for a step the plan does not have."""
        ...

    def handoff(self, completed: Mapping[str, Any], step_id: str) -> Handoff: ...

    def redrive_steps(self, completed: Mapping[str, Any]) -> tuple[str, ...]: ...


@dataclass(frozen=True)
class GraphProgram:
    """A graph run's plan: the pure walk above over a validated graph."""

    graph: Graph

    @property
    def first_step(self) -> str:
        return self.graph.trigger_id

    def node(self, step_id: str) -> Node:
        return self.graph.nodes[step_id]

    def handoff(self, completed: Mapping[str, Any], step_id: str) -> Handoff:
        return handoff(self.graph, completed, step_id)

    def redrive_steps(self, completed: Mapping[str, Any]) -> tuple[str, ...]:
        return redrive_steps(self.graph, completed)
