"""The run's DAG (pal.api.dag): layers by longest path, each node's state from the waterfall rows,
the interpreter's skipped branch."""

from __future__ import annotations

from pal.api.dag import layout, node_states, plan_view
from pal.plan.graph import parse_graph
from pal.plan.interpreter import GraphProgram

DOC = {"name": "g", "nodes": [{"id": "start", "type": "trigger"},
                              {"id": "check", "type": "condition", "data": {"expression": "{{ input.big }}"}},
                              {"id": "yes", "type": "output", "data": {"value": 1}},
                              {"id": "no", "type": "output", "data": {"value": 2}},
                              {"id": "join", "type": "output", "data": {"value": 3}}],
       "edges": [{"source": "start", "target": "check"},
                 {"source": "check", "target": "yes", "sourceHandle": "true"},
                 {"source": "check", "target": "no", "sourceHandle": "false"},
                 {"source": "start", "target": "join"}, {"source": "yes", "target": "join"}]}


def test_layers_follow_the_longest_path_and_every_edge_points_right() -> None:
    drawn = layout(DOC, {})
    x = {n["id"]: n["x"] for n in drawn["nodes"]}
    assert x["start"] < x["check"] < x["yes"] < x["join"] and x["no"] == x["yes"]
    assert all(x[e["source"]] < x[e["target"]] for e in drawn["edges"])
    assert {n["state"] for n in drawn["nodes"]} == {"not reached"}
    assert [e["handle"] for e in drawn["edges"]] == [None, "true", "false", None, None]
    y = {n["id"]: n["y"] for n in drawn["nodes"] if n["x"] == x["yes"]}
    assert y["yes"] != y["no"] and drawn["width"] > x["join"] and drawn["height"] > max(y.values())


def test_node_states_come_from_rows_and_the_untaken_branch_is_skipped() -> None:
    program = GraphProgram(parse_graph(DOC))
    plan = plan_view(program, {"start": None, "check": {"result": True, "branch": "true"}})
    assert plan.skipped == {"no"} and plan.nodes[0] == "start" and plan.document is not None
    assert plan_view(None, {}).document is None
    rows = [{"step_id": "start", "status": "completed"}, {"step_id": "check", "status": "completed"},
            {"step_id": "yes", "status": "recovering"}, {"step_id": "no", "status": "skipped",
                                                          "skip_reason": "branch not taken"},
            {"step_id": "join", "status": "skipped", "skip_reason": "not reached"},
            {"step_id": "each[0].work", "status": "failed"}]
    assert node_states([*plan.nodes, "each"], rows) == {
        "start": "completed", "check": "completed", "yes": "running", "no": "skipped", "join": "not reached",
        "each": "failed"}
