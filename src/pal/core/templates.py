"""Templates in node data: `{{ input.x }}`, `{{ nodes.a.output.y }}`, `{{ secrets.NAME }}`, rendered in
a bounded Jinja2 sandbox (pal.core.template_sandbox; its limits are in pal.core.limits).

A string that is exactly one `{{ expression }}` evaluates to the expression's own value (a list
stays a list); any other string with template syntax renders to text. Undefined values are errors.
A secret is resolved (pal.core.secrets) only when a template that names it renders, in the worker.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, NoReturn

import jinja2
from jinja2 import meta
from jinja2.exceptions import SecurityError

from pal.core import secrets
from pal.core.limits import RenderBudget, bounded_render, no_render
from pal.core.redact import redact_bounded
from pal.core.template_sandbox import SECRETS, BoundedEnvironment, inspect_template
from pal.errors import TemplateError

ALLOWED_NAMES = frozenset({"input", "nodes", "run", "loop"})
_SINGLE_EXPRESSION = re.compile(r"^\s*\{\{(?P<expr>(?:(?!\}\}|\{\{|\{%|\{#).)*)\}\}\s*$", re.S)
_SYNTAX_MARKERS = ("{{", "{%", "{#")
MAX_MESSAGE = 2000

_env = BoundedEnvironment()


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
    except RecursionError:
        return f"template nests too deeply in {text!r}"
    problems = inspect_template(ast).problems
    if problems:
        return f"{problems[0]} in {text!r}"
    unknown = sorted(meta.find_undeclared_variables(ast) - ALLOWED_NAMES - {SECRETS})
    if unknown:
        allowed = ", ".join(sorted(ALLOWED_NAMES))
        return (f"template uses unknown name(s) {', '.join(unknown)} (allowed: {allowed}); "
                "a secret is read as secrets.NAME")
    return None


@dataclass(frozen=True)
class _Prepared:
    secret_names: frozenset[str]
    expression: Any  # a compiled single expression, or None
    template: jinja2.Template | None


def _prepare(text: str) -> _Prepared:
    # Graph templates are short and rendered again and again; a long one (a graph may hold a 1 MB
    # string) is compiled each time rather than kept, so the cache holds at most 4096 x 16 kB.
    return _compile(text) if len(text) > 16_384 else _cached(text)


def _compile(text: str) -> _Prepared:
    shape = inspect_template(_env.parse(text))
    if shape.problems:
        raise SecurityError(shape.problems[0])
    with no_render():  # compiling runs no template code (see BoundedEnvironment.__init__)
        single = _SINGLE_EXPRESSION.match(text)
        if single:
            expression = _env.compile_expression(single.group("expr").strip(), undefined_to_none=False)
            return _Prepared(shape.secret_names, expression, None)
        return _Prepared(shape.secret_names, None, _env.from_string(text))


_cached = lru_cache(maxsize=4096)(_compile)


def _run(prepared: _Prepared, variables: dict[str, Any], budget: RenderBudget) -> Any:
    if prepared.template is None:
        value = prepared.expression(**variables)
        if isinstance(value, Iterator):  # `xs | select(...)`: computed now, inside the budget
            value = budget.built(list(value))
        budget.output(budget.measure(_reject_undefined(value))[0])
        return value
    pieces, size = [], 0
    for piece in prepared.template.root_render_func(prepared.template.new_context(variables)):
        size += len(piece)
        budget.check_size(size, "the rendered text")
        pieces.append(piece)
    budget.output(size)
    return "".join(pieces)


def _fail(message: str, cause: BaseException, revealed: Mapping[str, str]) -> NoReturn:
    """Raise TemplateError. A message that could quote a secret (`input[secrets.KEY]` names the
    missing key) is scrubbed, and the original exception, which holds it, is not chained. A message
    can quote a whole input value (`'...' is not in list`), which may hold a credential too: it is
    redacted, then cut at MAX_MESSAGE characters, so no part of a value survives the cut."""
    if revealed:
        message = secrets.scrub(message, revealed)
    message = redact_bounded(message, MAX_MESSAGE)
    if revealed:
        raise TemplateError(message) from None
    raise TemplateError(message) from cause


def render_string(text: str, context: Mapping[str, Any]) -> Any:
    """Render one string (its own budget, or that of the `render` in progress); TemplateError when it
    fails or is refused."""
    if not has_template(text):
        return text
    revealed: dict[str, str] = {}
    try:
        prepared = _prepare(text)
        # Resolved here, in the worker, at the last moment; never stored with the graph or journaled.
        revealed = {name: secrets.resolve(name) for name in sorted(prepared.secret_names)}
        variables = {key: value for key, value in context.items() if key != SECRETS}
        if revealed:
            variables[SECRETS] = dict(revealed)
        with bounded_render() as budget:
            return _run(prepared, variables, budget)
    except SecurityError as exc:  # the allow-lists and BudgetExceeded
        _fail(f"template refused by the sandbox: {exc} in {text!r}", exc, revealed)
    except TemplateError:  # an unknown secret: the message names it, never a value
        raise
    except jinja2.TemplateError as exc:
        _fail(f"template {text!r} failed: {exc}", exc, revealed)
    except RecursionError as exc:
        _fail(f"template nests too deeply in {text!r}", exc, revealed)
    except (ArithmeticError, AttributeError, LookupError, TypeError, ValueError, SyntaxError) as exc:
        _fail(f"template {text!r} failed: {type(exc).__name__}: {exc}", exc, revealed)


def render(value: Any, context: Mapping[str, Any]) -> Any:
    """Render every template string inside a JSON-like value, all under one budget."""
    with bounded_render():
        if isinstance(value, str):
            return render_string(value, context)
        if isinstance(value, Mapping):
            return {key: render(item, context) for key, item in value.items()}
        if isinstance(value, list):
            return [render(item, context) for item in value]
        return value

