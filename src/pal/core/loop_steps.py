"""The step ids of a loop's expansion, in one place: a ready loop node `L` runs as the steps
`L[items]` (its list, decided once), then iteration i's body steps `L[i].<node>`, then `L` itself
(the loop's output). Node ids never contain `[`, so these ids cannot collide with a graph's own.
Pure, in core: the planner builds these ids and the baselines key by them."""

from __future__ import annotations

import re
from typing import NamedTuple

_LOOP_STEP = re.compile(
    r"^(?P<loop>[A-Za-z_][A-Za-z0-9_-]*)\[(?:(?P<items>items)\]|(?P<index>\d+)\]\.(?P<local>.+))\Z")


class LoopStep(NamedTuple):
    loop_id: str
    iteration: int | None  # None: the items step
    local: str | None  # the body node of that iteration


def items_step(loop_id: str) -> str:
    return f"{loop_id}[items]"


def iteration_prefix(loop_id: str, index: int) -> str:
    return f"{loop_id}[{index}]."


def iteration_step(loop_id: str, index: int, local: str) -> str:
    return f"{iteration_prefix(loop_id, index)}{local}"


def parse_loop_step(step_id: str) -> LoopStep | None:
    """The parts of a loop expansion's step id; None for any other id."""
    match = _LOOP_STEP.match(step_id)
    if match is None:
        return None
    if match["items"]:
        return LoopStep(match["loop"], None, None)
    return LoopStep(match["loop"], int(match["index"]), match["local"])


_ITERATION = re.compile(r"\[\d+\]")


def baseline_node(step_id: str) -> str:
    """The id a step's baselines are kept under: its own, except that every iteration of a loop's
    body node shares one (`L[3].work` and `L[7].work` are both `L[*].work`, at any depth), so a
    loop's steps are compared with that node's usual, not with one iteration index's."""
    return _ITERATION.sub("[*]", step_id) if "[" in step_id else step_id
