"""`pal runs show`: one run as an operator reads it: its fields, its error with the traceback, and a
line per step (status, attempts, the error in one line), all from the run row and its journal."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pal.core.records import Event, RunRecord
from pal.core.vocabulary import EventKind

# What a step's latest event of these kinds says about it.
_STEP_STATUS: dict[str, str] = {
    EventKind.STEP_STARTED: "running", EventKind.STEP_COMPLETED: "completed",
    EventKind.STEP_FAILED: "failed", EventKind.STEP_RETRYING: "retrying",
    EventKind.STEP_WAITING: "waiting", EventKind.STEP_IN_DOUBT: "in_doubt",
    EventKind.APPROVAL_DECIDED: "decided",
}
ONE_LINE = 100  # characters of an error in the step list


@dataclass
class StepLine:
    step_id: str
    status: str = "pending"
    attempts: int = 0
    error: str = ""


def error_line(error: Any, width: int = ONE_LINE) -> str:
    """An error payload in one line: `Type: first line of the message`."""
    if not isinstance(error, Mapping):
        return "" if error is None else str(error)[:width]
    message = str(error.get("message") or error.get("reason") or error.get("code") or "")
    first = message.splitlines()[0] if message else ""
    text = f"{error.get('type')}: {first}" if error.get("type") else first
    return text if len(text) <= width else text[: width - 1] + "…"


def step_lines(events: Iterable[Event]) -> list[StepLine]:
    """Each step of the journal, in the order it first appeared."""
    steps: dict[str, StepLine] = {}
    for event in events:
        if event.step_id is None or event.kind not in _STEP_STATUS:
            continue
        line = steps.setdefault(event.step_id, StepLine(event.step_id))
        line.status = _STEP_STATUS[event.kind]
        line.attempts = max(line.attempts, event.attempt or 0)
        if event.kind in (EventKind.STEP_FAILED, EventKind.STEP_RETRYING):
            line.error = error_line(event.payload.get("error"))
        elif event.kind == EventKind.STEP_COMPLETED:
            line.error = ""
            if event.payload.get("reused_from"):  # copied by a retry or fork (docs/retry-and-fork.md)
                line.status = "reused"
    return list(steps.values())


def run_lines(record: RunRecord, events: Iterable[Event],
              derived_runs: list[dict[str, Any]] | None = None) -> list[str]:
    """The text of `pal runs show`; `derived_runs`: the runs retried or forked from this one."""
    data = record.as_dict() | {"derived_runs": derived_runs or []}
    error = data.pop("error")
    lines = [f"{key:>15}: {value if key == 'cost_usd' else json.dumps(value, default=str)}"
             for key, value in data.items()]
    if error:
        brief = {k: v for k, v in error.items() if k != "traceback"} if isinstance(error, Mapping) else error
        lines.append(f"{'error':>15}: {json.dumps(brief, default=str)}")
        trace = error.get("traceback") if isinstance(error, Mapping) else None
        if trace:
            lines += ["      traceback:", *("    " + line for line in str(trace).rstrip().splitlines())]
    steps = step_lines(events)
    lines.append("          steps:" + ("" if steps else " none yet"))
    if steps:
        width = max(len(s.step_id) for s in steps)
        lines.append(f"  {'step':<{width}}  {'status':<9}  attempts  error")
        lines += [f"  {s.step_id:<{width}}  {s.status:<9}  {s.attempts:>8}  {s.error}".rstrip()
                  for s in steps]
    return lines
