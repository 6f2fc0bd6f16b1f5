"""Template bombs, family by family, in many generated variants: each is refused with a TemplateError
by the sandbox's allow-lists or its render budget (pal.core.limits, pal.core.template_sandbox), while the
templates graphs really use still render.

No test times anything. Each bomb, if it were not refused, would build a value of gigabytes or run
for hours; that the render returns a TemplateError at all is the proof that it stopped at a limit
(MAX_TEMPLATE_VALUE, MAX_RENDER_WORK, MAX_RENDER_STEPS) instead."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pal.core import limits, templates
from pal.errors import TemplateError

BIG = "x" * 500_000
CONTEXT: dict[str, Any] = {
    "input": {"name": "Ada", "n": 12345, "xs": list(range(1000)), "text": "a\nb\nc", "big": BIG,
              "rows": [{"id": i, "name": f"n{i}"} for i in range(50)], "nested": {"k": "v", "j": 2},
              "flag": True, "quote": '"'},
    "nodes": {"a": {"output": {"tags": ["x", "y"], "score": 0.5}}},
    "run": {"id": "run_1"},
}
BOMB_SETTINGS = settings(max_examples=25, deadline=None)


def refused(text: str, match: str | None = "refused by the sandbox") -> None:
    with pytest.raises(TemplateError) as info:
        templates.render_string(text, CONTEXT)
    if match:
        assert match in str(info.value)


# -- join of a repeated list --------------------------------------------------------------------

@BOMB_SETTINGS
@given(count=st.integers(10, 10**9), item=st.sampled_from(["'a'", "input.name", "1", "input.xs"]),
       separator=st.integers(0, 10_000))
def test_join_of_a_repeated_list(count: int, item: str, separator: int) -> None:
    sep_len = max(separator, 3_000_000 // count + 1)
    refused(f"{{{{ ([{item}] * {count}) | join('{'-' * sep_len}') }}}}")


@BOMB_SETTINGS
@given(count=st.integers(2_001, 10**9))
def test_join_of_a_repeated_input_list(count: int) -> None:
    refused(f"{{{{ (input.xs * {count}) | join(',') }}}}")


# -- nested loops -------------------------------------------------------------------------------

LOOP_SOURCES = ["input.xs", "input.xs | list", "input.big[:1000]", "input.rows * 20",
                "input.xs | map('string')", "input.xs | select('odd') | list | list"]
LOOP_BODIES = ["", "x", "{{ @ }}", "{% if @ %}y{% endif %}", "{{ input.name | upper }}"]  # @: loop variable


@BOMB_SETTINGS
@given(depth=st.integers(2, 6), source=st.sampled_from(LOOP_SOURCES), body=st.sampled_from(LOOP_BODIES))
def test_nested_for_loops(depth: int, source: str, body: str) -> None:
    text = "".join(f"{{% for v{i} in {source} %}}" for i in range(depth)) + body.replace("@", "v0")
    text += "{% endfor %}" * depth
    refused(text)


@BOMB_SETTINGS
@given(count=st.integers(2, 5))
def test_loops_inside_a_set_block(count: int) -> None:
    loops = "{% for a in input.xs %}" * count + "{{ input.name }}" + "{% endfor %}" * count
    refused(f"{{% set s %}}{loops}{{% endset %}}{{{{ s | length }}}}")


# -- namespace, dict() and the other globals are gone -------------------------------------------

@pytest.mark.parametrize("text", [
    "{% set ns = namespace(s='a') %}{% for i in input.xs %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}",
    "{% set ns.s = 'a' %}",
    "{{ namespace(a=1) }}", "{{ dict(a=1) }}", "{{ lipsum(1000000) }}", "{{ range(10**9) | list }}",
    "{{ cycler(1, 2) }}", "{{ joiner(',') }}",
])
def test_namespace_and_globals_are_not_available(text: str) -> None:
    refused(text, match=None)


# -- replace ------------------------------------------------------------------------------------

@BOMB_SETTINGS
@given(doublings=st.integers(22, 40), style=st.sampled_from(["filter", "method"]))
def test_replace_doubling(doublings: int, style: str) -> None:
    step = " | replace('a', 'aa')" if style == "filter" else ".replace('a', 'aa')"
    refused("{{ 'a'" + step * doublings + " }}", match=None)  # nesting past 48 is refused as well


@BOMB_SETTINGS
@given(old=st.sampled_from(["x", "", "xx"]), factor=st.integers(10, 10**6),
       style=st.sampled_from(["filter", "method"]))
def test_replace_growth_from_input(old: str, factor: int, style: str) -> None:
    new = "y" * factor
    call = f"| replace('{old}', '{new}')" if style == "filter" else f".replace('{old}', '{new}')"
    refused(f"{{{{ input.big {call} }}}}")


# -- ~ concatenation ----------------------------------------------------------------------------

@BOMB_SETTINGS
@given(doublings=st.integers(21, 60), start=st.sampled_from(["'ab'", "input.name", "input.xs | string"]))
def test_concat_doubling_with_set(doublings: int, start: str) -> None:
    refused(f"{{% set s = {start} %}}" + "{% set s = s ~ s %}" * doublings + "{{ s | length }}")


@BOMB_SETTINGS
@given(parts=st.integers(5, 200))
def test_concat_of_big_values_in_one_expression(parts: int) -> None:
    refused("{{ " + " ~ ".join(["input.big"] * parts) + " }}")


@BOMB_SETTINGS
@given(pieces=st.integers(2, 8))
def test_concat_in_a_loop_that_outputs(pieces: int) -> None:
    refused("{% for i in input.xs %}{{ " + " ~ ".join(["input.big[:100000]"] * pieces) + " }}{% endfor %}")


# -- list * n, literals that alias ---------------------------------------------------------------

@BOMB_SETTINGS
@given(count=st.integers(2_000_001, 10**12), item=st.sampled_from(["0", "'a'", "input.name", "none"]),
       flipped=st.booleans())
def test_list_times_n(count: int, item: str, flipped: bool) -> None:
    refused(f"{{{{ {count} * [{item}] }}}}" if flipped else f"{{{{ [{item}] * {count} }}}}")


@BOMB_SETTINGS
@given(levels=st.integers(3, 8), count=st.integers(200, 5000))
def test_nested_repetition(levels: int, count: int) -> None:
    text = "{% set a = [input.name] %}" + f"{{% set a = [a] * {count} %}}" * levels + "{{ a }}"
    refused(text)


@BOMB_SETTINGS
@given(levels=st.integers(21, 60), width=st.integers(2, 4))
def test_literals_that_repeat_one_value(levels: int, width: int) -> None:
    refused("{% set a = [1] %}" + f"{{% set a = [{', '.join(['a'] * width)}] %}}" * levels + "{{ a | tojson }}")


@BOMB_SETTINGS
@given(levels=st.integers(21, 60))
def test_a_tuple_that_doubles_used_as_a_key(levels: int) -> None:
    refused("{% set t = (1,) %}" + "{% set t = (t, t) %}" * levels + "{{ {t: 1} }}")


# -- dict growth --------------------------------------------------------------------------------

@BOMB_SETTINGS
@given(levels=st.integers(21, 60), output=st.sampled_from(["{{ d }}", "{{ d | tojson }}", "{{ d | string }}",
                                                         "{{ d == d }}", "{{ d | dictsort }}"]))
def test_dict_doubling(levels: int, output: str) -> None:
    refused("{% set d = {'k': input.name} %}" + "{% set d = {'a': d, 'b': d} %}" * levels + output)


def test_dict_update_is_not_allowed() -> None:
    refused("{% set d = {} %}{{ d.update({'a': 1}) }}")
    refused("{% set d = {} %}{{ d.setdefault('a', []) }}")


# -- string methods -----------------------------------------------------------------------------

@BOMB_SETTINGS
@given(method=st.sampled_from(["ljust", "rjust", "center", "zfill", "expandtabs", "format", "format_map",
                               "translate", "join", "encode", "maketrans"]),
       width=st.integers(1, 10**10), on=st.sampled_from(["'a'", "input.name", "input.text"]))
def test_padding_and_formatting_methods_are_refused(method: str, width: int, on: str) -> None:
    refused(f"{{{{ {on}.{method}({width}) }}}}")


@BOMB_SETTINGS
@given(factor=st.integers(5, 10**6))
def test_allowed_methods_cannot_grow_past_the_limit(factor: int) -> None:
    refused(f"{{{{ input.big.replace('', '{'z' * factor}') }}}}")


# -- printf widths ------------------------------------------------------------------------------

FORMATS = ["'%{w}d' % 1", "'%-{w}s' % 'a'", "'%0{w}.2f' % 1.5", "'%.{w}f' % 1.5", "'%(k){w}s' % {{'k': 1}}",
           "'%(k(j)){w}s' % {{'k(j)': 1}}", "'%#{w}x' % 255", "'%{w}d' | format(1)", "'%.{w}e' | format(1.0)",
           "'a%%%{w}s' % 'b'", "'%s %{w}s' % ('a', 'b')"]


@BOMB_SETTINGS
@given(pattern=st.sampled_from(FORMATS), width=st.integers(1001, 10**40))
def test_wide_printf_fields(pattern: str, width: int) -> None:
    refused("{{ " + pattern.format(w=width) + " }}")


@pytest.mark.parametrize("text", ["{{ '%*d' % (1000000, 1) }}", "{{ '%.*f' % (1000000, 1.0) }}",
                                  "{{ '%*d' | format(5, 1) }}"])
def test_star_widths_are_refused(text: str) -> None:
    refused(text)


@BOMB_SETTINGS
@given(specs=st.integers(7_000, 100_000))
def test_many_moderate_fields(specs: int) -> None:
    refused("{{ ('%999d' * " + str(specs) + ") % ((1,) * " + str(specs) + ") }}")


# -- recursion: macros, call blocks, recursive loops, includes ----------------------------------

@pytest.mark.parametrize("text", [
    "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
    "{% macro f(n) %}{{ f(n) }}{{ f(n) }}{% endmacro %}{{ f(1) }}",
    "{% macro f() %}{{ caller() }}{% endmacro %}{% call f() %}{{ f() }}{% endcall %}",
    "{% for x in input.xs recursive %}{{ loop(input.xs) }}{% endfor %}",
    "{% block a %}{{ self.a() }}{{ self.a() }}{% endblock %}",
    "{% include 'x' %}", "{% import 'x' as y %}", "{% from 'x' import y %}", "{% extends 'x' %}",
    "{{ self }}", "{% autoescape true %}x{% endautoescape %}",
])
def test_recursion_and_template_loading_are_refused(text: str) -> None:
    refused(text)
    assert templates.check(text) is not None


# -- {% set %} doubling -------------------------------------------------------------------------

@BOMB_SETTINGS
@given(doublings=st.integers(21, 80), output=st.sampled_from(["{{ s | length }}", "{{ s }}", "x"]))
def test_set_block_doubling(doublings: int, output: str) -> None:
    refused("{% set s %}ab{% endset %}" + "{% set s %}{{ s }}{{ s }}{% endset %}" * doublings + output)


@BOMB_SETTINGS
@given(doublings=st.integers(21, 80), op=st.sampled_from(["s + s", "s ~ s", "s * 2", "[s, s]", "(s, s)"]))
def test_set_doubling(doublings: int, op: str) -> None:
    refused("{% set s = 'ab' %}" + f"{{% set s = {op} %}}" * doublings + "{{ s | string | length }}")


# -- chained filters ----------------------------------------------------------------------------

@BOMB_SETTINGS
@given(chain=st.lists(st.sampled_from(["tojson", "list | string", "tojson | tojson"]),
                      min_size=20, max_size=40))
def test_chained_filters_that_grow_text(chain: list[str]) -> None:
    refused("{{ input.quote | " + " | ".join(chain) + " }}", match=None)


@BOMB_SETTINGS
@given(width=st.integers(100, 1000), repeat=st.integers(6, 20))
def test_chains_of_padding_filters(width: int, repeat: int) -> None:
    step = f" | center({width}) | indent({width}, true, true) | replace(' ', '{' ' * 10}')"
    refused("{{ input.text" + step * repeat + " }}", match=None)


@BOMB_SETTINGS
@given(filter_=st.sampled_from(["center", "indent"]), width=st.integers(1001, 10**12))
def test_wide_padding_filters(filter_: str, width: int) -> None:
    refused(f"{{{{ input.text | {filter_}({width}) }}}}")


def test_indent_by_a_long_string() -> None:
    refused("{{ input.big[:100000] | replace('x', 'x\\n') | indent(input.big[:1000]) }}")


@pytest.mark.parametrize("text", [
    "{{ input.xs | map('string') | map('center', 1000) | join | center(1) ~ input.big ~ input.big ~ input.big }}",
    "{{ input.xs | sum(start=[]) }}", "{{ input.xs | map('string') | sum(start='') }}",
    "{{ input.big | tojson(indent=9) }}", "{{ input.rows | tojson(indent=8) * 1000 }}",
    "{{ input.n | round(-10000000) }}", "{{ input.xs | map('round', -10000000) | list }}",
    "{{ input.n | round(1.5) }}", "{{ input.big | list }}{{ input.big | list }}",
    "{{ input.xs | batch(10**9) }}", "{{ input.xs | slice(10**9) }}", "{{ input.big | wordwrap(1) }}",
    "{{ 123 | filesizeformat }}", "{{ input.big | urlize }}", "{{ input.xs | random }}",
    "{{ input.nested | xmlattr }}", "{{ input | pprint }}", "{{ input | attr('name') }}",
    "{{ input.xs | groupby('x') }}", "{{ input.big | striptags }}",
])
def test_other_growth_and_dropped_filters(text: str) -> None:
    refused(text, match=None)


# -- numbers ------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "{{ 9 ** (9 ** 9) }}", "{{ (9 ** 9) ** (9 ** 9) }}", "{{ 2 ** 1000000 }}", "{% set n = 2 ** 60000 %}{{ n * n }}",
    "{% set n = 7 ** 30000 %}{% set n = n * n %}{% set n = n * n %}{{ n }}",
])
def test_big_integers(text: str) -> None:
    refused(text)


# -- the CPU-time limit -------------------------------------------------------------------------

def test_the_cpu_time_limit_stops_a_render(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no time left and the clock read at every charge, the first hook refuses: the same check
    that ends any render which runs past MAX_RENDER_CPU_SECONDS."""
    monkeypatch.setattr(limits, "MAX_RENDER_CPU_SECONDS", -1.0)
    monkeypatch.setattr(limits, "CLOCK_EVERY", 1)
    refused("{% for a in input.xs %}{{ a }}{% endfor %}", match="CPU time")


# -- whatever the composition, a render ends in a value within the limits or a TemplateError -------

ATOMS = ["input.name", "input.xs", "input.big", "input.rows", "input.text", "'ab'", "3", "1000", "[1, 2]",
         "input.nested", "input.n"]
UNARY = ["({0} | join(','))", "({0} | string)", "({0} | tojson)", "({0} | list)", "({0} | center(900))",
         "({0} | replace('a', 'aaaa'))", "({0} * 1000)", "({0} ~ {0})", "({0} + {0})", "[{0}, {0}, {0}]",
         "({0} | indent(500, true, true))", "({0} | map('string') | join)", "({0} | sort)",
         "({0} | unique | list)", "({0} | reverse | list)", "({0} | format(1))", "({0} % 3)",
         "({0} | selectattr('id') | list)", "({0} | dictsort)", "({0}[::-1])", "({0} | first)"]
expressions = st.recursive(st.sampled_from(ATOMS),
                           lambda inner: st.tuples(st.sampled_from(UNARY), inner).map(lambda p: p[0].format(p[1])),
                           max_leaves=12)


@settings(max_examples=50, deadline=None)  # an example may spend a render's 2 s of CPU
@given(expression=expressions, loops=st.integers(0, 3), in_text=st.booleans())
def test_any_composition_ends_within_the_limits(expression: str, loops: int, in_text: bool) -> None:
    body = f"{{{{ {expression} }}}}" + ("!" if in_text else "")
    text = "{% for i in input.xs %}" * loops + body + "{% endfor %}" * loops
    try:
        value = templates.render_string(text, CONTEXT)
    except TemplateError:
        return
    printed = value if isinstance(value, str) else json.dumps(value, default=str)
    assert len(printed) <= 6 * limits.MAX_RENDER_OUTPUT


# -- what graphs use still renders --------------------------------------------------------------

LEGIT: dict[str, Any] = {
    "{{ input.name }}": "Ada",
    "Hello {{ input.name }}!": "Hello Ada!",
    "{{ input.xs | length }}": 1000,
    "{{ input.n > 100 }}": True,
    "{{ nodes.a.output.tags }}": ["x", "y"],
    "{{ nodes.a.output.score * 2 }}": 1.0,
    "{{ run.id }}": "run_1",
    "{{ input.name | upper }}": "ADA",
    "{{ input.name ~ '!' }}": "Ada!",
    "{{ 'ab' * 3 }}": "ababab",
    "{{ [1] * 2 }}": [1, 1],
    "{{ 2 ** 10 }}": 1024,
    "{{ '%05.1f' % 3.14159 }}": "003.1",
    "{{ '%s-%s' | format(input.name, input.n) }}": "Ada-12345",
    "{{ input.text | indent(2) }}": "a\n  b\n  c",
    "{{ 'x' | center(5) }}": "  x  ",
    "{{ input.n % 2 }}": 1,
    "{{ input.rows | map(attribute='name') | join(', ') }}": ", ".join(f"n{i}" for i in range(50)),
    "{{ input.xs | select('odd') | list | length }}": 500,
    "{{ input.xs | reject('in', [1, 2, 3]) | list | first }}": 0,
    "{{ input.xs | sum }}": sum(range(1000)),
    "{{ input.xs | sort(reverse=true) | first }}": 999,
    "{{ input.xs[:3] }}": [0, 1, 2],
    "{{ input.xs[-1] }}": 999,
    "{{ input.nested | dictsort }}": [("j", 2), ("k", "v")],
    "{{ input.nested | tojson }}": '{"j": 2, "k": "v"}',
    "{{ input.nested.get('k') }}": "v",
    "{% for k, v in input.nested.items() %}{{ k }}={{ v }};{% endfor %}": "k=v;j=2;",
    "{% for r in input.rows[:3] %}{{ loop.index }}:{{ r.name }} {% endfor %}": "1:n0 2:n1 3:n2 ",
    "{% for r in input.rows if r.id > 47 %}{{ r.id }}{% else %}none{% endfor %}": "4849",
    "{% set k = 1 %}{{ k }}": "1",
    "{% set s %}in {{ input.name }}{% endset %}{{ s }}": "in Ada",
    "{% set s | upper %}abc{% endset %}{{ s }}": "ABC",
    "{% filter upper %}x{{ input.name }}{% endfilter %}": "XADA",
    "{% with a = input.n %}{{ a + 1 }}{% endwith %}": "12346",
    "{{ input.n if input.flag else 0 }}": 12345,
    "{{ 'd' in input.name }}": True,
    "{{ input.text.split() }}": ["a", "b", "c"],
    "{{ input.name.replace('a', 'o') }}": "Ado",
    "{{ input.name | replace('A', 'E') | lower }}": "eda",
    "{{ input.big | truncate(10) }}": "xxxxxxx...",
    "{{ input.n | round(-2) }}": 12300,
    "{{ 3.14159 | round(2) }}": 3.14,
    "{{ input.rows | selectattr('id', 'gt', 48) | map(attribute='id') | list }}": [49],
    "{{ {'a': input.name, 'b': [1, 2]} }}": {"a": "Ada", "b": [1, 2]},
    "{{ (1, 2) }}": (1, 2),
    "{{ input.big | length }}": 500_000,
    "{{ input.big }}": BIG,
    "x{{ input.big }}": "x" + BIG,
    "{{ input.big | tojson | length }}": 500_002,
    "{{ (input.big ~ input.big) | length }}": 1_000_000,
    "{{ input.xs | map('string') | join(',') | length }}": len(",".join(map(str, range(1000)))),
    "{% for a in input.xs %}{% for b in input.xs[:50] %}.{% endfor %}{% endfor %}": "." * 50_000,
    "{{ input.name | default('x') }}{{ input.missing | default('y') }}": "Aday",
    "{{ input.text | wordcount }}": 3,
    "{{ input | urlencode | length > 0 }}": True,
    "{{ input.xs[:6] | select('odd') }}": [1, 3, 5],
}


@pytest.mark.parametrize(("text", "expected"), LEGIT.items(), ids=[str(i) for i in range(len(LEGIT))])
def test_what_graphs_use_still_renders(text: str, expected: Any) -> None:
    assert templates.check(text) is None or "unknown name" in str(templates.check(text))
    assert templates.render_string(text, CONTEXT) == expected


@pytest.mark.parametrize("text", ["{{ input.xs | indent }}", "{{ input.xs | sum(start=input.xs) }}",
                                  "{{ input.xs.append(1) }}", "{{ input.nested.update({'a': 1}) }}"])
def test_no_filter_or_method_changes_the_input(text: str) -> None:
    before = json.dumps(CONTEXT, sort_keys=True)
    with contextlib.suppress(TemplateError):
        templates.render_string(text, CONTEXT)
    assert json.dumps(CONTEXT, sort_keys=True) == before


def test_one_render_of_many_fields_shares_one_budget() -> None:
    """`render` walks a node's data under one budget: a field per copy of a big input adds up."""
    many = {f"f{i}": "x{{ input.big }}" for i in range(20)}
    with pytest.raises(TemplateError, match="larger than"):
        templates.render(many, CONTEXT)
    assert templates.render({"a": "{{ input.name }}", "b": ["{{ input.n }}"]}, CONTEXT) == {
        "a": "Ada", "b": [12345]}


def test_limits_are_stated_in_the_message() -> None:
    with pytest.raises(TemplateError, match=str(limits.MAX_TEMPLATE_VALUE)):
        templates.render_string("{{ 'a' * 3000000 }}", CONTEXT)
    with pytest.raises(TemplateError, match=str(limits.MAX_RENDER_STEPS)):
        templates.render_string("{% for a in input.xs %}{% for b in input.xs %}{% endfor %}{% endfor %}",
                                CONTEXT)


@pytest.mark.parametrize(("text", "fragment"), [
    ("{{ x | wordwrap }}", "unknown filter 'wordwrap'"),
    ("{{ x is callable }}", "unknown test 'callable'"),
    ("{% macro m() %}{% endmacro %}", "macro"),
    ("{% for x in y recursive %}{% endfor %}", "recursive loops"),
    ("{{ " + "[" * 60 + "1" + "]" * 60 + " }}", "too large"),
    ("{{ input.x" + " | upper" * 2000 + " }}", "too large"),
    ("{{ " + "(" * 400 + "1" + ")" * 400 + " }}", "nests too deeply"),
])
def test_validation_reports_what_the_sandbox_refuses(text: str, fragment: str) -> None:
    message = templates.check(text)
    assert message is not None and fragment in message
