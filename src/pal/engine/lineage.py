"""Retry and fork a finished run (docs/retry-and-fork.md): validate everything first, create the
derived run in one transaction (pal.storage.lineage), then publish its ready steps exactly as a
fresh run's first step is published (generation 1).

A retry is a new run of the same graph and input that reuses every completed step of a failed or
cancelled run; a fork is a new run that reuses the completed steps that are neither the chosen
step nor downstream of it, with the source's input or a new one. The source is never changed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from pal.core.clock import utcnow
from pal.core.jcs import canonical
from pal.core.loop_steps import parse_loop_step
from pal.core.records import RunRecord
from pal.core.vocabulary import TERMINAL_STATUSES, EventKind, RunStatus, SourceKind
from pal.engine.runs import check_run_id, check_run_input, new_run_id
from pal.engine.runtime import Runtime
from pal.errors import InputError, Refused
from pal.plan.interpreter import GraphProgram, Program
from pal.plan.programs import Plan
from pal.plan.references import descendants
from pal.storage.lineage import Derived, DerivedRequest

RETRYABLE = (RunStatus.FAILED, RunStatus.CANCELLED)
MAX_STEP_ID_CHARS = 256  # runs.source_step_id's width; a node id is at most 128


class _SameInput:
    def __repr__(self) -> str:
        return "SAME_INPUT"


SAME_INPUT: Final = _SameInput()
"""fork_run's default input: the source run's."""


def retry_run(rt: Runtime, source_run_id: str, *, run_id: str | None = None,
              tenant_id: str | None = None, graph: Any = None) -> Derived:
    """A new run retrying a failed or cancelled run: its completed steps reused, the rest run
    again (new attempts, new idempotency keys). With `graph`, the new run runs that graph, a fix
    of the source's: each node a completed step ran must be there unchanged (its type, its data,
    the edges into it), else InputError names the first that changed and nothing is written.
    Idempotent on `run_id`. RunNotFound (also for another tenant's run), Refused (not failed or
    cancelled; a child run; nothing to run), QuotaExceeded, InputError (a bad run id), GraphError."""
    check_run_id(run_id)
    source = _source(rt, source_run_id, tenant_id)
    fixed = None if graph is None else _fixed(rt, source, graph)
    request = DerivedRequest(source.id, run_id or new_run_id(), SourceKind.RETRY, None, source.input,
                             keep=lambda _step: True, allowed=RETRYABLE, tenant_id=tenant_id,
                             graph=fixed.document if fixed else None,
                             graph_hash=fixed.hash if fixed else None)
    return _create(rt, request, fixed.program if fixed else None)


def _fixed(rt: Runtime, source: RunRecord, graph: Any) -> Plan:
    """`graph` as a retry of `source` may run it: valid, a graph, and every node that a completed
    step of the source ran unchanged in it (so that step's output still belongs where it is)."""
    plan = rt.validated_plan(graph)
    if plan.kind != "graph" or source.kind != "graph":
        raise InputError(f"only a graph run retries with a fixed graph (run {source.id} is a "
                         f"{source.kind} run, the new document a {plan.kind} run)")
    old, new = _definitions(source.graph), _definitions(plan.document)
    for event in rt.journal.runs.events(source.id):
        if event.kind != EventKind.STEP_COMPLETED or event.step_id is None:
            continue
        node = node_of(event.step_id)
        if old.get(node) != new.get(node):
            how = "is gone" if node not in new else "changed (its type, data or incoming edges)"
            raise InputError(f"node {node!r}, whose step {event.step_id!r} completed in run {source.id}, "
                             f"{how} in the fixed graph: its output cannot be reused. Keep the nodes that "
                             "completed as they were, or start a new run with the fixed graph")
    return plan


def _definitions(document: Any) -> dict[str, tuple[bytes, bytes]]:
    """Each node's definition as a retry compares it: type and data, and the edges into it
    (canonical JSON); not its position or label on a canvas."""
    edges: dict[str, list[list[Any]]] = {}
    for edge in document.get("edges", ()):
        edges.setdefault(str(edge.get("target")), []).append([edge.get("source"), edge.get("sourceHandle")])
    return {str(node.get("id")): (canonical([node.get("type"), node.get("data")]),
                                  canonical(sorted(edges.get(str(node.get("id")), []), key=canonical)))
            for node in document.get("nodes", ())}


def fork_run(rt: Runtime, source_run_id: str, from_step: str, run_input: Any = SAME_INPUT, *,
             run_id: str | None = None, tenant_id: str | None = None) -> Derived:
    """A new run forking a finished graph run at `from_step`: every completed step that is neither
    `from_step` nor downstream of it is reused (a loop's expansion `L[i].x` counts as its node
    `L`), the rest runs, with the source's input unless `run_input` is given. Idempotent on
    `run_id`. RunNotFound, Refused (the source is in flight; a child run; nothing to run),
    InputError (no such step in the graph, input as refused by a start), QuotaExceeded."""
    check_run_id(run_id)
    if not isinstance(from_step, str) or not from_step or len(from_step) > MAX_STEP_ID_CHARS:
        raise InputError(f"the step to fork from must be a node id of at most {MAX_STEP_ID_CHARS} characters")
    source = _source(rt, source_run_id, tenant_id)
    program = rt.program_of(source)
    if not isinstance(program, GraphProgram):
        raise InputError(f"run {source.id} is a {source.kind} run: only graph runs fork from a step "
                         "(retry it instead)")
    graph = program.graph
    if from_step not in graph.nodes:
        raise InputError(f"step {from_step!r} is not a node of run {source.id}'s graph")
    rerun = {from_step} | descendants(from_step, list(graph.edges))
    settings = rt.settings
    new_input = source.input if isinstance(run_input, _SameInput) else check_run_input(
        run_input, settings.max_input_bytes, settings.max_json_depth)
    request = DerivedRequest(source.id, run_id or new_run_id(), SourceKind.FORK, from_step, new_input,
                             keep=lambda step: node_of(step) not in rerun, allowed=TERMINAL_STATUSES,
                             tenant_id=tenant_id)
    return _create(rt, request)


def node_of(step_id: str) -> str:
    """The graph node a step belongs to: a loop's expansion steps (`L[items]`, `L[i].x`) are `L`'s."""
    found = parse_loop_step(step_id) if "[" in step_id else None
    return found.loop_id if found is not None else step_id


def _source(rt: Runtime, run_id: str, tenant_id: str | None) -> RunRecord:
    source = rt.journal.runs.get_run(run_id, tenant_id=tenant_id)
    if source.kind == "microvm":
        raise Refused(f"run {run_id} is a microVM run: its workload orders its own steps "
                      "(docs/isolated-tier.md); start a new run instead")
    return source


def _create(rt: Runtime, request: DerivedRequest, program: Program | None = None) -> Derived:
    derived = rt.journal.lineage.create_derived_run(
        request, frontier=_frontier(rt, program), now=utcnow(), lease_ttl=rt.settings.lease_ttl,
        max_in_flight=rt.settings.max_runs_in_flight)
    for step_id in derived.dispatch:  # after the commit, as start_run publishes a first step
        rt.publish(derived.run.id, step_id, 1)
    return derived


Frontier = Callable[[RunRecord, Mapping[str, Any]], Sequence[str]]


def _frontier(rt: Runtime, program: Program | None) -> Frontier:
    def frontier(source: RunRecord, reused: Mapping[str, Any]) -> Sequence[str]:
        return (program or rt.program_of(source)).redrive_steps(reused)

    return frontier
