"""The sandbox graph templates render in: Jinja's immutable sandbox, cut down to what graphs use and
with every operation that can take time or build a value charged to the render's budget.

Jinja's sandbox stops attribute escapes, not work: a join of a repeated list, a doubling `{% set %}`
or nested loops pinned a worker. Here a template gets no globals, no macros, blocks, includes or
recursive loops, and only the filters, tests and methods allowed below. Every remaining operation
goes through a hook that charges pal.core.limits.RenderBudget: attribute and item lookups, calls,
operators, comparisons, `~`, list/dict/tuple literals, slices, filters, tests, each `{{ }}` output,
and each loop iteration at the size of the loop body. What runs between two hooks is constant work
per step charged, or one built-in operation on values already bounded in size, so the budget's
steps, work and CPU-time limits bound the whole render, and no value grows past
MAX_TEMPLATE_VALUE (docs/guarantees.md, section 7). Growth that a result's size would only reveal
after the fact (`*`, `%` widths, `replace`, `join`'s separator, `indent`) is checked before it runs.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator, KeysView, Mapping
from dataclasses import dataclass
from typing import Any, cast

import jinja2
from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.exceptions import SecurityError
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import _PassArg, pass_context

from pal.core import secrets
from pal.core.limits import FILTER_GUARDS, MAX_POWER_BITS, current_budget, printf_size, replace_size

SECRETS = "secrets"  # read only as secrets.NAME (pal.core.secrets), resolved at render time
_CAPTURED = "pal.captured"  # checks a `{% set %}` block's text; a dotted name no template can write
MAX_TEMPLATE_NODES = 10_000  # syntax nodes in one template string
MAX_TEMPLATE_NESTING = 48  # within Python's parser and the generated code's nesting

# What graphs use (docs/nodes.md, the repository's tests), each bounded below. Left out: every global
# (range, lipsum, dict, cycler, joiner, namespace), filters that grow text from a small input or walk
# the object graph (batch, slice, wordwrap, filesizeformat, urlize, xmlattr, pprint, attr, striptags,
# groupby), `random` (a re-run must render the same) and escaping, which JSON node data has no use for.
# The "cheap" ones take constant time whatever their input, so they are not charged by its size
# (int, float and round are not among them: they parse or compute in time that grows with it).
_CHEAP_FILTERS = frozenset({"count", "d", "default", "first", "last", "length"})
_FILTERS = _CHEAP_FILTERS | {
    "abs", "capitalize", "center", "dictsort", "float", "format", "indent", "int", "items", "join",
    "list", "lower", "map", "max", "min", "reject", "rejectattr", "replace", "reverse", "round",
    "select", "selectattr", "sort", "string", "sum", "title", "tojson", "trim", "truncate", "unique",
    "upper", "urlencode", "wordcount"}
_CHEAP_TESTS = frozenset({"boolean", "defined", "false", "float", "integer", "iterable", "mapping",
                          "none", "number", "sameas", "sequence", "string", "true", "undefined"})
_TESTS = _CHEAP_TESTS | {"!=", "<", "<=", "==", ">", ">=", "divisibleby", "eq", "equalto", "even", "ge",
                         "greaterthan", "gt", "in", "le", "lessthan", "lower", "lt", "ne", "odd", "upper"}
# Callable attributes a template may call. No padding (center, ljust, zfill, expandtabs), no
# str.format or translate (unbounded output), nothing that mutates (the sandbox is immutable too).
_METHODS: tuple[tuple[Any, frozenset[str]], ...] = (
    (str, frozenset({"capitalize", "casefold", "count", "endswith", "find", "index", "isalnum",
                     "isalpha", "isdecimal", "isdigit", "islower", "isnumeric", "isspace",
                     "istitle", "isupper", "lower", "lstrip", "partition", "removeprefix",
                     "removesuffix", "replace", "rfind", "rindex", "rpartition", "rsplit",
                     "rstrip", "split", "splitlines", "startswith", "strip", "swapcase", "title",
                     "upper"})),
    (Mapping, frozenset({"get", "items", "keys", "values"})),
    ((list, tuple), frozenset({"count", "index"})),
    (LoopContext, frozenset({"changed", "cycle"})),
)
_ALLOWED_NODES = (
    nodes.Template, nodes.Output, nodes.TemplateData, nodes.If, nodes.For, nodes.Assign,
    nodes.AssignBlock, nodes.FilterBlock, nodes.With, nodes.Name, nodes.Const, nodes.Tuple,
    nodes.List, nodes.Dict, nodes.Pair, nodes.Keyword, nodes.CondExpr, nodes.Filter, nodes.Test,
    nodes.Call, nodes.Getitem, nodes.Getattr, nodes.Slice, nodes.Concat, nodes.Compare,
    nodes.Operand, nodes.BinExpr, nodes.UnaryExpr)
_REFUSED = {"Macro": "{% macro %}", "CallBlock": "{% call %}", "Block": "{% block %}",
            "Extends": "{% extends %}", "Include": "{% include %}", "Import": "{% import %}",
            "FromImport": "{% from ... import %}", "NSRef": "assigning to a namespace (ns.x)",
            "ScopedEvalContextModifier": "{% autoescape %}"}
_COMPARE: dict[str, Callable[[Any, Any], Any]] = {
    "eq": operator.eq, "ne": operator.ne, "gt": operator.gt, "gteq": operator.ge, "lt": operator.lt,
    "lteq": operator.le, "in": lambda a, b: a in b, "notin": lambda a, b: a not in b}


def _indent(value: Any, *args: Any, **kwargs: Any) -> str:
    # Jinja's indent does `s += "\n"`, which extends a list in place: the immutable sandbox's
    # input would change under the template. Text only.
    return str(jinja2.filters.do_indent(str(value), *args, **kwargs))


def _bounded_callable(name: str, original: Callable[..., Any], cheap: bool,
                      guard: Callable[..., None] | None) -> Callable[..., Any]:
    """A filter or test that charges the budget: one step, its inputs' size unless it takes constant
    time, and the size of what it returns."""
    pass_arg = _PassArg.from_obj(original)

    @pass_context
    def bounded(context: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
        budget = current_budget()
        budget.step()
        if not cheap:
            if isinstance(value, Iterator):  # map/select output: each item was charged as it was made
                value = list(value)
            for item in (value, *args, *kwargs.values()):
                budget.read(item)
        if guard is not None:
            guard(budget, value, *args, **kwargs)
        first = {_PassArg.context: context, _PassArg.eval_context: context.eval_ctx,
                 _PassArg.environment: context.environment}.get(pass_arg) if pass_arg else None
        result = original(first, value, *args, **kwargs) if pass_arg else original(value, *args, **kwargs)
        return budget.built(result)

    bounded.__name__ = name
    return bounded


@pass_context
def _finalize(context: Any, value: Any) -> str:
    """Every `{{ }}` output, inside `{% set %}` blocks too, is charged by its printed length."""
    budget = current_budget()
    budget.step()
    if not isinstance(value, str):
        budget.read(value)
        value = str(value)  # raises for an undefined value, with Jinja's message
    budget.check_size(len(value), "the printed value")
    budget.work(len(value))
    return str(value)


class _BoundedCodeGenerator(CodeGenerator):
    """Routes the operations the sandbox does not intercept through the environment's hooks."""

    def visit_Compare(self, node: nodes.Compare, frame: Frame) -> None:
        self.write("environment.pal_compare(")
        self.visit(node.expr, frame)
        self.write(", (")
        for operand in node.ops:
            self.write(f"({operand.op!r}, ")
            self.visit(operand.expr, frame)
            self.write("), ")
        self.write("))")

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        self.write("environment.pal_concat((")
        for part in node.nodes:
            self.visit(part, frame)
            self.write(", ")
        self.write("))")

    def visit_List(self, node: nodes.List, frame: Frame) -> None:
        self.write("environment.pal_built(")
        super().visit_List(node, frame)
        self.write(")")

    def visit_Dict(self, node: nodes.Dict, frame: Frame) -> None:
        self.write("environment.pal_built(")
        super().visit_Dict(node, frame)
        self.write(")")

    def visit_Tuple(self, node: nodes.Tuple, frame: Frame) -> None:
        if node.ctx != "load":  # an assignment target: `{% for k, v in ... %}`
            super().visit_Tuple(node, frame)
            return
        self.write("environment.pal_built(")
        super().visit_Tuple(node, frame)
        self.write(")")

    def visit_Getitem(self, node: nodes.Getitem, frame: Frame) -> None:
        if not isinstance(node.arg, nodes.Slice):
            super().visit_Getitem(node, frame)
            return
        self.write("environment.pal_slice(")  # Jinja slices without the sandbox's getitem
        self.visit(node.node, frame)
        for part in (node.arg.start, node.arg.stop, node.arg.step):
            self.write(", ")
            if part is None:
                self.write("None")
            else:
                self.visit(part, frame)
        self.write(")")


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox with an allow-list of everything and a budget on all of it."""

    code_generator_class = _BoundedCodeGenerator
    intercepted_binops = frozenset({"+", "-", "*", "/", "//", "%", "**"})
    intercepted_unops = frozenset({"+", "-"})

    def __init__(self) -> None:
        # optimized=False, filters and finalize taking the context: nothing is folded at compile
        # time, outside a budget; the hooks refuse to run there anyway.
        super().__init__(undefined=jinja2.StrictUndefined, autoescape=False, optimized=False,
                         finalize=_finalize)
        self.globals.clear()
        originals = {**jinja2.filters.FILTERS, "indent": _indent}
        self.filters = {name: _bounded_callable(name, originals[name], name in _CHEAP_FILTERS,
                                                FILTER_GUARDS.get(name))
                        for name in sorted(_FILTERS)}
        self.tests = {name: _bounded_callable(name, cast(Callable[..., Any], jinja2.tests.TESTS[name]),
                                              name in _CHEAP_TESTS, None)
                      for name in sorted(_TESTS)}
        self.filters[_CAPTURED] = _bounded_callable(_CAPTURED, str, False, None)

    def _generate(self, source: nodes.Template, name: str | None, filename: str | None,
                  defer_init: bool = False) -> str:
        problems = inspect_template(source).problems
        if problems:
            raise SecurityError(problems[0])
        for loop in list(source.find_all(nodes.For)):
            # Each iteration is charged its body's size in steps, and the literal text it outputs as
            # work: what runs between two hooks is then constant work per step charged.
            body = [*loop.body, *([loop.test] if loop.test else [])]
            steps = 1 + sum(1 + sum(1 for _ in n.find_all(nodes.Node)) for n in body)
            text = sum(len(data.data) for n in body for data in n.find_all(nodes.TemplateData))
            loop.iter = nodes.Call(nodes.EnvironmentAttribute("pal_iterate"),
                                   [loop.iter, nodes.Const(steps), nodes.Const(text)], [], None, None,
                                   lineno=loop.lineno)
            loop.iter.set_environment(self)
        for block in list(source.find_all(nodes.AssignBlock)):
            if block.filter is None:  # `{% set x %}...{% endset %}`: bound what it captured
                block.filter = nodes.Filter(None, _CAPTURED, [], [], None, None, lineno=block.lineno)
                block.filter.set_environment(self)
        return str(super()._generate(source, name, filename, defer_init=defer_init))

    def is_safe_attribute(self, obj: Any, attr: str, value: Any) -> bool:
        if not super().is_safe_attribute(obj, attr, value):
            return False
        return not callable(value) or any(isinstance(obj, kind) and attr in names
                                          for kind, names in _METHODS)

    def is_safe_callable(self, obj: Any) -> bool:
        owner, name = getattr(obj, "__self__", None), getattr(obj, "__name__", "")
        return bool(super().is_safe_callable(obj)) and any(
            isinstance(owner, kind) and name in names for kind, names in _METHODS)

    def getattr(self, obj: Any, attribute: str) -> Any:
        current_budget().step()
        if isinstance(obj, Mapping) and attribute in obj:  # input.items is the key, not dict.items
            return obj[attribute]
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        budget = current_budget()
        budget.step()
        budget.read(argument)  # hashing a key costs its size
        return super().getitem(obj, argument)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(__obj, "__self__", None) is __self and __obj.__name__ == "pal_iterate":
            return __obj(*args)  # put in by _generate; it charges every item itself
        budget = current_budget()
        budget.step()
        if isinstance(__obj, jinja2.Undefined):
            return __obj()  # raises UndefinedError, naming what is missing
        if not __self.is_safe_callable(__obj):
            raise SecurityError(f"calling {getattr(__obj, '__name__', type(__obj).__name__)!r} "
                                "is not allowed in graph templates")
        named = {k: v for k, v in kwargs.items() if k not in ("_loop_vars", "_block_vars")}
        for value in (*args, *named.values()):
            budget.read(value)
        owner = getattr(__obj, "__self__", None)
        if isinstance(owner, str | list | tuple):  # their methods scan them; a mapping's look up
            budget.read(owner)
            if isinstance(owner, str) and __obj.__name__ == "replace":
                budget.check_size(replace_size(owner, *args, **named), "the replaced text")
        return budget.built(__context.call(__obj, *args, **kwargs))

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        budget = current_budget()
        budget.step()
        budget.read(left)
        budget.read(right)
        if operator == "*":
            for seq, times in ((left, right), (right, left)):
                if isinstance(seq, str | list | tuple) and isinstance(times, int):
                    budget.check_size((budget.measure(seq)[0] - 1) * max(times, 0), "the repetition")
            if (isinstance(left, int) and isinstance(right, int)
                    and left.bit_length() + right.bit_length() > MAX_POWER_BITS):
                raise SecurityError(f"the product would exceed {MAX_POWER_BITS} bits")
        elif operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0:
            if abs(left) > 1 and abs(left).bit_length() * right > MAX_POWER_BITS:
                raise SecurityError(f"the power would exceed {MAX_POWER_BITS} bits")
        elif operator == "%" and isinstance(left, str):
            budget.check_size(printf_size(left), "the formatted text")
        if isinstance(left, int) and isinstance(right, int) and operator in ("*", "/", "//", "%", "**"):
            # Long multiplication and division take time in the product of the operands' lengths
            # (30-bit digits); a power, in its result's.
            bits = right.bit_length()
            if operator == "**":
                bits = abs(left).bit_length() * right if abs(left) > 1 and right > 0 else 1
            budget.work((left.bit_length() // 30 + 1) * (bits // 30 + 1))
        return budget.built(super().call_binop(context, operator, left, right))

    def call_unop(self, context: Any, operator: str, arg: Any) -> Any:
        current_budget().step()
        return super().call_unop(context, operator, arg)

    def pal_compare(self, left: Any, operands: tuple[tuple[str, Any], ...]) -> bool:
        budget = current_budget()
        for op, right in operands:
            budget.step()
            sizes = budget.measure(left)[0], budget.measure(right)[0]
            if op not in ("in", "notin"):
                budget.work(min(sizes))  # == and < stop at the shorter side
            else:  # a key in a mapping is hashed; anywhere else the container is searched
                budget.work(sizes[0] if isinstance(right, Mapping | KeysView) else sum(sizes))
            if not _COMPARE[op](left, right):
                return False
            left = right
        return True

    def pal_concat(self, parts: tuple[Any, ...]) -> str:
        budget = current_budget()
        budget.step()
        texts, size = [], 0
        for part in parts:
            if not isinstance(part, str):
                budget.read(part)
                part = str(part)  # raises for an undefined part
            size += len(part)
            budget.check_size(size, "the joined text")
            texts.append(part)
        budget.work(size)
        return "".join(texts)

    def pal_built(self, value: Any) -> Any:
        budget = current_budget()
        budget.step()
        return budget.built(value)

    def pal_slice(self, obj: Any, start: Any, stop: Any, step: Any) -> Any:
        budget = current_budget()
        budget.step()
        return budget.built(obj[slice(start, stop, step)])

    def pal_iterate(self, iterable: Any, steps: int, text: int) -> Iterator[Any]:
        budget = current_budget()
        for item in iterable:
            budget.step(steps)
            budget.work(text)
            yield item


@dataclass(frozen=True)
class Shape:
    problems: list[str]
    secret_names: frozenset[str]


def _secret_use(node: nodes.Name, parent: nodes.Node | None) -> tuple[str | None, str | None]:
    """(problem, secret name) of one use of `secrets`: only `secrets.NAME` or `secrets['NAME']`, so a
    template can name a secret but never list, pass on or pick one by a computed name."""
    name = None
    if node.ctx == "load" and isinstance(parent, nodes.Getattr) and parent.node is node:
        name = parent.attr
    elif (node.ctx == "load" and isinstance(parent, nodes.Getitem) and parent.node is node
          and isinstance(parent.arg, nodes.Const) and isinstance(parent.arg.value, str)):
        name = parent.arg.value
    if name is None:
        return "template uses `secrets` other than as secrets.NAME, with a fixed NAME", None
    if not secrets.is_secret_name(name):
        return (f"template uses unknown name(s) secrets.{name} (a secret is read as secrets.NAME, "
                "NAME matching [A-Z][A-Z0-9_]*)"), None
    return None, name


def inspect_template(ast: nodes.Template) -> Shape:
    """What a template may not do, checked on its syntax tree without recursion."""
    problems: list[str] = []
    names: set[str] = set()
    stack: list[tuple[nodes.Node, nodes.Node | None, int]] = [(ast, None, 0)]
    count = 0
    while stack and not problems:
        node, parent, depth = stack.pop()
        count += 1
        if count > MAX_TEMPLATE_NODES or depth > MAX_TEMPLATE_NESTING:
            problems.append(f"template is too large: over {MAX_TEMPLATE_NODES} syntax nodes or "
                            f"{MAX_TEMPLATE_NESTING} levels of nesting")
        elif not isinstance(node, _ALLOWED_NODES):
            what = _REFUSED.get(type(node).__name__, type(node).__name__)
            problems.append(f"{what} is not allowed in graph templates")
        elif isinstance(node, nodes.For) and node.recursive:
            problems.append("recursive loops are not allowed in graph templates")
        elif isinstance(node, nodes.Filter | nodes.Test) and node.name not in (
                _FILTERS if isinstance(node, nodes.Filter) else _TESTS):
            kind = "filter" if isinstance(node, nodes.Filter) else "test"
            allowed = ", ".join(sorted(_FILTERS if kind == "filter" else _TESTS))
            problems.append(f"template uses unknown {kind} {node.name!r} (allowed: {allowed})")
        elif isinstance(node, nodes.Name) and node.name == "self":
            problems.append("`self` is not available in graph templates")
        elif isinstance(node, nodes.Name) and node.name == SECRETS:
            problem, secret = _secret_use(node, parent)
            problems.extend([problem] if problem else [])
            names.update([secret] if secret else [])
        stack.extend((child, node, depth + 1) for child in node.iter_child_nodes())
    return Shape(problems, frozenset(names))


