"""YAML graph documents may not use anchors (&a) or aliases (*a): PAL_MAX_GRAPH_BYTES is checked
before decoding, and an alias expands after it (490 bytes of nested aliases ran past 60 s). Every
variant is refused with a GraphError naming the anchor or alias, before anything expands."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pal.core import document_text
from pal.errors import GraphError
from pal.plan.documents import load_graph_text
from pal.plan.graph import parse_graph
from pal.plan.programs import parse_plan

GRAPH_YAML = """\
nodes:
  - {id: t, type: trigger}
  - id: a
    type: tool
    data: {tool: echo, args: {x: "{{ input.x }}"}}
edges:
  - {source: t, target: a}
"""


def laughs(depth: int, fanout: int, flow: bool) -> str:
    """The billion laughs: each level is `fanout` aliases of the one before."""
    lines = ["l0: &l0 [lol]" if flow else "l0: &l0\n  - lol"]
    for level in range(1, depth + 1):
        aliases = [f"*l{level - 1}"] * fanout
        lines.append(f"l{level}: &l{level} [{', '.join(aliases)}]" if flow
                     else f"l{level}: &l{level}\n" + "\n".join(f"  - {a}" for a in aliases))
    return "\n".join(lines) + "\n"


def refused(text: str) -> GraphError:
    with pytest.raises(GraphError) as info:
        load_graph_text(text, max_bytes=1_000_000)
    assert any("anchor" in p or "alias" in p for p in info.value.problems), info.value.problems
    return info.value


def test_the_490_byte_bomb_is_refused() -> None:
    text = laughs(9, 9, flow=True)
    assert len(text.encode()) < 1000
    error = refused(text)
    assert "not allowed in graph documents" in str(error)


@settings(max_examples=60, deadline=None)
@given(depth=st.integers(1, 12), fanout=st.integers(1, 12), flow=st.booleans(),
       inside=st.sampled_from(["top", "args", "nodes"]))
def test_alias_bombs_are_refused(depth: int, fanout: int, flow: bool, inside: str) -> None:
    bomb = laughs(depth, fanout, flow)
    if inside == "args":  # the bomb inside a node's data, in an otherwise valid graph
        indented = "".join(f"        {line}\n" for line in bomb.splitlines())
        text = ("nodes:\n  - {id: t, type: trigger}\n  - id: a\n    type: tool\n    data:\n"
                "      tool: echo\n      args:\n" + indented + "edges:\n  - {source: t, target: a}\n")
    elif inside == "nodes":
        text = bomb + GRAPH_YAML
    else:
        text = bomb
    with pytest.raises(GraphError) as info:
        parse_plan(text, known_tools=frozenset({"echo"}), max_bytes=1_000_000)
    assert any("anchor" in p or "alias" in p for p in info.value.problems), info.value.problems


@pytest.mark.parametrize("text", [
    pytest.param("nodes:\n  - &t {id: t, type: trigger}\nedges: []\n", id="anchor-used-once-on-a-node"),
    pytest.param("nodes:\n  - {id: &x t, type: trigger}\nedges: []\n", id="anchor-on-a-scalar"),
    pytest.param("nodes: &n\n  - {id: t, type: trigger}\nedges: []\n", id="anchor-on-a-list"),
    pytest.param("nodes:\n  - {id: t, type: trigger}\nedges: *nope\n", id="alias-of-no-anchor"),
    pytest.param("base: &b {type: tool}\nnodes:\n  - <<: *b\n    id: a\n", id="merge-key"),
    pytest.param("? &k key\n: value\n", id="anchor-on-a-key"),
    pytest.param("x: !!str &a text\n", id="anchor-after-a-tag"),
    pytest.param("x: &a\n", id="anchor-on-nothing"),
    pytest.param("[&a 1, *a]", id="flow-sequence"),
    pytest.param("{a: &a 1, b: *a}", id="flow-mapping"),
])
def test_any_anchor_or_alias_is_refused(text: str) -> None:
    error = refused(text)
    assert any("line" in p for p in error.problems)


def test_the_message_names_the_anchor_and_its_line() -> None:
    error = refused("nodes:\n  - {id: t, type: trigger}\n  - &here {id: a, type: tool}\n")
    assert "&here (line 3)" in error.problems[0]
    error = refused("a: [1]\nb: *there\n")
    assert "*there (line 2)" in error.problems[0]


@pytest.mark.parametrize("text", [
    'nodes:\n  - {id: t, type: trigger, data: {label: "a &b *c"}}\nedges: []\n',
    "nodes:\n  - {id: t, type: trigger, data: {label: 'x *y &z'}}\nedges: []\n",
    "nodes:\n  - id: t\n    type: trigger\n    data: {label: a&b*c}\nedges: []\n",
])
def test_ampersands_and_stars_inside_strings_are_fine(text: str) -> None:
    graph = parse_graph(text)
    assert "&" in graph.nodes["t"].data["label"]


def test_a_plain_yaml_graph_still_parses() -> None:
    graph = parse_graph(GRAPH_YAML, known_tools=frozenset({"echo"}))
    assert set(graph.nodes) == {"t", "a"}


def test_json_is_not_affected() -> None:
    document = json.loads(json.dumps({"nodes": [{"id": "t", "type": "trigger", "data": {"label": "&a *a"}}],
                                      "edges": []}))
    assert parse_graph(json.dumps(document)).nodes["t"].data["label"] == "&a *a"


def test_node_count_is_bounded_while_composing(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(GraphError, match="more than 10 YAML nodes"):
        document_text.load_yaml("[" + ", ".join(["1"] * 20) + "]", max_nodes=10)
    assert document_text.load_yaml("[1, 2, 3]", max_nodes=10) == [1, 2, 3]
    monkeypatch.setattr(document_text, "MAX_YAML_NODES", 5)
    with pytest.raises(GraphError, match="YAML nodes"):
        load_graph_text(GRAPH_YAML)


def test_several_documents_are_still_a_yaml_error() -> None:
    with pytest.raises(GraphError, match="neither JSON nor YAML"):
        load_graph_text("a: 1\n---\nb: 2\n")
