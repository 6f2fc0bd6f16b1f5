"""parse_graph: every invalid graph raises GraphError naming the node or edge at fault."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pal.errors import GraphError
from pal.plan.graph import Graph, parse_graph


def trigger(node_id: str = "t") -> dict[str, Any]:
    return {"id": node_id, "type": "trigger"}


def tool(node_id: str, name: str = "echo", **data: Any) -> dict[str, Any]:
    return {"id": node_id, "type": "tool", "data": {"tool": name, **data}}


def condition(node_id: str, expression: Any = "{{ input.ok }}") -> dict[str, Any]:
    return {"id": node_id, "type": "condition", "data": {"expression": expression}}


def edge(source: str, target: str, handle: str | None = None, **extra: Any) -> dict[str, Any]:
    result: dict[str, Any] = {"source": source, "target": target, **extra}
    if handle is not None:
        result["sourceHandle"] = handle
    return result


def doc(nodes: list[Any], edges: list[Any]) -> dict[str, Any]:
    return {"nodes": nodes, "edges": edges}


def ok_doc() -> dict[str, Any]:
    """A valid graph: t -> c -[true]-> a -> out, c -[false]-> out."""
    return doc(
        [trigger(), condition("c"), tool("a", args={"x": "{{ input.x }}"}),
         {"id": "out", "type": "output", "data": {"value": "{{ nodes.a.output }}"}}],
        [edge("t", "c"), edge("c", "a", "true"), edge("c", "out", "false"), edge("a", "out")],
    )


# (id, document, parse_graph keyword arguments, substrings; the first one is specific to the case)
INVALID: list[tuple[str, Any, dict[str, Any], tuple[str, ...]]] = [
    ("not-an-object", [trigger()], {},
     ("graph must be an object with 'nodes' and 'edges', not list",)),
    ("nodes-missing-typo-key", {"node": [trigger()], "edges": []}, {},
     ("unknown top-level key 'node'", "graph needs a non-empty 'nodes' list")),
    ("nodes-empty", doc([], []), {},
     ("graph needs a non-empty 'nodes' list",)),
    ("node-not-an-object", doc([trigger(), "a"], []), {},
     ("node #1 must be an object, not str",)),
    ("node-invalid-id", doc([trigger(), tool("1bad")], []), {},
     ("node #1 has invalid id '1bad'",)),
    ("node-id-with-space", doc([trigger(), tool("a b")], []), {},
     ("node #1 has invalid id 'a b'",)),
    ("node-duplicate-id", doc([trigger(), tool("a"), tool("a")], [edge("t", "a")]), {},
     ("node 'a': duplicate id",)),
    ("node-missing-type", doc([trigger(), {"id": "a", "data": {}}], []), {},
     ("node 'a': unknown node type None",)),
    ("node-unknown-type", doc([trigger(), {"id": "a", "type": "llm"}], []), {},
     ("node 'a': unknown node type 'llm' (known: ai-step, approval, condition, connector, email, loop, output, sleep, subagent, tool, trigger, wait_event)",)),
    ("node-data-not-an-object", doc([trigger(), {"id": "a", "type": "tool", "data": [1]}], []), {},
     ("node 'a': 'data' must be an object, not list",)),
    ("node-unknown-data-field", doc([trigger(), tool("a", color="red")], [edge("t", "a")]), {},
     ("node 'a': unknown data field 'color' (allowed: args, confidence, label, retry, timeoutMs, tool)",)),
    ("tool-without-tool", doc([trigger(), {"id": "a", "type": "tool", "data": {}}], [edge("t", "a")]),
     {}, ("node 'a': data field 'tool' is required (string)",)),
    ("tool-args-wrong-type", doc([trigger(), tool("a", args=[1])], [edge("t", "a")]), {},
     ("node 'a': data field 'args' must be object, not list",)),
    ("condition-expression-int", doc([trigger(), condition("c", 5)], [edge("t", "c")]), {},
     ("node 'c': data field 'expression' must be string or boolean, not int",)),
    ("unknown-tool", doc([trigger(), tool("a", "nope")], [edge("t", "a")]),
     {"known_tools": frozenset({"echo", "fetch"})},
     ("node 'a': unknown tool 'nope' (registered: echo, fetch",)),
    ("missing-trigger", doc([tool("a")], []), {},
     ("missing trigger: a graph needs exactly one node of type 'trigger'",)),
    ("two-triggers", doc([trigger("t1"), trigger("t2")], []), {},
     ("more than one trigger: t1, t2",)),
    ("edges-not-a-list", {"nodes": [trigger()], "edges": {"t": "a"}}, {},
     ("'edges' must be a list, not dict",)),
    ("edge-not-an-object", doc([trigger(), tool("a")], [edge("t", "a"), 7]), {},
     ("edge #1 must be an object, not int",)),
    ("edge-missing-source", doc([trigger(), tool("a")], [{"target": "a"}]), {},
     ("edge #0 needs string 'source' and 'target'",)),
    ("edge-unknown-key", doc([trigger(), tool("a")], [edge("t", "a", weight=3)]), {},
     ("edge #0 (t -> a): unknown key(s) weight",)),
    ("edge-dangling", doc([trigger(), tool("a")], [edge("t", "a"), edge("a", "zz")]), {},
     ("edge #1 (a -> zz): dangling, no node with id 'zz'",)),
    ("edge-self-loop", doc([trigger(), tool("a")], [edge("t", "a"), edge("a", "a")]), {},
     ("edge #1 (a -> a): a node cannot feed itself",)),
    ("condition-edge-without-handle",
     doc([trigger(), condition("c"), tool("b")], [edge("t", "c"), edge("c", "b")]), {},
     ("edge #1 (c -> b): a condition edge needs sourceHandle 'true' or 'false', not None",)),
    ("condition-edge-bad-handle",
     doc([trigger(), condition("c"), tool("b")], [edge("t", "c"), edge("c", "b", "maybe")]), {},
     ("edge #1 (c -> b): a condition edge needs sourceHandle 'true' or 'false', not 'maybe'",)),
    ("source-handle-not-a-string",
     doc([trigger(), tool("a")], [{"source": "t", "target": "a", "sourceHandle": 1}]), {},
     ("edge #0 (t -> a): 'sourceHandle' must be a string",)),
    ("source-handle-on-tool",
     doc([trigger(), tool("a"), tool("b")], [edge("t", "a"), edge("a", "b", "true")]), {},
     ("edge #1 (a -> b): sourceHandle 'true' on a tool node, which has no branches",)),
    ("edge-into-trigger", doc([trigger(), tool("a")], [edge("t", "a"), edge("a", "t")]), {},
     ("edge #1 (a -> t): the trigger cannot have incoming edges",)),
    ("duplicate-edge",
     doc([trigger(), tool("a")], [edge("t", "a"), edge("t", "a", id="e2")]), {},
     ("edge #1 (t -> a): duplicate edge",)),
    ("cycle",
     doc([trigger(), tool("a"), tool("b")], [edge("t", "a"), edge("a", "b"), edge("b", "a")]), {},
     ("cycle through a, b: cycles are only allowed through a loop node",)),
    ("cycle-through-condition",
     doc([trigger(), condition("c"), tool("b")],
         [edge("t", "c"), edge("c", "b", "true"), edge("b", "c")]), {},
     ("cycle through b, c",)),
    ("unreachable", doc([trigger(), tool("a"), tool("b")], [edge("t", "a")]), {},
     ("node 'b': unreachable from the trigger 't'",)),
    ("template-syntax-error",
     doc([trigger(), tool("a", args={"x": "{{ input.x "})], [edge("t", "a")]), {},
     ("node 'a': data.args.x: template syntax error",)),
    ("template-unknown-name",
     doc([trigger(), tool("a", args={"x": "{{ secrets.key }}"})], [edge("t", "a")]), {},
     ("node 'a': data.args.x: template uses unknown name(s) secrets",)),
    ("template-unknown-name-in-list",
     doc([trigger(), tool("a", args={"xs": ["ok", "{{ env }}"]})], [edge("t", "a")]), {},
     ("node 'a': data.args.xs[1]: template uses unknown name(s) env",)),
    ("template-unknown-node",
     doc([trigger(), tool("a", args={"x": "{{ nodes.ghost.output }}"})], [edge("t", "a")]), {},
     ("node 'a': data.args.x refers to unknown node 'ghost'",)),
    ("template-node-not-upstream",
     doc([trigger(), tool("a", args={"x": "{{ nodes.b.output }}"}), tool("b")],
         [edge("t", "a"), edge("t", "b")]), {},
     ("node 'a': data.args.x refers to node 'b', which does not run before it",)),
    ("template-node-downstream-by-subscript",
     doc([trigger(), tool("a", args={"x": "{{ nodes['b'].output }}"}), tool("b")],
         [edge("t", "a"), edge("a", "b")]), {},
     ("data.args.x refers to node 'b', which does not run before it",)),
    ("template-refers-to-itself",
     doc([trigger(), tool("a", args={"x": "{{ nodes.a.output }}"})], [edge("t", "a")]), {},
     ("data.args.x refers to node 'a', which does not run before it",)),
    ("oversized-object", ok_doc(), {"max_bytes": 100},
     ("over the limit of 100 (PAL_MAX_GRAPH_BYTES)",)),
    ("oversized-text", json.dumps(ok_doc()), {"max_bytes": 50},
     (f"graph document is {len(json.dumps(ok_doc()))} bytes, over the limit of 50",)),
    ("garbage-text", "nodes: [unclosed\n  edges: {", {},
     ("graph is neither JSON nor YAML",)),
    ("text-that-is-a-scalar", "just some words", {},
     ("graph must be an object with 'nodes' and 'edges', not str",)),
]


def test_invalid_cases_name_distinct_problems() -> None:
    firsts = [expected[0] for _, _, _, expected in INVALID]
    assert len(firsts) == len(set(firsts))
    assert len(INVALID) >= 24


@pytest.mark.parametrize(
    ("document", "kwargs", "expected"),
    [pytest.param(d, k, e, id=i) for i, d, k, e in INVALID],
)
def test_invalid_graph_raises_graph_error_naming_the_fault(
    document: Any, kwargs: dict[str, Any], expected: tuple[str, ...]
) -> None:
    with pytest.raises(GraphError) as info:
        parse_graph(document, **kwargs)
    message = str(info.value)
    for substring in expected:
        assert substring in message
    assert len(info.value.problems) >= 1
    assert message.startswith(f"invalid graph ({len(info.value.problems)} problem(s)):")


def test_known_tools_accepts_a_registered_tool() -> None:
    graph = parse_graph(doc([trigger(), tool("a", "echo")], [edge("t", "a")]),
                        known_tools=frozenset({"echo"}))
    assert graph.nodes["a"].data["tool"] == "echo"


def test_valid_json_string_parses() -> None:
    graph = parse_graph(json.dumps(ok_doc()))
    assert isinstance(graph, Graph)
    assert graph.trigger_id == "t"
    assert set(graph.nodes) == {"t", "c", "a", "out"}
    assert graph.order[0] == "t"
    assert graph.order.index("a") < graph.order.index("out")
    assert [e.target for e in graph.outgoing["c"]] == ["a", "out"]
    assert {e.source_handle for e in graph.outgoing["c"]} == {"true", "false"}


def test_valid_yaml_string_parses() -> None:
    text = """
name: demo
nodes:
  - id: t
    type: trigger
  - id: check
    type: condition
    data: {expression: "{{ input.n > 1 }}"}
  - id: big
    type: tool
    data:
      tool: echo
      args: {n: "{{ input.n }}"}
  - id: done
    type: output
    data: {value: "{{ nodes.big.output }}"}
edges:
  - {source: t, target: check}
  - {source: check, target: big, sourceHandle: "true"}
  - {source: big, target: done}
"""
    graph = parse_graph(text, max_bytes=10_000)
    assert graph.trigger_id == "t"
    assert graph.order == ("t", "check", "big", "done")
    assert graph.nodes["big"].data == {"tool": "echo", "args": {"n": "{{ input.n }}"}}
    assert graph.incoming["big"][0].source_handle == "true"


def test_react_flow_extras_are_accepted_and_dropped_from_the_document() -> None:
    document = {
        "nodes": [
            {"id": "t", "type": "trigger", "position": {"x": 0, "y": 0}, "width": 150,
             "height": 40, "selected": False, "data": {"label": "Start"}},
            {"id": "a", "type": "tool", "position": {"x": 0, "y": 100}, "dragging": False,
             "data": {"tool": "echo", "args": {"v": 1}}},
        ],
        "edges": [{"id": "e-t-a", "source": "t", "target": "a", "type": "smoothstep",
                   "animated": True, "style": {"stroke": "red"}, "targetHandle": None}],
        "viewport": {"x": 0, "y": 0, "zoom": 1.5},
        "name": "demo",
    }
    graph = parse_graph(document)
    assert graph.document() == {
        "nodes": [
            {"id": "t", "type": "trigger", "data": {"label": "Start"}},
            {"id": "a", "type": "tool", "data": {"tool": "echo", "args": {"v": 1}}},
        ],
        "edges": [{"source": "t", "target": "a"}],
        "name": "demo",  # kept: the runs list shows and filters by it
    }


@pytest.mark.parametrize("name", [7, ["x"], "n" * 201])
def test_a_graph_name_is_a_bounded_string(name: object) -> None:
    document = {"nodes": [{"id": "t", "type": "trigger"}], "edges": [], "name": name}
    with pytest.raises(GraphError, match="graph name must be a string of at most 200 characters"):
        parse_graph(document)


def test_document_keeps_source_handles() -> None:
    document = parse_graph(ok_doc()).document()
    assert {"source": "c", "target": "a", "sourceHandle": "true"} in document["edges"]
    assert {"source": "a", "target": "out"} in document["edges"]


def test_document_round_trips_to_the_same_hash() -> None:
    graph = parse_graph(ok_doc())
    assert parse_graph(graph.document()).hash == graph.hash


def _reverse_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _reverse_keys(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [_reverse_keys(v) for v in value]
    return value


def test_hash_is_stable_across_key_order() -> None:
    original = ok_doc()
    reordered = _reverse_keys(original)
    assert list(reordered) != list(original)
    assert list(reordered["nodes"][2]["data"]) != list(original["nodes"][2]["data"])
    first, second = parse_graph(original).hash, parse_graph(reordered).hash
    assert first == second
    assert len(first) == 64 and int(first, 16) >= 0


def test_hash_changes_with_content_and_ignores_layout() -> None:
    base = parse_graph(ok_doc()).hash
    changed = ok_doc()
    changed["nodes"][2]["data"]["args"]["x"] = "{{ input.y }}"
    assert parse_graph(changed).hash != base
    moved = ok_doc()
    moved["nodes"][1]["position"] = {"x": 10, "y": 20}
    moved["viewport"] = {"zoom": 2}
    assert parse_graph(moved).hash == base


def test_several_problems_are_reported_at_once() -> None:
    document = doc(
        [trigger(), tool("a", color="red"), {"id": "b", "type": "llm"}, tool("c")],
        [edge("t", "a"), edge("a", "zz"), edge("t", "c", "yes")],
    )
    with pytest.raises(GraphError) as info:
        parse_graph(document)
    problems = info.value.problems
    assert len(problems) == 5
    message = str(info.value)
    assert "node 'a': unknown data field 'color'" in message
    assert "node 'b': unknown node type 'llm'" in message
    assert "edge #1 (a -> zz): dangling" in message
    assert "edge #2 (t -> c): sourceHandle 'yes' on a trigger node" in message
    # the rejected edge was c's only way in
    assert "node 'c': unreachable from the trigger 't'" in message


def test_reachability_and_reference_problems_are_reported_together() -> None:
    document = doc(
        [trigger(), tool("a", args={"x": "{{ nodes.ghost.output }}"}), tool("lost")],
        [edge("t", "a")],
    )
    with pytest.raises(GraphError) as info:
        parse_graph(document)
    assert sorted(info.value.problems) == [
        "node 'a': data.args.x refers to unknown node 'ghost'",
        "node 'lost': unreachable from the trigger 't'",
    ]


def test_node_data_may_be_null_or_absent() -> None:
    graph = parse_graph(doc([{"id": "t", "type": "trigger", "data": None},
                             {"id": "o", "type": "output"}], [edge("t", "o")]))
    assert graph.nodes["t"].data == {}
    assert graph.nodes["o"].data == {}


def test_node_id_with_trailing_newline_is_rejected() -> None:
    with pytest.raises(GraphError):
        parse_graph(doc([trigger("t\n"), tool("a")], [edge("t\n", "a")]))


def test_yaml_date_inside_args_is_rejected_or_hashable() -> None:
    text = ("nodes:\n  - {id: t, type: trigger}\n"
            "  - {id: a, type: tool, data: {tool: echo, args: {when: 2024-01-01}}}\n"
            "edges:\n  - {source: t, target: a}\n")
    try:
        graph = parse_graph(text)
    except GraphError:
        return
    assert len(graph.hash) == 64
