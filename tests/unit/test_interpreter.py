"""The replay walk: readiness, skipping, joins, handoff and redrive over (graph, completed)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pal.plan import interpreter
from pal.plan.graph import Graph, parse_graph


def build(nodes: dict[str, str], edges: list[tuple[str, str] | tuple[str, str, str]]) -> Graph:
    """nodes: id -> type; edges: (source, target[, sourceHandle])."""
    data = {
        "trigger": {},
        "tool": {"tool": "echo"},
        "condition": {"expression": "{{ input.ok }}"},
        "output": {"value": "done"},
    }
    return parse_graph({
        "nodes": [{"id": i, "type": t, "data": data[t]} for i, t in nodes.items()],
        "edges": [
            {"source": e[0], "target": e[1]} | ({"sourceHandle": e[2]} if len(e) == 3 else {})
            for e in edges
        ],
    })


def chose(branch: str) -> dict[str, Any]:
    return {"result": branch == "true", "branch": branch}


LINEAR = build({"t": "trigger", "a": "tool", "b": "tool", "out": "output"},
               [("t", "a"), ("a", "b"), ("b", "out")])

BRANCH = build(
    {"t": "trigger", "c": "condition", "yes": "tool", "no": "tool", "join": "output"},
    [("t", "c"), ("c", "yes", "true"), ("c", "no", "false"), ("yes", "join"), ("no", "join")],
)

FAN = build(
    {"t": "trigger", "a": "tool", "b": "tool", "c": "tool", "join": "tool", "out": "output"},
    [("t", "a"), ("t", "b"), ("t", "c"), ("a", "join"), ("b", "join"), ("c", "join"),
     ("join", "out")],
)


def test_linear_walk() -> None:
    start = interpreter.progress(LINEAR, {})
    assert start.ready == {"t"} and start.pending == {"a", "b", "out"} and not start.completed
    assert not start.finished

    completed: dict[str, Any] = {"t": {"x": 1}}
    step = interpreter.handoff(LINEAR, completed, "t")
    assert step.dispatch == ("a",) and not step.finished

    completed["a"] = 1
    assert interpreter.handoff(LINEAR, completed, "a").dispatch == ("b",)
    completed["b"] = 2
    assert interpreter.handoff(LINEAR, completed, "b").dispatch == ("out",)
    completed["out"] = "result"
    last = interpreter.handoff(LINEAR, completed, "out")
    assert last.finished and last.dispatch == () and last.output == "result"

    end = interpreter.progress(LINEAR, completed)
    assert end.finished and end.completed == {"t", "a", "b", "out"}
    assert not end.ready and not end.pending and not end.skipped


@pytest.mark.parametrize(("branch", "taken", "untaken"), [("true", "yes", "no"), ("false", "no", "yes")])
def test_condition_skips_the_untaken_branch_and_the_join_runs(
    branch: str, taken: str, untaken: str
) -> None:
    completed: dict[str, Any] = {"t": {}, "c": chose(branch)}
    step = interpreter.handoff(BRANCH, completed, "c")
    assert step.dispatch == (taken,)

    state = interpreter.progress(BRANCH, completed)
    assert state.skipped == {untaken}
    assert state.ready == {taken}
    assert state.pending == {"join"}  # waits for the live branch

    completed[taken] = "ok"
    step = interpreter.handoff(BRANCH, completed, taken)
    assert step.dispatch == ("join",)  # one live edge and one dead edge: ready
    assert interpreter.progress(BRANCH, completed).ready == {"join"}

    completed["join"] = {"answer": 42}
    step = interpreter.handoff(BRANCH, completed, "join")
    assert step.finished and step.output == {"answer": 42}
    assert interpreter.progress(BRANCH, completed).skipped == {untaken}


def test_skipping_propagates_through_a_chain() -> None:
    graph = build(
        {"t": "trigger", "c": "condition", "a": "tool", "b": "tool", "o": "output"},
        [("t", "c"), ("c", "a", "true"), ("a", "b"), ("b", "o")],
    )
    completed = {"t": {}, "c": chose("false")}
    state = interpreter.progress(graph, completed)
    assert state.skipped == {"a", "b", "o"}
    step = interpreter.handoff(graph, completed, "c")
    assert step.finished and step.dispatch == () and step.output is None


def test_condition_without_a_branch_key_takes_no_edge() -> None:
    completed = {"t": {}, "c": "not a mapping"}
    state = interpreter.progress(BRANCH, completed)
    assert state.skipped == {"yes", "no", "join"}
    assert state.finished


def test_join_of_two_skipped_branches_is_skipped() -> None:
    graph = build(
        {"t": "trigger", "c": "condition", "a": "tool", "b": "tool", "j": "tool"},
        [("t", "c"), ("c", "a", "true"), ("c", "b", "true"), ("a", "j"), ("b", "j")],
    )
    state = interpreter.progress(graph, {"t": {}, "c": chose("false")})
    assert state.skipped == {"a", "b", "j"}
    assert state.finished


def test_fan_out_dispatches_every_branch() -> None:
    step = interpreter.handoff(FAN, {"t": {}}, "t")
    assert set(step.dispatch) == {"a", "b", "c"} and len(step.dispatch) == 3
    assert not step.finished


def test_fan_in_join_waits_for_all_predecessors() -> None:
    completed: dict[str, Any] = {"t": {}}
    for name in ("a", "b"):
        completed[name] = name
        step = interpreter.handoff(FAN, completed, name)
        assert step.dispatch == ()
        assert not step.finished
        assert "join" in interpreter.progress(FAN, completed).pending
    completed["c"] = "c"
    assert interpreter.handoff(FAN, completed, "c").dispatch == ("join",)


@pytest.mark.parametrize("order", [("a", "b", "c"), ("c", "b", "a"), ("b", "c", "a")])
def test_join_is_dispatched_exactly_once_whatever_the_completion_order(order: tuple[str, ...]) -> None:
    completed: dict[str, Any] = {"t": {}}
    dispatched = list(interpreter.handoff(FAN, completed, "t").dispatch)
    for name in order:
        completed[name] = name
        dispatched.extend(interpreter.handoff(FAN, completed, name).dispatch)
    assert dispatched.count("join") == 1
    assert dispatched[-1] == "join"
    assert sorted(dispatched) == ["a", "b", "c", "join"]


def test_handoff_does_not_redispatch_steps_that_were_already_ready() -> None:
    # a and b are both ready after t; completing a must not dispatch b again
    completed = {"t": {}, "a": 1}
    step = interpreter.handoff(FAN, completed, "a")
    assert "b" not in step.dispatch and "c" not in step.dispatch
    assert interpreter.progress(FAN, completed).ready == {"b", "c"}


def test_run_output_single_output_node_is_its_value() -> None:
    assert interpreter.run_output(LINEAR, {"t": {}, "a": 1, "b": 2, "out": [1, 2]}) == [1, 2]


def test_run_output_without_output_node_is_none() -> None:
    graph = build({"t": "trigger", "a": "tool"}, [("t", "a")])
    assert interpreter.run_output(graph, {"t": {}, "a": "tool result"}) is None
    step = interpreter.handoff(graph, {"t": {}, "a": "tool result"}, "a")
    assert step.finished and step.output is None


def test_run_output_of_an_uncompleted_output_node_is_none() -> None:
    assert interpreter.run_output(LINEAR, {"t": {}, "a": 1}) is None


def test_run_output_several_output_nodes_are_keyed_by_id() -> None:
    graph = build({"t": "trigger", "o1": "output", "o2": "output"}, [("t", "o1"), ("t", "o2")])
    assert interpreter.run_output(graph, {"t": {}, "o1": 1, "o2": None}) == {"o1": 1, "o2": None}


def test_redrive_of_a_fresh_run_is_the_trigger() -> None:
    assert interpreter.redrive_steps(FAN, {}) == ("t",)


def test_redrive_returns_ready_incomplete_steps_in_order() -> None:
    assert interpreter.redrive_steps(FAN, {"t": {}, "b": 1}) == tuple(
        n for n in FAN.order if n in {"a", "c"}
    )
    assert interpreter.redrive_steps(BRANCH, {"t": {}, "c": chose("true")}) == ("yes",)


def test_redrive_of_a_finished_run_is_empty() -> None:
    completed = {"t": {}, "c": chose("false"), "no": 1, "join": 2}
    assert interpreter.redrive_steps(BRANCH, completed) == ()
    assert interpreter.progress(BRANCH, completed).finished


def test_completed_ids_not_in_the_graph_are_ignored() -> None:
    state = interpreter.progress(LINEAR, {"t": {}, "ghost": 1})
    assert state.completed == {"t"}
    assert state.ready == {"a"}


# --- property tests over random DAGs -------------------------------------------------------------

@st.composite
def random_runs(draw: st.DrawFn) -> tuple[Graph, dict[str, str]]:
    """A random DAG (edges only from lower to higher index) and a branch for each condition."""
    count = draw(st.integers(min_value=2, max_value=12))
    ids = [f"n{i}" for i in range(count)]
    types = ["trigger"] + [
        draw(st.sampled_from(["tool", "tool", "condition", "output"])) for _ in range(count - 1)
    ]
    edges: list[tuple[str, str] | tuple[str, str, str]] = []
    for target in range(1, count):
        sources = draw(st.lists(st.integers(min_value=0, max_value=target - 1), unique=True,
                                max_size=3))
        if not sources:
            sources = [0]
        for source in sources:
            if types[source] == "condition":
                edges.append((ids[source], ids[target], draw(st.sampled_from(["true", "false"]))))
            else:
                edges.append((ids[source], ids[target]))
    graph = build(dict(zip(ids, types, strict=True)), edges)
    branches = {
        ids[i]: draw(st.sampled_from(["true", "false"]))
        for i in range(count) if types[i] == "condition"
    }
    return graph, branches


def expected_to_run(graph: Graph, branches: dict[str, str]) -> set[str]:
    """Independent oracle: a node runs when some incoming edge is live."""
    ran = {graph.trigger_id}
    for node_id in graph.order:
        for edge in graph.incoming[node_id]:
            live_source = edge.source in ran
            if edge.source in branches:
                live_source = live_source and branches[edge.source] == edge.source_handle
            if live_source:
                ran.add(node_id)
                break
    return ran


@settings(max_examples=200, deadline=None)
@given(run=random_runs(), data=st.data())
def test_random_dags_run_each_step_once_and_finish(
    run: tuple[Graph, dict[str, str]], data: st.DataObject
) -> None:
    graph, branches = run
    completed: dict[str, Any] = {}
    dispatched = {graph.trigger_id}
    in_flight = [graph.trigger_id]
    assert set(interpreter.redrive_steps(graph, completed)) == {graph.trigger_id}
    finished = False
    while in_flight:
        step_id = in_flight.pop(data.draw(st.integers(min_value=0, max_value=len(in_flight) - 1)))
        completed[step_id] = chose(branches[step_id]) if step_id in branches else {"of": step_id}
        result = interpreter.handoff(graph, completed, step_id)
        state = interpreter.progress(graph, completed)
        for new in result.dispatch:
            assert new not in dispatched, f"{new} dispatched twice"
            for edge in graph.incoming[new]:
                assert edge.source in completed or edge.source in state.skipped
            dispatched.add(new)
            in_flight.append(new)
        if result.finished:
            assert not in_flight, "finished while steps were still in flight"
            finished = True
        assert set(interpreter.redrive_steps(graph, completed)) == set(in_flight)
        assert state.ready == set(in_flight)
    assert finished
    assert set(completed) == dispatched == expected_to_run(graph, branches)
    assert interpreter.redrive_steps(graph, completed) == ()
    final = interpreter.progress(graph, completed)
    assert final.finished
    assert final.skipped == set(graph.nodes) - set(completed)


def whole_walk_handoff(graph: Graph, completed: dict[str, Any], step_id: str) -> tuple[str, ...]:
    """The reference hand-off: what is ready after the completion and was not before it."""
    program = interpreter.GraphProgram(graph)
    before = set(program.frontier({k: v for k, v in completed.items() if k != step_id}))
    return tuple(s for s in program.frontier(completed) if s not in before)


@settings(max_examples=200, deadline=None)
@given(run=random_runs(), data=st.data())
def test_local_handoff_equals_the_whole_walk(run: tuple[Graph, dict[str, str]], data: st.DataObject) -> None:
    graph, branches = run
    completed: dict[str, Any] = {}
    in_flight = [graph.trigger_id]
    while in_flight:
        step_id = in_flight.pop(data.draw(st.integers(min_value=0, max_value=len(in_flight) - 1)))
        completed[step_id] = chose(branches[step_id]) if step_id in branches else {"of": step_id}
        result = interpreter.handoff(graph, completed, step_id)
        assert result.dispatch == whole_walk_handoff(graph, completed, step_id)
        assert result.finished == interpreter.progress(graph, completed).finished  # the local answer too
        in_flight.extend(result.dispatch)


def test_a_join_behind_a_long_pending_chain_falls_back_to_the_whole_walk() -> None:
    """Classifying the join would climb the other 600-node chain: past the local limit, the
    hand-off walks the whole graph instead, with the same answer."""
    nodes = {"t": "trigger", "join": "tool", "out": "output"}
    edges: list[tuple[str, str] | tuple[str, str, str]] = [("join", "out")]
    for chain in "ab":
        ids = [f"{chain}{i}" for i in range(600)]
        nodes |= dict.fromkeys(ids, "tool")
        edges += [("t", ids[0]), *itertools.pairwise(ids), (ids[-1], "join")]
    graph = build(nodes, edges)
    completed: dict[str, Any] = {"t": {}} | {f"a{i}": {} for i in range(600)} | {"b0": {}}
    assert interpreter.handoff(graph, completed, "a599").dispatch == () == whole_walk_handoff(
        graph, completed, "a599")
    completed |= {f"b{i}": {} for i in range(600)}
    assert interpreter.handoff(graph, completed, "b599").dispatch == ("join",)


def test_a_wide_join_is_classified_by_its_unfinished_branches_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fan-out of 1,000 branches, 999 completed: the join is pending on the last one. Its
    classification looks at that branch alone (the completed ones need no walk), so each branch's
    hand-off stays local instead of passing the walk's limit and walking the whole graph."""
    branches = [f"b{i}" for i in range(1000)]
    graph = build({"t": "trigger", "join": "tool"} | dict.fromkeys(branches, "tool"),
                  [*(("t", b) for b in branches), *((b, "join") for b in branches)])
    completed: dict[str, Any] = {"t": {}} | {b: {} for b in branches if b != "b500"}
    known: dict[str, interpreter.NodeState] = {}
    assert interpreter.node_state(graph, "join", completed, known) is interpreter.NodeState.PENDING
    assert known == {"b500": interpreter.NodeState.READY, "join": interpreter.NodeState.PENDING}
    with monkeypatch.context() as patched:  # the hand-off must not fall back to the whole walk
        patched.setattr(interpreter, "progress", lambda *_: pytest.fail("walked the whole graph"))
        result = interpreter.handoff(graph, completed, "b999")
    assert result.dispatch == () and not result.finished
    assert interpreter.handoff(graph, completed | {"b500": {}}, "b500").dispatch == ("join",)


def test_a_step_deep_in_a_long_chain_is_classified_without_recursing_once_per_node() -> None:
    """A process's first claim of a long run's step knows none of its completions yet: climbing
    3,000 pending nodes one frame each would pass Python's recursion limit (a RecursionError
    that failed every fresh worker's claim of such a run). The walk gives up at the local limit,
    counting the nodes it is still climbing, and the whole walk answers instead."""
    ids = [f"n{i}" for i in range(3000)]
    graph = build({"t": "trigger"} | dict.fromkeys(ids, "tool"),
                  [("t", ids[0]), *itertools.pairwise(ids)])
    program = interpreter.GraphProgram(graph)
    with pytest.raises(interpreter.WalkTooFar):
        interpreter.node_state(graph, "n2999", {}, {})
    assert not program.is_ready({}, "n2999")
    assert program.needs({}, "n2999") is None  # too far to name: the claim reads the log first
    completed: dict[str, Any] = {"t": {}} | {i: {} for i in ids[:2999]}
    assert program.is_ready(completed, "n2999") and not program.is_ready(completed, "n2998")
    assert program.needs(completed | {"n2998": {}}, "n2999") is None  # ready already


# --- what a claim whose log is behind asks the server to check (Program.needs) -------------------


def test_needs_names_the_predecessors_whose_completion_makes_a_step_ready() -> None:
    program = interpreter.GraphProgram(LINEAR)
    assert program.needs({"t": {}}, "b") == {"a"}  # a not seen complete: b needs it
    assert program.needs({"t": {}, "a": {}}, "b") is None  # ready already: nothing to check
    assert program.needs({"t": {}, "a": {}, "b": {}}, "b") is None  # done
    fan = interpreter.GraphProgram(FAN)
    assert fan.needs({"t": {}, "a": {}}, "join") == {"b", "c"}  # a join needs every branch
    assert fan.needs({"t": {}}, "join") == {"a", "b", "c"}
    assert fan.needs({}, "nope") is None  # not a step of the plan


def test_needs_is_none_after_a_choice_or_in_a_loop() -> None:
    branch = interpreter.GraphProgram(BRANCH)
    assert branch.needs({"t": {}}, "yes") is None  # c's output picks the live edge: read the log
    # After the choice, the join needs the branch taken; the other one is skipped for good.
    assert branch.needs({"t": {}, "c": chose("true")}, "join") == {"yes"}
    looped = interpreter.GraphProgram(parse_graph({
        "nodes": [{"id": "t", "type": "trigger"},
                  {"id": "l", "type": "loop", "data": {"items": "{{ [1, 2] }}", "body": {
                      "nodes": [{"id": "x", "type": "tool", "data": {"tool": "echo"}}], "edges": []}}}],
        "edges": [{"source": "t", "target": "l"}]}))
    assert looped.needs({}, "l") is None and looped.needs({"t": {}}, "l[0].x") is None


@settings(max_examples=200, deadline=None)
@given(run=random_runs(), data=st.data())
def test_the_completions_a_step_needs_make_it_ready_whatever_they_output(
    run: tuple[Graph, dict[str, str]], data: st.DataObject
) -> None:
    """At every point of a random run, for every step not yet completed: the steps `needs` names
    are not complete, and once they are (with any output), the step is ready."""
    graph, branches = run
    program = interpreter.GraphProgram(graph)
    completed: dict[str, Any] = {}
    in_flight = [graph.trigger_id]
    while in_flight:
        for node_id in graph.order:
            needed = program.needs(completed, node_id)
            if needed is None:
                continue
            assert needed and not needed & set(completed)
            outputs = data.draw(st.sampled_from([{"of": "x"}, None, {"branch": "true"}]))
            assert program.is_ready(completed | dict.fromkeys(needed, outputs), node_id), (node_id, needed)
        step_id = in_flight.pop(data.draw(st.integers(min_value=0, max_value=len(in_flight) - 1)))
        completed[step_id] = chose(branches[step_id]) if step_id in branches else {"of": step_id}
        in_flight.extend(interpreter.handoff(graph, completed, step_id).dispatch)
