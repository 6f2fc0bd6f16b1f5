"""Templates in node data: `{{ input.x }}`, `{{ nodes.a.output.y }}`, rendered in Jinja2's sandbox.

A string that is exactly one `{{ expression }}` evaluates to the expression's own value (a list
stays a list); any other string with template syntax renders to text. Undefined values are errors.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from functools import lru_cache
from typing import Any

import jinja2
from jinja2 import meta
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from pal.errors import TemplateError

ALLOWED_NAMES = frozenset({"input", "nodes", "run", "loop"})
_SINGLE_EXPRESSION = re.compile(r"^\s*\{\{(?P<expr>(?:(?!\}\}|\{\{|\{%|\{#).)*)\}\}\s*$", re.S)
_SYNTAX_MARKERS = ("{{", "{%", "{#")

# Jinja's sandbox stops attribute escapes and bounds range(), but `'a' * 10**9`, `'%999999999d' % 1`
# or `'a'.ljust(10**9)` would still fill a worker's memory: whatever can grow a value is bounded.
MAX_RESULT_CHARS = 1_000_000  # the largest string or list one operation may build
MAX_WIDTH = 1000  # the largest padding width or precision a format may ask for
MAX_POWER_BITS = 100_000  # the largest integer `**` may build
_PADDING_METHODS = frozenset({"ljust", "rjust", "center", "zfill", "expandtabs", "format", "format_map"})
_FORMAT_NUMBERS = re.compile(r"%[#0\- +]*(\*|\d*)(?:\.(\*|\d*))?")


def _check_printf(pattern: str) -> None:
    for width, precision in _FORMAT_NUMBERS.findall(pattern):
        for number in (width, precision):
            if number == "*" or (number and int(number) > MAX_WIDTH):
                raise SecurityError(f"format widths above {MAX_WIDTH} are not allowed")


def _check_size(size: int) -> None:
    if size > MAX_RESULT_CHARS:
        raise SecurityError(f"the result would hold {size} items, over the limit of {MAX_RESULT_CHARS}")


class _GraphEnvironment(ImmutableSandboxedEnvironment):
    """`input.items` means the input's "items" key, not dict.items: keys win over attributes."""

    intercepted_binops = frozenset({"*", "**", "%"})

    def getattr(self, obj: Any, attribute: str) -> Any:
        if isinstance(obj, Mapping) and attribute in obj:
            return obj[attribute]
        return super().getattr(obj, attribute)

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        if isinstance(obj, str) and attr in _PADDING_METHODS:
            return False
        return bool(super().is_safe_attribute(obj, attr, value))

    def wrap_str_format(self, value: Any) -> Any:
        # The sandbox hands str.format out before any attribute check; its padding is unbounded.
        if getattr(value, "__name__", None) in ("format", "format_map") and isinstance(
                getattr(value, "__self__", None), str):
            raise SecurityError("str.format is not allowed in templates; use ~ or the format filter")
        return super().wrap_str_format(value)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            for seq, times in ((left, right), (right, left)):
                if isinstance(seq, str | list | tuple) and isinstance(times, int):
                    _check_size(len(seq) * times)
        elif operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0:
            if abs(left) > 1 and abs(left).bit_length() * right > MAX_POWER_BITS:
                raise SecurityError(f"the power would exceed {MAX_POWER_BITS} bits")
        elif operator == "%" and isinstance(left, str):
            _check_printf(left)
        return super().call_binop(context, operator, left, right)


def _bounded_filter(name: str) -> Any:
    original = jinja2.filters.FILTERS[name]

    def bounded(value: Any, *args: Any, **kwargs: Any) -> Any:
        if name == "format":
            _check_printf(str(value))
        elif any(isinstance(a, int) and a > MAX_WIDTH for a in (*args, *kwargs.values())):
            raise SecurityError(f"{name} widths above {MAX_WIDTH} are not allowed")
        return original(value, *args, **kwargs)

    return bounded


_env = _GraphEnvironment(undefined=jinja2.StrictUndefined, autoescape=False)
for _name in ("center", "indent", "format", "wordwrap", "truncate"):
    _env.filters[_name] = _bounded_filter(_name)


def _reject_undefined(value: Any) -> Any:
    """StrictUndefined only raises when used; one hidden in a list or dict must raise too."""
    if isinstance(value, jinja2.Undefined):
        str(value)  # raises UndefinedError with Jinja's own message
    elif isinstance(value, Mapping):
        for item in value.values():
            _reject_undefined(item)
    elif isinstance(value, list | tuple):
        for item in value:
            _reject_undefined(item)
    return value


def has_template(text: str) -> bool:
    return any(marker in text for marker in _SYNTAX_MARKERS)


def iter_strings(value: Any, path: str = "") -> Iterator[tuple[str, str]]:
    """Yield (path, string) for every string inside a JSON-like value."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from iter_strings(item, f"{path}.{key}" if path else str(key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from iter_strings(item, f"{path}[{index}]")


def check(text: str) -> str | None:
    """Return a description of what is wrong with template `text`, or None when it is valid."""
    if not has_template(text):
        return None
    try:
        ast = _env.parse(text)
    except jinja2.TemplateSyntaxError as exc:
        return f"template syntax error: {exc.message} in {text!r}"
    unknown = sorted(meta.find_undeclared_variables(ast) - ALLOWED_NAMES)
    if unknown:
        allowed = ", ".join(sorted(ALLOWED_NAMES))
        return f"template uses unknown name(s) {', '.join(unknown)} (allowed: {allowed})"
    return None


@lru_cache(maxsize=4096)
def _compiled_expression(expr: str) -> Any:
    return _env.compile_expression(expr, undefined_to_none=False)


@lru_cache(maxsize=4096)
def _compiled_template(text: str) -> jinja2.Template:
    return _env.from_string(text)


def render_string(text: str, context: Mapping[str, Any]) -> Any:
    if not has_template(text):
        return text
    try:
        single = _SINGLE_EXPRESSION.match(text)
        if single:
            return _reject_undefined(_compiled_expression(single.group("expr").strip())(**context))
        return _compiled_template(text).render(**context)
    except jinja2.exceptions.SecurityError as exc:
        raise TemplateError(f"template refused by the sandbox: {exc} in {text!r}") from exc
    except jinja2.TemplateError as exc:
        raise TemplateError(f"template {text!r} failed: {exc}") from exc
    except (ArithmeticError, LookupError, TypeError, ValueError) as exc:  # {{ 1/0 }}, {{ x[99] }}
        raise TemplateError(f"template {text!r} failed: {type(exc).__name__}: {exc}") from exc


def render(value: Any, context: Mapping[str, Any]) -> Any:
    """Render every template string inside a JSON-like value."""
    if isinstance(value, str):
        return render_string(value, context)
    if isinstance(value, Mapping):
        return {key: render(item, context) for key, item in value.items()}
    if isinstance(value, list):
        return [render(item, context) for item in value]
    return value
