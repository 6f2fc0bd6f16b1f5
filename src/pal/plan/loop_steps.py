"""The step ids of a loop's expansion, in one place: a ready loop node `L` runs as the steps
`L[items]` (its list, decided once), then iteration i's body steps `L[i].<node>`, then `L` itself
(the loop's output). Node ids never contain `[`, so these ids cannot collide with a graph's own."""

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
