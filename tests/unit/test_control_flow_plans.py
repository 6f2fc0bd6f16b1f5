"""Loops, approvals and subagents as pure plans and validation, without services."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pal.errors import GraphError
from pal.plan.graph import parse_graph
from pal.plan.interpreter import GraphProgram
from pal.plan.programs import parse_plan
from tests.support.graphs import approval, edge, loop, parent_of, single


def program(document: dict[str, Any]) -> GraphProgram:
    return GraphProgram(parse_graph(document))


def test_a_loop_expands_into_items_iterations_in_order_then_the_collect_step(tmp_path: Path) -> None:
    plan = program(loop(tmp_path / "c"))
    done: dict[str, Any] = {"start": {}}
    assert plan.redrive_steps(done) == ("each[items]",)
    done["each[items]"] = {"items": ["x", "y"]}
    assert plan.handoff(done, "each[items]").dispatch == ("each[0].work",)
    done["each[0].work"] = {"value": "x"}
    assert plan.handoff(done, "each[0].work").dispatch == ("each[0].check",)
    done["each[0].check"] = {"index": 0}
    assert plan.handoff(done, "each[0].check").dispatch == ("each[1].work",)  # iteration 1 after 0
    done |= {"each[1].work": {"value": "y"}, "each[1].check": {"index": 1}}
    assert plan.handoff(done, "each[1].check").dispatch == ("each",)
    _, context = plan.view("each", done)
    assert context == {"results": [{"index": 0}, {"index": 1}]}
    done["each"] = [{"index": 0}, {"index": 1}]
    assert plan.handoff(done, "each").dispatch == ("out",)


def test_a_body_step_sees_its_iteration_and_the_nodes_before_the_loop(tmp_path: Path) -> None:
    plan = program(loop(tmp_path / "c"))
    done = {"start": {"k": 1}, "each[items]": {"items": ["x", "y"]}, "each[0].work": {"value": "x"},
            "each[0].check": 0, "each[1].work": {"value": "y"}}
    outputs, context = plan.view("each[1].check", done)
    assert outputs == {"start": {"k": 1}, "work": {"value": "y"}}
    assert context == {"item": "y", "index": 1, "count": 2}
    assert plan.node("each[1].check").type == "tool"
    assert plan.node("each[items]").type == "loop-items"
    for bad in ("each[1].nope", "each[x].work", "nope[1].work", "each[items]x"):
        with pytest.raises(KeyError):
            plan.node(bad)


def test_an_empty_list_goes_straight_to_collect(tmp_path: Path) -> None:
    plan = program(loop(tmp_path / "c"))
    assert plan.redrive_steps({"start": {}, "each[items]": {"items": []}}) == ("each",)


def test_approval_branches_follow_the_decision(tmp_path: Path) -> None:
    plan = program(approval(tmp_path / "c", rejected=True, timeout=True))
    done = {"start": {}, "gate": {"branch": "rejected"}}
    assert plan.handoff(done, "gate").dispatch == ("on_rejected",)
    done = {"start": {}, "gate": {"branch": "approved"}}
    assert plan.handoff(done, "gate").dispatch == ("pay",)


def bad(graph: dict[str, Any], fragment: str) -> None:
    with pytest.raises(GraphError) as caught:
        parse_plan(graph, known_tools=None)
    assert fragment in str(caught.value), str(caught.value)


def test_invalid_loops_are_refused(tmp_path: Path) -> None:
    bad(single({"id": "l", "type": "loop", "data": {"body": {"id": "x", "type": "tool", "data": {"tool": "noop"}}}}),
        "a loop needs 'items' (a list or a template) or 'maxIterations'")
    bad(single({"id": "l", "type": "loop", "data": {"maxIterations": 0, "body": {"id": "x", "type": "tool",
                                                                                  "data": {"tool": "noop"}}}}),
        "maxIterations must be a whole number from 1 to 1000")
    bad(single({"id": "l", "type": "loop", "data": {"maxIterations": 2, "body": {"id": "t", "type": "trigger"}}}),
        "body: node 't': a loop body cannot hold a trigger node")
    bad(single({"id": "l", "type": "loop", "data": {"maxIterations": 2, "body": {
        "id": "x", "type": "tool", "data": {"tool": "echo", "args": {"a": "{{ nodes.ghost.output }}"}}}}}),
        "body: node 'x': data.args.a refers to unknown node 'ghost'")
    graph = loop(tmp_path / "c")
    graph["nodes"][1]["data"]["body"]["nodes"][0]["data"]["args"]["value"] = "{{ nodes.out.output }}"
    bad(graph, "refers to node 'out', which does not run before the loop")


def test_invalid_approvals_and_subagents_are_refused(tmp_path: Path) -> None:
    graph = approval(tmp_path / "c", expires="soon")
    bad(graph, "expiresIn 'soon' is not a duration")
    graph = approval(tmp_path / "c")
    graph["edges"][1] = edge("gate", "pay", "yes")
    bad(graph, "needs sourceHandle 'approved' or 'rejected' or 'timeout', not 'yes'")
    bad(parent_of({"nodes": []}), "node 'sub': graph: graph needs a non-empty 'nodes' list")
    bad(parent_of(single({"id": "x", "type": "tool", "data": {"tool": "noop"}}), on_child_approval="ignore"),
        "onChildApproval must be one of wait, fail")
