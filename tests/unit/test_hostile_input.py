"""Hostile input, refused with a clear message before it costs anything: template injection against
the sandbox (escapes and memory bombs), documents nested past PAL_MAX_JSON_DEPTH, and random or
mangled documents thrown at the validator (hypothesis), which must only ever say GraphError."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pal.config import DEFAULT_MAX_JSON_DEPTH
from pal.core import templates
from pal.core.limits import json_depth
from pal.engine.runs import check_run_input
from pal.errors import GraphError, InputError, TemplateError
from pal.plan.interpreter import GraphProgram
from pal.plan.programs import parse_plan

CONTEXT = {"input": {"name": "Ada", "text": "a\nb", "pattern": "{:>100000000}", "n": 3}, "nodes": {}}

# Each would fill memory or burn CPU if rendered; each must be refused by the sandbox.
TEMPLATE_BOMBS = [
    "{{ 'a' * 100000000 }}",
    "{{ 100000000 * 'a' }}",
    "{{ [0] * 100000000 }}",
    "{{ ('a' * 1000000) * 1000000 }}",
    "{{ 9 ** (9 ** 9) }}",
    "{{ '%100000000d' % 1 }}",
    "{{ '%.100000000f' % 1 }}",
    "{{ '%*d' % (100000000, 1) }}",
    "{{ '%100000000d' | format(1) }}",
    "{{ 'a'.ljust(100000000) }}",
    "{{ 'a'.center(100000000) }}",
    "{{ input.name.zfill(100000000) }}",
    "{{ input.pattern.format(1) }}",
    "{{ '{0:>100000000}'.format(1) }}",
    "{{ '{}'.format_map({}) }}",
    "{{ 'a' | center(100000000) }}",
    "{{ input.text | indent(100000000) }}",
    "text {{ 'a' * 100000000 }} around",
]
# Escapes out of the sandbox, into Python's object graph.
TEMPLATE_ESCAPES = [
    "{{ input.__class__.__base__.__subclasses__() }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ input.name.__class__.__init__.__globals__ }}",
    "{{ (lambda: 1) }}",
    "{{ cycler.__init__.__globals__.os }}",
    "{{ self.__init__.__globals__ }}",
    "{{ namespace.__init__.__globals__ }}",
    "{% for c in [].__class__.__base__.__subclasses__() %}{{ c }}{% endfor %}",
    "{{ input.update({'x': 1}) }}",
    "{{ nodes.setdefault('a', 1) }}",
]
# The same operations at sane sizes keep working.
BENIGN = {
    "{{ 'ab' * 3 }}": "ababab",
    "{{ [1] * 2 }}": [1, 1],
    "{{ 2 ** 10 }}": 1024,
    "{{ '%05.1f' % 3.14159 }}": "003.1",
    "{{ '%s-%s' | format(input.name, input.n) }}": "Ada-3",
    "{{ input.text | indent(2) }}": "a\n  b",
    "{{ 'x' | center(5) }}": "  x  ",
    "{{ input.n % 2 }}": 1,
    "{{ input.name ~ '!' }}": "Ada!",
}


@pytest.mark.parametrize("text", TEMPLATE_BOMBS)
def test_template_bombs_are_refused_by_the_sandbox(text: str) -> None:
    with pytest.raises(TemplateError, match="refused by the sandbox"):
        templates.render_string(text, CONTEXT)


@pytest.mark.parametrize("text", TEMPLATE_ESCAPES)
def test_template_escapes_are_refused(text: str) -> None:
    with pytest.raises(TemplateError):
        templates.render_string(text, CONTEXT)


@pytest.mark.parametrize(("text", "expected"), BENIGN.items())
def test_the_same_operations_at_sane_sizes_still_render(text: str, expected: Any) -> None:
    assert templates.render_string(text, CONTEXT) == expected


def test_python_errors_in_a_template_are_template_errors() -> None:
    for text in ("{{ 1 / 0 }}", "{{ [1][5] }}", "{{ 'a' + 1 }}"):
        with pytest.raises(TemplateError, match="failed"):
            templates.render_string(text, CONTEXT)


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def test_depth_is_measured_without_recursion() -> None:
    assert json_depth(1, 10) == 0
    assert json_depth({"a": [1, {"b": []}]}, 10) == 4  # object, list, object, list
    assert json_depth(nested(200_000), 100) == 101  # stops counting past the limit


def test_run_input_deeper_than_the_limit_is_refused_with_the_setting_named() -> None:
    with pytest.raises(InputError, match="PAL_MAX_JSON_DEPTH"):
        check_run_input(nested(200_000), 10_000_000)
    with pytest.raises(InputError, match="more than 3 levels"):
        check_run_input(nested(4), 1000, max_depth=3)
    assert check_run_input(nested(3), 1000, max_depth=3) == nested(3)


def test_a_graph_of_nested_brackets_is_refused_not_a_crash() -> None:
    text = "[" * 100_000 + "]" * 100_000
    with pytest.raises(GraphError, match="nests too deeply"):
        parse_plan(text, known_tools=None, max_bytes=10_000_000)
    with pytest.raises(GraphError, match="PAL_MAX_JSON_DEPTH"):
        parse_plan(json.dumps({"nodes": nested(DEFAULT_MAX_JSON_DEPTH + 1)}), known_tools=None)


VALID = {
    "nodes": [{"id": "t", "type": "trigger"},
              {"id": "a", "type": "tool", "data": {"tool": "echo", "args": {"x": "{{ input.x }}"}}},
              {"id": "c", "type": "condition", "data": {"expression": "{{ nodes.a.output.x }}"}},
              {"id": "each", "type": "loop", "data": {"items": "{{ input.items }}", "body": {
                  "nodes": [{"id": "w", "type": "tool", "data": {"tool": "echo", "args": {"i": "{{ loop.item }}"}}}],
                  "edges": []}}},
              {"id": "out", "type": "output", "data": {"value": "{{ nodes.each.output }}"}}],
    "edges": [{"source": "t", "target": "a"}, {"source": "a", "target": "c"},
              {"source": "c", "target": "each", "sourceHandle": "true"}, {"source": "each", "target": "out"}],
}
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20)


def refused_cleanly(document: Any) -> None:
    """parse_plan accepts the document or raises GraphError naming at least one problem; nothing else."""
    try:
        parse_plan(document, known_tools=frozenset({"echo"}))
    except GraphError as exc:
        assert exc.problems and all(isinstance(p, str) and p for p in exc.problems)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(document=json_values)
def test_any_json_value_is_a_plan_or_a_graph_error(document: Any) -> None:
    refused_cleanly(document)


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=200))
def test_any_text_is_a_plan_or_a_graph_error(text: str) -> None:
    refused_cleanly(text)


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, (*path, index))
    return found


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_a_mangled_valid_graph_is_a_plan_or_a_graph_error(data: st.DataObject) -> None:
    """Replace or delete one part of a valid graph (any field, at any depth) with anything."""
    document = copy.deepcopy(VALID)
    path = data.draw(st.sampled_from(_paths(document)[1:]))
    parent = document
    for key in path[:-1]:
        parent = parent[key]
    if data.draw(st.booleans()):
        parent[path[-1]] = data.draw(json_values)
    elif isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent.pop(path[-1])
    refused_cleanly(document)


@settings(max_examples=100, deadline=None)
@given(items=st.lists(st.integers(), max_size=12))
def test_a_loop_runs_each_iteration_once_in_order_and_finishes(items: list[int]) -> None:
    """Drive the interpreter as the workers do: every dispatched step completes once."""
    program = parse_plan(VALID, known_tools=frozenset({"echo"})).program
    assert isinstance(program, GraphProgram)
    completed: dict[str, Any] = {}
    queue, ran = [program.first_step], []
    finished = False
    while queue:
        step = queue.pop(0)
        assert step not in completed, f"{step} dispatched twice"
        _, loop = program.view(step, completed)
        if step.startswith("each[") and step != "each[items]":  # a body step sees its own item
            index = len([s for s in ran if s.endswith(".w")])
            assert loop == {"item": items[index], "index": index, "count": len(items)}
        if step == "each":  # the loop collects every iteration's output, in order
            assert loop == {"results": [{"i": item} for item in items]}
        completed[step] = ({"result": True, "branch": "true"} if step == "c"
                           else {"items": items} if step == "each[items]"
                           else {"x": 1} if step == "a" else {"i": loop and loop.get("item")})
        ran.append(step)
        handoff = program.handoff(completed, step)
        queue += handoff.dispatch
        finished = finished or handoff.finished
    assert finished
    assert [s for s in ran if s.endswith(".w")] == [f"each[{i}].w" for i in range(len(items))]
    assert program.redrive_steps(completed) == ()
