"""Template rendering: native values for single expressions, text otherwise, strict and sandboxed."""

from __future__ import annotations

from typing import Any

import pytest

from pal.core import templates
from pal.errors import TemplateError

CONTEXT: dict[str, Any] = {
    "input": {"xs": [1, 2, 3], "n": 7, "flag": True, "name": "Ada", "nested": {"k": "v"}},
    "nodes": {"a": {"output": {"score": 0.5, "tags": ["x", "y"]}}},
    "run": {"id": "run_1"},
}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("{{ input.xs }}", [1, 2, 3], id="list"),
        pytest.param("{{ input.n }}", 7, id="int"),
        pytest.param("{{ input.flag }}", True, id="bool"),
        pytest.param("{{ input.n > 3 }}", True, id="comparison"),
        pytest.param("{{ input.nested }}", {"k": "v"}, id="dict"),
        pytest.param("  {{ nodes.a.output.tags }}\n", ["x", "y"], id="surrounding-whitespace"),
        pytest.param("{{ nodes.a.output.score * 2 }}", 1.0, id="float-arithmetic"),
        pytest.param("{{ input.xs | length }}", 3, id="filter"),
        pytest.param("{{ none }}", None, id="none-literal"),
    ],
)
def test_single_expression_keeps_native_type(text: str, expected: Any) -> None:
    value = templates.render_string(text, CONTEXT)
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("n={{ input.n }}", "n=7", id="prefix"),
        pytest.param("{{ input.n }} items", "7 items", id="suffix"),
        pytest.param("{{ input.name }}-{{ run.id }}", "Ada-run_1", id="two-expressions"),
        pytest.param("{{ input.xs }}!", "[1, 2, 3]!", id="list-in-text"),
        pytest.param("{% if input.flag %}yes{% endif %}", "yes", id="statement"),
    ],
)
def test_mixed_text_renders_to_str(text: str, expected: str) -> None:
    assert templates.render_string(text, CONTEXT) == expected


def test_plain_string_is_returned_unchanged() -> None:
    assert templates.render_string("no templates } here {", CONTEXT) == "no templates } here {"


def test_render_walks_nested_values() -> None:
    value = {"a": ["{{ input.n }}", "x{{ input.n }}"], "b": 3, "c": {"d": "{{ input.flag }}"}}
    assert templates.render(value, CONTEXT) == {"a": [7, "x7"], "b": 3, "c": {"d": True}}


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("{{ missing }}", id="undefined-name-single"),
        pytest.param("{{ input.missing }}", id="undefined-attribute-single"),
        pytest.param("{{ input.nested.k.deeper.still }}", id="attribute-of-undefined"),
        pytest.param("value: {{ input.missing }}", id="undefined-attribute-in-text"),
        pytest.param("value: {{ missing }}", id="undefined-name-in-text"),
        pytest.param("{{ nodes.zz.output }}", id="unknown-node"),
    ],
)
def test_undefined_raises_template_error(text: str) -> None:
    with pytest.raises(TemplateError) as info:
        templates.render_string(text, CONTEXT)
    assert repr(text) in str(info.value)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("{{ input.__class__.__mro__ }}", id="input-class-mro"),
        pytest.param("{{ ''.__class__ }}", id="str-class"),
        pytest.param("{{ ''.__class__.__mro__[1].__subclasses__() }}", id="subclasses"),
        pytest.param("x{{ ''.__class__ }}", id="in-text"),
        pytest.param("{{ input.xs.__class__ }}", id="list-class"),
    ],
)
def test_sandbox_refuses_dunder_attribute_access(text: str) -> None:
    with pytest.raises(TemplateError):
        templates.render_string(text, CONTEXT)


def test_sandbox_refusal_is_reported_as_such() -> None:
    with pytest.raises(TemplateError, match="unsafe"):
        templates.render_string("{{ ''.__class__ }}", CONTEXT)


def test_immutable_sandbox_refuses_mutation() -> None:
    with pytest.raises(TemplateError, match="refused by the sandbox"):
        templates.render_string("{{ input.xs.append(4) }}", CONTEXT)
    assert CONTEXT["input"]["xs"] == [1, 2, 3]


def test_input_key_named_like_a_dict_method_renders_its_value() -> None:
    assert templates.render_string("{{ input.items }}", {"input": {"items": [1]}}) == [1]


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("plain text", id="plain"),
        pytest.param("{{ input.x }}", id="input"),
        pytest.param("{{ nodes.a.output.y }} and {{ run.id }}", id="nodes-and-run"),
        pytest.param("{% for i in input.xs %}{{ i }}{% endfor %}", id="loop-variable"),
        pytest.param("{% set k = 1 %}{{ k }}", id="set-variable"),
    ],
)
def test_check_accepts_valid_templates(text: str) -> None:
    assert templates.check(text) is None


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        pytest.param("{{ input.x ", "template syntax error", id="unclosed-expression"),
        pytest.param("{% if input.x %}yes", "template syntax error", id="unclosed-block"),
        pytest.param("{{ input. }}", "template syntax error", id="dangling-dot"),
        pytest.param("{{ secret }}", "unknown name(s) secret (allowed: input, loop, nodes, run)",
                     id="unknown-name"),
        pytest.param("{{ a }}{{ b }}", "unknown name(s) a, b", id="two-unknown-names"),
    ],
)
def test_check_reports_problems(text: str, fragment: str) -> None:
    message = templates.check(text)
    assert message is not None
    assert fragment in message


def test_check_quotes_the_text_on_syntax_errors() -> None:
    message = templates.check("{{ input.x ")
    assert message is not None and repr("{{ input.x ") in message


def test_has_template() -> None:
    assert templates.has_template("a {{ b }}")
    assert templates.has_template("{% raw %}")
    assert templates.has_template("{# note #}")
    assert not templates.has_template("a { b } c")


def test_iter_strings_yields_paths() -> None:
    value = {"a": "x", "b": [1, "y", {"c": "z"}], "d": 2}
    assert list(templates.iter_strings(value)) == [("a", "x"), ("b[1]", "y"), ("b[2].c", "z")]


def test_undefined_inside_a_list_expression_raises() -> None:
    with pytest.raises(TemplateError):
        templates.render_string("{{ [input.missing] }}", CONTEXT)
