"""Limits on the shape of what PAL accepts and stores, and on what rendering a template may cost.

Byte sizes alone do not bound the work: a 200 kB document of nested brackets makes Python's JSON
codec, and every recursive walk after it, raise RecursionError. Depth is checked first, with an
explicit stack, so such a document is refused with a clear message before anything else sees it
(a graph document's text is decoded by pal.core.document_text). A template is bounded by the budget
of its render (RenderBudget), which the template sandbox (pal.core.template_sandbox) charges at
every operation. See docs/guarantees.md, section 7.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, ItemsView, Iterator, KeysView, Mapping, ValuesView
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from jinja2.exceptions import SecurityError


def json_depth(value: Any, stop_after: int) -> int:
    """How deeply lists and objects nest in `value` (a scalar is 0); stops counting past `stop_after`."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        deepest = max(deepest, depth + 1)
        if deepest > stop_after:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest


def output_problem(output: Any, max_bytes: int, max_depth: int) -> str | None:
    """Why a step's output may not be journaled (too deep, too big, PAL_MAX_*), else None."""
    problem = depth_problem(output, max_depth, "the step's output")
    if problem:
        return problem
    size = len(json.dumps(output).encode())
    if size > max_bytes:
        return f"the step's output is {size} bytes, over the limit of {max_bytes} (PAL_MAX_OUTPUT_BYTES)"
    return None


def depth_problem(value: Any, limit: int, what: str) -> str | None:
    """A message when `value` nests deeper than `limit`, else None."""
    if json_depth(value, limit) > limit:
        return f"{what} nests lists and objects more than {limit} levels deep (PAL_MAX_JSON_DEPTH)"
    return None


# -- Template renders ---------------------------------------------------------------------------
# What one `templates.render` call (one node field, every string in it) may cost. Each hook in the
# template sandbox (pal.core.templates) charges this budget before or after the operation it guards, so
# no template construct can run long or grow large (docs/guarantees.md, section 7):
MAX_TEMPLATE_VALUE = 2_000_000  # size of any value a template builds, and of each rendered string
MAX_RENDER_OUTPUT = 4_000_000  # size of everything one render returns
MAX_RENDER_WORK = 20_000_000  # size of everything the render's operations read or build, summed
MAX_RENDER_STEPS = 200_000  # operations, lookups, calls; a loop iteration costs its body's size
MAX_RENDER_CPU_SECONDS = 2.0  # this thread's CPU time, checked at every step and charge
MAX_VALUE_DEPTH = 64  # nesting of a value a template builds (PAL_MAX_JSON_DEPTH's default)
CLOCK_EVERY = 100_000  # the CPU clock is read after this much work (a step counts 100)
# "Size" is the length of a string plus one per list item, object key and value, and number: an
# upper bound, within a small constant factor, of the value's printed length and of the time any one
# built-in operation (str(), ==, sorted(), json.dumps()) takes on it.


class BudgetExceeded(SecurityError):
    """A template went over one of its render limits."""


_CONTAINERS = (list, tuple, Mapping, set, frozenset, KeysView, ValuesView, ItemsView)


def _scalar_size(value: Any) -> int | None:
    """The size of a value that holds no others; None for a container."""
    if isinstance(value, str | bytes):
        return len(value) + 1
    if value is None or isinstance(value, bool):
        return 1
    if isinstance(value, float):
        return 24
    if isinstance(value, int):
        return value.bit_length() // 3 + 1  # about its decimal digits
    if isinstance(value, _CONTAINERS):
        return None
    return 1  # Undefined, generators, loop contexts, methods: printing them is short


class RenderBudget:
    """The limits of one render, consumed as it goes. Sizes of containers are remembered by
    identity (objects are kept alive meanwhile): template values cannot be mutated (immutable
    sandbox), so a value measured once keeps its size, and a list of many references to one big
    value is measured by adding, not walking, each."""

    def __init__(self) -> None:
        self.steps_left = MAX_RENDER_STEPS
        self.work_left = MAX_RENDER_WORK
        self.output_left = MAX_RENDER_OUTPUT
        self.deadline = time.thread_time() + MAX_RENDER_CPU_SECONDS
        self._until_clock = CLOCK_EVERY
        self._sizes: dict[int, tuple[Any, int, int]] = {}

    def _check_time(self, weight: int) -> None:
        # Reading the clock costs a system call, so it is read every CLOCK_EVERY units of steps and
        # work: between two readings the render does a bounded amount of work.
        self._until_clock -= weight
        if self._until_clock > 0:
            return
        self._until_clock = CLOCK_EVERY
        if time.thread_time() > self.deadline:
            raise BudgetExceeded(f"the template used more than {MAX_RENDER_CPU_SECONDS} s of CPU time")

    def step(self, cost: int = 1) -> None:
        self.steps_left -= cost
        if self.steps_left < 0:
            raise BudgetExceeded(f"the template took more than {MAX_RENDER_STEPS} steps (operations, "
                                 "lookups, calls; each loop iteration counts its body's size)")
        self._check_time(cost * 100)

    def work(self, units: int) -> None:
        self.work_left -= units
        if self.work_left < 0:
            raise BudgetExceeded(f"the template's operations handled more than {MAX_RENDER_WORK} "
                                 "characters and items in all")
        self._check_time(units)

    def measure(self, value: Any) -> tuple[int, int]:
        """(size, depth) of `value`. Walking it is charged as work, and stops over the budget once
        the walk passes what is left."""
        size = _scalar_size(value)
        if size is not None:
            return size, 0
        known = self._sizes.get(id(value))
        if known is not None and known[0] is value:
            return known[1], known[2]
        total = deepest = walked = 0
        stack: list[tuple[Any, int]] = [(value, 1)]
        while stack:
            item, depth = stack.pop()
            walked += 1
            size = _scalar_size(item)
            known = None if size is not None else self._sizes.get(id(item))
            if size is not None:
                total += size
            elif known is not None and known[0] is item:
                total += known[1]
                deepest = max(deepest, depth - 1 + known[2])
            else:
                total += 1
                deepest = max(deepest, depth)
                if isinstance(item, Mapping):
                    for key, child in item.items():
                        stack.append((key, depth + 1))
                        stack.append((child, depth + 1))
                else:
                    stack.extend((child, depth + 1) for child in item)
            if walked > self.work_left:
                self.work(walked)  # raises: the walk alone would cost more than is left
        self.work(walked)  # the walk is work too; the memo makes the next one free
        self._sizes[id(value)] = (value, total, deepest)
        return total, deepest

    def read(self, value: Any) -> int:
        """Charge an operation whose time grows with `value`'s size; returns the size."""
        size = self.measure(value)[0]
        self.work(size)
        return size

    def built(self, value: Any) -> Any:
        """Charge and check a value an operation produced; returns it."""
        size, depth = self.measure(value)
        if size > MAX_TEMPLATE_VALUE:
            raise BudgetExceeded(f"the result would be of size {size}, over the limit of "
                                 f"{MAX_TEMPLATE_VALUE} for any value a template builds")
        if depth > MAX_VALUE_DEPTH:
            raise BudgetExceeded(f"the result would nest more than {MAX_VALUE_DEPTH} levels deep")
        self.work(size)
        return value

    def check_size(self, size: int, what: str) -> None:
        """Refuse, before it is built, a result whose size is known in advance."""
        if size > MAX_TEMPLATE_VALUE:
            raise BudgetExceeded(f"{what} would be of size {size}, over the limit of {MAX_TEMPLATE_VALUE}")

    def output(self, size: int) -> None:
        """Charge what the render returns."""
        self.output_left -= size
        if self.output_left < 0:
            raise BudgetExceeded(f"the rendered values would be larger than {MAX_RENDER_OUTPUT} in all")


_BUDGET: ContextVar[RenderBudget | None] = ContextVar("pal_render_budget", default=None)


def current_budget() -> RenderBudget:
    """The budget of the render in progress. Outside one (compile-time constant folding) this
    refuses, and Jinja then leaves the expression to run time, inside a render."""
    budget = _BUDGET.get()
    if budget is None:
        raise SecurityError("template code ran outside a bounded render")
    return budget


@contextmanager
def bounded_render() -> Iterator[RenderBudget]:
    """The budget of the render in progress, or a new one for a render that starts here."""
    budget = _BUDGET.get()
    if budget is not None:
        yield budget
        return
    budget = RenderBudget()
    token = _BUDGET.set(budget)
    try:
        yield budget
    finally:
        _BUDGET.reset(token)


@contextmanager
def no_render() -> Iterator[None]:
    """Outside any render: while a template compiles, no template code may run."""
    token = _BUDGET.set(None)
    try:
        yield
    finally:
        _BUDGET.reset(token)


# -- Checks made before a template operation whose result can outgrow its inputs ---------------------
# Most operations are linear: their result is measured after they run (RenderBudget.built). These
# can build far more than they read, from a short pattern or a number, so they are checked first.
MAX_WIDTH = 1000  # the largest padding width, precision or rounding a template may ask for
MAX_POWER_BITS = 100_000  # the largest integer `**` or `*` may build


def printf_size(pattern: str) -> int:
    """An upper bound of `pattern % args` beyond the arguments' own text; refuses wide fields."""
    size, end, index = len(pattern), len(pattern), pattern.find("%")
    while index != -1:
        cursor = index + 1
        if cursor < end and pattern[cursor] == "(":  # %(key)s: Python balances parentheses in the key
            depth, cursor = 1, cursor + 1
            while cursor < end and depth:
                depth += {"(": 1, ")": -1}.get(pattern[cursor], 0)
                cursor += 1
        while cursor < end and pattern[cursor] in "#0- +":
            cursor += 1
        numbers = []
        for part in ("width", "precision"):
            if part == "precision":
                if cursor >= end or pattern[cursor] != ".":
                    break
                cursor += 1
            start = cursor
            while cursor < end and pattern[cursor] in "0123456789*":
                cursor += 1
            numbers.append(pattern[start:cursor])
        for number in numbers:
            if "*" in number or len(number) > 4 or (number and int(number) > MAX_WIDTH):
                raise SecurityError(f"format widths above {MAX_WIDTH} are not allowed")
        size += sum(int(n or 0) for n in numbers) + 330  # 330: the longest %f of a float
        index = pattern.find("%", cursor + 1)
    return size


def replace_size(text: str, old: Any, new: Any, count: Any = -1) -> int:
    old, new = str(old), str(new)
    hits = text.count(old) if old else len(text) + 1
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    return len(text) + hits * max(len(new) - len(old), 0)


def _check_width(width: Any) -> None:
    if isinstance(width, int) and width > MAX_WIDTH:
        raise SecurityError(f"widths above {MAX_WIDTH} are not allowed")


# Guards take the filter's own parameters, so no keyword can slip past them (Jinja's names).
def _guard_indent(budget: RenderBudget, value: Any, width: Any = 4, first: Any = False,
                  blank: Any = False) -> None:
    _check_width(width)
    text = str(value)
    unit = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
    budget.check_size(len(text) + (text.count("\n") + 1) * max(unit, 0), "the indented text")


def _guard_join(budget: RenderBudget, value: Any, d: Any = "", attribute: Any = None) -> None:
    count = len(value) if isinstance(value, str | list | tuple | Mapping) else 0
    budget.check_size(len(str(d)) * count, "the joined text")


def _guard_replace(budget: RenderBudget, value: Any, old: Any = "", new: Any = "",
                   count: Any = None) -> None:
    budget.check_size(replace_size(str(value), old, new, -1 if count is None else count),
                      "the replaced text")


def _guard_tojson(budget: RenderBudget, value: Any, indent: Any = None) -> None:
    if indent is not None:
        if not isinstance(indent, int) or not 0 <= indent <= 8:
            raise SecurityError("tojson's indent must be from 0 to 8")
        size, depth = budget.measure(value)
        budget.check_size(size * (1 + indent * depth), "the indented JSON")


def _guard_round(budget: RenderBudget, value: Any, precision: Any = 0, method: Any = "common") -> None:
    # round(12345, -10**7) computes 10**(10**7) in C: seconds no hook could interrupt.
    if not isinstance(precision, int) or abs(precision) > MAX_WIDTH:
        raise SecurityError(f"round's precision must be a whole number from -{MAX_WIDTH} to {MAX_WIDTH}")


def _guard_sum(budget: RenderBudget, value: Any, attribute: Any = None, start: Any = 0) -> None:
    if isinstance(start, bool) or not isinstance(start, int | float):
        # Adding lists or strings is quadratic, and Jinja's sum adds in place: a list given as the
        # start would be extended under the template.
        raise SecurityError("sum's start must be a number")


FILTER_GUARDS: dict[str, Callable[..., None]] = {
    "center": lambda budget, value, width=80: _check_width(width),
    "format": lambda budget, value, *a, **k: budget.check_size(printf_size(str(value)), "the text"),
    "indent": _guard_indent,
    "join": _guard_join,
    "replace": _guard_replace,
    "round": _guard_round,
    "sum": _guard_sum,
    "tojson": _guard_tojson,
}


# A person's decision on an approval (pal.engine.waiting.decide; the REST body says the same).
MAX_DECISION_COMMENT_CHARS = 2000  # the comment journaled with it
MAX_DECIDER_CHARS = 200  # who decided: `token:<name>`, or a CLI's --by
