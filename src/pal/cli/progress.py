"""Human-readable rendering of journal events: live progress lines and the journal table."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any

from rich.console import Console
from rich.table import Table

from pal.core.records import Event, RunRecord
from pal.core.vocabulary import EventKind

_MARKS: dict[str, str] = {
    EventKind.RUN_QUEUED: "·", EventKind.STEP_STARTED: "▶", EventKind.STEP_COMPLETED: "✓",
    EventKind.STEP_FAILED: "✗", EventKind.RUN_SUCCEEDED: "■", EventKind.RUN_FAILED: "■",
    EventKind.RUN_CANCELLED: "■", EventKind.RUN_RECOVERED: "↻", EventKind.RUN_REDELIVERED: "↻",
    EventKind.STEP_RETRYING: "↺", EventKind.STEP_WAITING: "…", EventKind.STEP_IN_DOUBT: "?",
    EventKind.TIMER_SET: "⏲", EventKind.TIMER_FIRED: "⏰",
}


def short(value: Any, width: int = 70) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= width else text[: width - 1] + "…"


def describe(event: Event) -> str:
    mark = _MARKS.get(event.kind, "•")
    step = f" {event.step_id}" if event.step_id else ""
    detail = ""
    if event.kind == EventKind.STEP_COMPLETED:
        detail = " → " + short(event.payload.get("output"))
    elif event.kind in (EventKind.STEP_FAILED, EventKind.RUN_FAILED):
        detail = " " + short(event.payload.get("error"))
    elif event.kind == EventKind.RUN_SUCCEEDED:
        detail = " output " + short(event.payload.get("output"))
    elif event.kind == EventKind.RUN_RECOVERED:
        detail = f" generation {event.payload.get('generation')}"
    elif event.kind == EventKind.RUN_REDELIVERED:
        detail = f" unclaimed, sent again: {', '.join(event.payload.get('steps', []))}"
    elif event.kind == EventKind.STEP_RETRYING:
        error = event.payload.get("error") or {}
        detail = (f" attempt {event.payload.get('attempt')} of {event.payload.get('of')} failed: "
                  + short(error.get("message"), 50))
    elif event.kind == EventKind.APPROVAL_DECIDED:
        comment = event.payload.get("comment")
        detail = (f" {event.payload.get('decision')} by {event.payload.get('by')}"
                  + (f": {short(comment, 60)}" if comment else ""))
    elif event.kind == EventKind.STEP_IN_DOUBT:
        detail = f" {event.payload.get('effect_kind')} to {event.payload.get('target')} never confirmed"
    return f"{mark} {event.kind}{step}{detail}"


def follow(
    fetch_events: Callable[[int], list[Event]],
    fetch_run: Callable[[], RunRecord],
    emit: Callable[[Event], None],
    *,
    timeout: float,
    poll: float = 0.1,
    watch: Callable[[RunRecord], None] | None = None,
) -> RunRecord | None:
    """Emit each new event until the run is terminal; None if `timeout` passes first. `watch` sees
    the run after each look while it is not finished (to show what it waits for)."""
    deadline = time.monotonic() + timeout
    last = 0
    while True:
        for event in fetch_events(last):
            emit(event)
            last = event.seq
        run = fetch_run()
        if run.terminal:
            for event in fetch_events(last):
                emit(event)
            return run
        if watch is not None:
            watch(run)
        if time.monotonic() > deadline:
            return None
        time.sleep(poll)


def journal_table(events: Iterable[Event], title: str) -> Table:
    table = Table(title=title, show_lines=False)
    for column in ("seq", "kind", "step_id", "attempt", "gen", "at", "payload"):
        table.add_column(column, overflow="fold")
    for e in events:
        table.add_row(str(e.seq), e.kind, e.step_id or "", str(e.attempt or ""),
                      str(e.generation), e.created_at.strftime("%H:%M:%S.%f")[:-3],
                      short(e.payload, 60))
    return table


def runs_table(runs: Iterable[RunRecord]) -> Table:
    table = Table(title="runs")
    for column in ("id", "graph", "status", "created", "duration", "output / error"):
        table.add_column(column, overflow="fold")
    for r in runs:
        duration = ""
        if r.finished_at is not None:
            duration = f"{(r.finished_at - r.created_at).total_seconds():.2f}s"
        table.add_row(r.id, r.graph_name or "", r.status, r.created_at.strftime("%Y-%m-%d %H:%M:%S"),
                      duration, short(r.output if r.status == "succeeded" else r.error, 50))
    return table


def console() -> Console:
    # Journal tables are wide; a pipe or CI log gets 140 columns rather than 80.
    wide = None if sys.stdout.isatty() else 140
    # markup=False: journal payloads are user data; "[scripted-1]" must print, not style.
    return Console(highlight=False, width=wide, markup=False)
