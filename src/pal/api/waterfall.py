"""The run waterfall: one row per step on a shared time axis, computed from the journal alone.

Pure: `waterfall(events, run)` returns what the dashboard draws, so it is tested without a browser.
For each step: when it became ready (the journal event that let it be dispatched), when it started
and ended, the time it waited in the queue, ran, and waited for an approval or a child run, its
retries, its tokens and cost; and, for the run, its recovery points and anomalies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from pal.core.records import Event, RunRecord
from pal.core.step_log import DECIDED_WAITS, RESUMING_WAITS

# Events after which newly ready steps are dispatched: a step's queue wait starts at the last one.
_DISPATCHING = ("run_queued", "step_completed", "run_recovered", "approval_decided", "step_retrying")
ANOMALIES = ("step_failed", "step_in_doubt", "anomaly_detected")


@dataclass
class StepRow:
    step_id: str
    status: str = "running"  # running | completed | failed | waiting | retrying
    ready_at: float | None = None  # seconds from the run's creation
    started_at: float | None = None
    ended_at: float | None = None
    queue_s: float = 0.0
    run_s: float = 0.0
    wait_s: float = 0.0
    waiting_for: str | None = None  # "approval" | "child" | "budget" | "confidence"
    child_run_id: str | None = None
    attempts: int = 1
    retries: list[dict[str, Any]] = field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: str = "0"
    pending_approval: bool = False
    approval_hash: str | None = None
    error: Any = None
    anomalies: list[str] = field(default_factory=list)  # kinds of the anomalies journaled on it


def _at(created: datetime, when: datetime) -> float:
    return round((when - created).total_seconds(), 4)


def waterfall(run: RunRecord, events: Sequence[Event], now: datetime) -> dict[str, Any]:
    """Rows in order of first start, markers for recoveries and anomalies, and the axis length."""
    origin = run.created_at
    rows: dict[str, StepRow] = {}
    last_dispatch = 0.0
    markers: list[dict[str, Any]] = []
    for event in events:
        t = _at(origin, event.created_at)
        step = event.step_id
        if event.kind == "run_recovered":
            markers.append({"kind": "recovery", "at": t, "generation": event.payload.get("generation"),
                            "resumed_steps": event.payload.get("resumed_steps", [])})
        if event.kind in ANOMALIES:
            markers.append({"kind": event.kind, "at": t, "step_id": step} | _anomaly(event))
        if step is not None:
            row = rows.get(step)
            if event.kind == "step_started":
                if row is None:
                    row = rows[step] = StepRow(step_id=step, ready_at=last_dispatch, started_at=t)
                    row.queue_s = round(max(0.0, t - last_dispatch), 4)
                row.status, row.attempts = "running", max(row.attempts, event.attempt or 1)
                row.started_at = row.started_at if row.started_at is not None else t
                row.ended_at = None
            elif row is not None:
                _apply(row, event, t)
        if event.kind in _DISPATCHING:
            last_dispatch = t
    end = _at(origin, run.finished_at or now)
    for row in rows.values():
        if row.ended_at is None and row.started_at is not None:
            span = round(end - row.started_at, 4)
            if row.status == "waiting":
                row.wait_s = round(span - row.run_s, 4)
            else:
                row.run_s = span
    ordered = sorted(rows.values(), key=lambda r: (r.started_at or 0.0, r.step_id))
    _mark_rows(ordered, markers)
    return {"run": run.as_dict(), "duration_s": end, "rows": [asdict(r) for r in ordered], "markers": markers}


def _anomaly(event: Event) -> dict[str, Any]:
    """What a marker shows of an anomaly_detected: its kind and message (docs/anomalies.md)."""
    if event.kind != "anomaly_detected":
        return {}
    return {"anomaly": str(event.payload.get("kind", "")), "message": str(event.payload.get("message", ""))}


def _mark_rows(rows: Sequence[StepRow], markers: Sequence[dict[str, Any]]) -> None:
    """Put each anomaly on its step's row: the step itself, or (a loop's) the first of its
    expansion's steps; a run-level anomaly stays in the list under the waterfall only."""
    for marker in markers:
        step = marker.get("step_id")
        if marker["kind"] != "anomaly_detected" or not step:
            continue
        row = next((r for r in rows if r.step_id == step), None) or next(
            (r for r in rows if r.step_id.startswith(f"{step}[")), None)
        if row is not None:
            row.anomalies.append(marker["anomaly"])


def _apply(row: StepRow, event: Event, t: float) -> None:
    started = row.started_at or 0.0
    if event.kind == "step_completed":
        if row.status == "waiting":
            row.wait_s = round(t - started - row.run_s, 4)
        else:
            row.run_s = round(t - started - row.wait_s, 4)
        row.status, row.ended_at, row.pending_approval = "completed", t, False
        usage = event.payload.get("usage") or {}
        row.input_tokens = int(usage.get("input_tokens", 0))
        row.output_tokens = int(usage.get("output_tokens", 0))
        row.cost_usd = str(usage.get("cost_usd", "0"))
    elif event.kind == "step_failed":
        row.run_s = round(t - started - row.wait_s, 4)
        row.status, row.ended_at, row.error = "failed", t, event.payload.get("error")
        row.pending_approval = False
    elif event.kind == "step_retrying":
        row.retries.append({"at": t, "attempt": event.payload.get("attempt"),
                            "error": (event.payload.get("error") or {}).get("message")})
        row.status = "retrying"
    elif event.kind == "step_waiting":
        row.run_s = round(t - started, 4)
        row.status = "waiting"
        kind = event.payload.get("kind")
        row.waiting_for = {"subagent": "child", "budget": "budget", "confidence": "confidence"}.get(
            str(kind), "approval")
        row.child_run_id = event.payload.get("child_run_id")
        row.pending_approval = kind in DECIDED_WAITS
        row.approval_hash = event.payload.get("approval_hash")
    elif event.kind == "approval_decided":
        row.pending_approval = False
        if event.payload.get("kind") in RESUMING_WAITS and row.status == "waiting":
            # an approved pause: the wait ends here and the step runs on
            row.wait_s, row.status = round(t - started - row.run_s, 4), "running"
