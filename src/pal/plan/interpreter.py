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
from functools import cached_property
from typing import Any, Protocol

from pal.core.confidence import LOW_CONFIDENCE
from pal.core.loop_steps import LoopStep, items_step, iteration_prefix, iteration_step, parse_loop_step
from pal.core.records import Handoff
from pal.core.views import OnlyKeys
from pal.nodes.loop import MAX_ITERATIONS
from pal.plan.graph import Graph
from pal.plan.model import Edge, Node


@dataclass(frozen=True)
class Progress:
    completed: frozenset[str]
    ready: frozenset[str]
    skipped: frozenset[str]
    pending: frozenset[str]

    @property
    def finished(self) -> bool:
        return not self.ready and not self.pending

    def ready_in_order(self, graph: Graph) -> list[str]:
        return [n for n in graph.order if n in self.ready]




def _chosen(graph: Graph, edge: Edge, completed: Mapping[str, Any]) -> bool:
    """Whether the edge out of a completed source is live: a branching source picks its edges."""
    source = graph.nodes[edge.source]
    if source.kind.branches:
        output = completed[edge.source]
        chosen = output.get("branch") if isinstance(output, Mapping) else None
        return bool(chosen == edge.source_handle)
    if "confidence" in source.data:  # gated: a rejected low-confidence action leaves by its own edge
        output = completed[edge.source]
        diverted = isinstance(output, Mapping) and output.get("branch") == LOW_CONFIDENCE
        return diverted == (edge.source_handle == LOW_CONFIDENCE)
    return True


class NodeState(Enum):
    COMPLETED = "completed"
    READY = "ready"
    SKIPPED = "skipped"
    PENDING = "pending"


LOCAL_WALK_LIMIT = 256  # nodes a local classification may visit before the whole walk is used


class WalkTooFar(Exception):
    """Control flow: a local classification would visit more than LOCAL_WALK_LIMIT nodes."""


def node_state(graph: Graph, node_id: str, completed: Mapping[str, Any],
               known: dict[str, NodeState], limit: int | None = LOCAL_WALK_LIMIT,
               depth: int = 0) -> NodeState:
    """One node's class, found by looking upstream only as far as needed: completed; ready (every
    incoming edge resolved, one live); skipped (every incoming edge dead: a skipped source, or a
    branch not taken); pending (a source unresolved: joins wait for all). `known` memoizes and
    may be shared across calls with the same `completed`. Raises WalkTooFar once `limit` nodes
    are known or being classified (`depth`: the walk's nodes below this one, not known until they
    return), which also bounds the recursion's depth: upstream of a node deep in a long chain with
    little completed, the walk would otherwise recurse once per node before knowing any."""
    state = known.get(node_id)
    if state is not None:
        return state
    if limit is not None and len(known) + depth >= limit:
        raise WalkTooFar(node_id)
    if node_id in completed:
        state = NodeState.COMPLETED
    elif not graph.incoming[node_id]:
        state = NodeState.READY  # the trigger
    else:
        # The sources not completed first: one that is not skipped leaves the node pending, and
        # the completed ones need no walk. A join whose branches complete one by one then costs
        # each completion a lookup per branch, not a classification (docs/benchmarks.md).
        incoming = graph.incoming[node_id]
        for edge in incoming:
            if edge.source not in completed and node_state(graph, edge.source, completed, known, limit,
                                                           depth + 1) is not NodeState.SKIPPED:
                state = NodeState.PENDING
                break
        else:  # every edge resolved: live when a completed source chose it, dead otherwise
            live = any(_chosen(graph, edge, completed) for edge in incoming if edge.source in completed)
            state = NodeState.READY if live else NodeState.SKIPPED
    known[node_id] = state
    return state


def progress(graph: Graph, completed: Mapping[str, Any]) -> Progress:
    """Classify every node of `graph` given the outputs of its completed steps (in topological
    order, so each node finds its predecessors already classified)."""
    known: dict[str, NodeState] = {}
    for node_id in graph.order:
        node_state(graph, node_id, completed, known, limit=None)
    by_state: dict[NodeState, set[str]] = {state: set() for state in NodeState}
    for node_id, state in known.items():
        by_state[state].add(node_id)
    return Progress(*(frozenset(by_state[s]) for s in
                      (NodeState.COMPLETED, NodeState.READY, NodeState.SKIPPED, NodeState.PENDING)))


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
    by the run's lease row) never dispatch the same step twice. (One implementation: the graph's
    program, which also expands loops.)
    """
    return GraphProgram(graph).handoff(completed, step_id)


def redrive_steps(graph: Graph, completed: Mapping[str, Any]) -> tuple[str, ...]:
    """The first incomplete steps of a re-driven run; empty for a finished graph."""
    return GraphProgram(graph).redrive_steps(completed)


class Program(Protocol):
    """What the step protocol needs of a run's plan: a graph, or a plain-LLM conversation."""

    @property
    def first_step(self) -> str: ...

    def node(self, step_id: str) -> Node:
        """The node a step executes; KeyError for a step the plan does not have."""
        ...

    def handoff(self, completed: Mapping[str, Any], step_id: str) -> Handoff: ...

    def redrive_steps(self, completed: Mapping[str, Any]) -> tuple[str, ...]: ...

    def is_ready(self, completed: Mapping[str, Any], step_id: str) -> bool:
        """Whether `step_id` is on the run's ready frontier: a step of the plan, not completed, whose
        predecessors are resolved (an approval before it decided, a loop's earlier iterations done).
        The claim refuses a message for any other step (docs/security.md)."""
        ...

    def needs(self, completed: Mapping[str, Any], step_id: str) -> frozenset[str] | None:
        """The steps, none in `completed`, whose completion alone would put `step_id` on the ready
        frontier, whatever their outputs: the claim checks them on the server when its log is
        behind (docs/architecture.md, "The life of one step"). None when no such set exists or is
        known (the step is ready already, or waits on a choice, a loop, a decision)."""
        ...

    def view(self, step_id: str, completed: Mapping[str, Any]) -> tuple[Mapping[str, Any], Any]:
        """(outputs, loop): what the step's templates see as `nodes` and as `loop`."""
        ...


@dataclass(frozen=True)
class GraphProgram:
    """A graph run's plan: the pure walk above, with each ready loop node expanded into its own
    steps (`loop[items]`, then iteration i's body steps `loop[i].<node>`, then `loop`)."""

    graph: Graph

    @property
    def first_step(self) -> str:
        return self.graph.trigger_id

    def node(self, step_id: str) -> Node:
        if step_id in self.graph.nodes:
            return self.graph.nodes[step_id]
        loop_id, index, local = self._locate(step_id)
        loop = self.graph.nodes[loop_id]
        if index is None:
            data = {k: v for k, v in loop.data.items() if k in ("items", "maxIterations", "retry")}
            return Node(id=step_id, type="loop-items", data=data)
        return self.graph.bodies[loop_id].nodes[local or ""]

    def outgoing(self, step_id: str) -> tuple[Edge, ...]:
        """The edges leaving a step's node: in the graph, or in its loop's body."""
        if step_id in self.graph.nodes:
            return self.graph.outgoing[step_id]
        loop_id, index, local = self._locate(step_id)
        return self.graph.bodies[loop_id].outgoing[local] if index is not None and local else ()

    def loop_position(self, step_id: str) -> tuple[str, int, int] | None:
        """(loop id, iterations so far counting this one, the loop's maxIterations) for a step of a
        loop's iteration; None for any other step."""
        found = parse_loop_step(step_id) if "[" in step_id else None  # most steps are no loop's
        if found is None or found.iteration is None or found.loop_id not in self.graph.nodes:
            return None
        maximum = self.graph.nodes[found.loop_id].data.get("maxIterations", MAX_ITERATIONS)
        return found.loop_id, found.iteration + 1, int(maximum)

    def _locate(self, step_id: str) -> LoopStep:
        found = parse_loop_step(step_id)
        if found is None or found.loop_id not in self.graph.bodies:
            raise KeyError(step_id)
        if found.iteration is not None and found.local not in self.graph.bodies[found.loop_id].nodes:
            raise KeyError(step_id)
        return found

    def _iteration(self, loop_id: str, index: int, completed: Mapping[str, Any]) -> dict[str, Any]:
        prefix = iteration_prefix(loop_id, index)
        return {k[len(prefix):]: v for k, v in completed.items() if k.startswith(prefix)}

    def _loop_frontier(self, loop_id: str, completed: Mapping[str, Any]) -> tuple[str, ...]:
        items = items_step(loop_id)
        if items not in completed:
            return (items,)
        body = self.graph.bodies[loop_id]
        for index in range(len(completed[items]["items"])):
            state = progress(body, self._iteration(loop_id, index, completed))
            if not state.finished:  # iterations run one after another
                return tuple(iteration_step(loop_id, index, n) for n in body.order if n in state.ready)
        return (loop_id,)

    def frontier(self, completed: Mapping[str, Any], state: Progress | None = None) -> tuple[str, ...]:
        """The steps ready now, loops expanded: what a re-drive dispatches."""
        return self._expand((state or progress(self.graph, completed)).ready_in_order(self.graph), completed)

    def handoff(self, completed: Mapping[str, Any], step_id: str) -> Handoff:
        """Only steps that became ready because of this completion are dispatched (see `handoff`)."""
        if step_id in self.graph.nodes:
            try:
                became_ready, pending = self._became_ready(completed, step_id)
            except WalkTooFar:
                became_ready, pending = [], False
            # Either way the run is not over, so there is no need to walk the whole graph: a
            # successor became ready, or one still waits for another branch (a join: each of a
            # fan-out's branches but the last ends here, or their hand-offs would cost the graph's
            # size each, the whole fan-out its square).
            if became_ready or pending:
                return Handoff(dispatch=self._expand(became_ready, completed), finished=False)
        after = progress(self.graph, completed)
        if after.finished:
            return Handoff(dispatch=(), finished=True, output=run_output(self.graph, completed))
        before = set(self.frontier({k: v for k, v in completed.items() if k != step_id}))
        return Handoff(dispatch=tuple(s for s in self.frontier(completed, after) if s not in before),
                       finished=False)

    def _became_ready(self, completed: Mapping[str, Any], step_id: str) -> tuple[list[str], bool]:
        """The graph nodes that the completion of `step_id` made ready, in graph order, and
        whether one of the nodes looked at is still pending (then the run is not finished).

        Only nodes downstream of it can change state: its successors, and theirs through nodes
        it made skipped. Each is classified by the same rules as `progress`, looking upstream only
        as far as its own predecessors need, so a hand-off costs the size of its neighbourhood,
        not of the graph."""
        states: dict[str, NodeState] = {}
        found: set[str] = set()
        pending = False
        through = [step_id]
        while through:
            for edge in self.graph.outgoing[through.pop()]:
                state = node_state(self.graph, edge.target, completed, states)
                if state is NodeState.READY:
                    found.add(edge.target)
                elif state is NodeState.SKIPPED:
                    through.append(edge.target)
                elif state is NodeState.PENDING:
                    pending = True
        return sorted(found, key=self._position.__getitem__), pending

    @cached_property
    def _position(self) -> Mapping[str, int]:
        return {node_id: i for i, node_id in enumerate(self.graph.order)}

    def _expand(self, ready: list[str], completed: Mapping[str, Any]) -> tuple[str, ...]:
        steps: list[str] = []
        for node_id in ready:
            if self.graph.nodes[node_id].type == "loop":
                steps.extend(self._loop_frontier(node_id, completed))
            else:
                steps.append(node_id)
        return tuple(steps)

    def redrive_steps(self, completed: Mapping[str, Any]) -> tuple[str, ...]:
        return self.frontier(completed)

    def is_ready(self, completed: Mapping[str, Any], step_id: str) -> bool:
        """See Program.is_ready. A graph node is classified looking upstream only as far as its
        predecessors need (usually one edge); a loop's steps must also be the loop's next ones."""
        if step_id in completed:
            return False
        try:
            node_id = step_id if step_id in self.graph.nodes else self._locate(step_id)[0]
        except KeyError:
            return False
        try:
            state = node_state(self.graph, node_id, completed, {})
        except WalkTooFar:
            state = NodeState.READY if node_id in progress(self.graph, completed).ready else NodeState.PENDING
        if state is not NodeState.READY:
            return False
        return self.graph.nodes[node_id].type != "loop" or step_id in self._loop_frontier(node_id, completed)

    def needs(self, completed: Mapping[str, Any], step_id: str) -> frozenset[str] | None:
        """See Program.needs. A graph node (not a loop) qualifies when each predecessor is resolved
        or is a step that neither branches nor is gated: its completion then makes its edge live
        whatever it outputs, and a resolved predecessor (completed, or skipped) stays so."""
        node = self.graph.nodes.get(step_id)
        if node is None or node.type == "loop" or step_id in completed:
            return None
        missing: set[str] = set()
        known: dict[str, NodeState] = {}
        try:
            for edge in self.graph.incoming[step_id]:
                state = node_state(self.graph, edge.source, completed, known)
                if state is NodeState.COMPLETED or state is NodeState.SKIPPED:
                    continue
                source = self.graph.nodes[edge.source]
                if source.kind.branches or "confidence" in source.data:
                    return None  # its output picks the live edge
                missing.add(edge.source)
        except WalkTooFar:
            return None
        return frozenset(missing) or None

    def view(self, step_id: str, completed: Mapping[str, Any]) -> tuple[Mapping[str, Any], Any]:
        outer = OnlyKeys(completed, self.graph.nodes)
        node = self.graph.nodes.get(step_id)
        if node is not None and node.type == "loop":
            count = len(completed[items_step(step_id)]["items"])
            return outer, {"results": [self._iteration_output(step_id, i, completed) for i in range(count)]}
        if node is not None:
            return outer, None
        loop_id, index, _ = self._locate(step_id)
        if index is None:
            return outer, None
        items = completed[items_step(loop_id)]["items"]
        return (dict(outer) | self._iteration(loop_id, index, completed),  # the iteration's own win
                {"item": items[index], "index": index, "count": len(items)})

    def _iteration_output(self, loop_id: str, index: int, completed: Mapping[str, Any]) -> Any:
        """An iteration's output: its body's last node's output (several sinks: keyed by id)."""
        body = self.graph.bodies[loop_id]
        done = self._iteration(loop_id, index, completed)
        sinks = [n for n in body.order if not body.outgoing[n]]
        if len(sinks) == 1:
            return done.get(sinks[0])
        return {n: done.get(n) for n in sinks}
