"""The run waterfall: one row per step on a shared time axis, computed from the journal alone.

Pure: `waterfall(events, run)` returns what the dashboard draws, so it is tested without a browser.
For each step: when it became ready (the journal event that let it be dispatched), when it started
and ended, the time it waited in the queue, ran, and waited for an approval or a child run, its
retries, its tokens and cost; and, for the run, its recovery points and anomalies.

Every `step_started` is its own bar (`bars`: attempt, lease generation, worker, outcome), so a
retried attempt, an attempt killed mid-step and its re-run after the recovery are drawn apart. An
attempt that never ended when a `run_recovered` took its lease is `lost`: its bar ends at its last
sign of life in the journal (the latest event of its generation) and the time from there to the
recovery is `dead` (docs/recovery.md). Nodes of the plan that never ran are rows too: `skipped`
(an untaken branch, as the interpreter classifies it) or, in a finished run, `not reached`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
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
    status: str = "running"  # running completed failed waiting retrying recovering skipped reused
    ready_at: float | None = None  # seconds from the run's creation
    started_at: float | None = None
    ended_at: float | None = None
    queue_s: float = 0.0
    run_s: float = 0.0  # the sum of its attempts' bars
    wait_s: float = 0.0  # the sum of its waits
    waiting_for: str | None = None  # "approval" | "child" | "budget" | "confidence" | "timer"
    due_at: str | None = None  # a sleep's timer: when it fires
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
    bars: list[dict[str, Any]] = field(default_factory=list)  # one per step_started (see above)
    waits: list[dict[str, Any]] = field(default_factory=list)  # {from, to}: parked (to None: still)
    dead: list[dict[str, Any]] = field(default_factory=list)  # {from, to, generation}: no sign of life
    recoveries: list[float] = field(default_factory=list)  # run_recovered times that re-drove it
    skip_reason: str | None = None  # "branch not taken" | "not reached"
    approval: dict[str, Any] | None = None  # prompt, show, approval_hash, decision, by, comment
    reused_from: dict[str, Any] | None = None  # a retry's or fork's copied output (docs/retry-and-fork.md)


def _at(created: datetime, when: datetime) -> float:
    return round((when - created).total_seconds(), 4)


def waterfall(run: RunRecord, events: Sequence[Event], now: datetime, *, plan_nodes: Sequence[str] = (),
              skipped: Collection[str] = ()) -> dict[str, Any]:
    """Rows in order of first start, then the plan's nodes that never ran (`plan_nodes` in the
    plan's order, `skipped` those the interpreter found on an untaken branch); markers for
    recoveries and anomalies; the axis length."""
    origin = run.created_at
    rows: dict[str, StepRow] = {}
    last_dispatch = 0.0
    markers: list[dict[str, Any]] = []
    alive: dict[int, float] = {}  # generation -> its latest journal event, the last sign of life
    for event in events:
        t = _at(origin, event.created_at)
        step = event.step_id
        if event.kind == "run_recovered":
            markers.append({"kind": "recovery", "at": t, "generation": event.payload.get("generation"),
                            "resumed_steps": event.payload.get("resumed_steps", [])})
            _lose_open_bars(rows.values(), alive, t, event)
        if event.kind in ANOMALIES:
            markers.append({"kind": event.kind, "at": t, "step_id": step} | _anomaly(event))
        if step is not None:
            row = rows.get(step)
            if event.kind == "step_started":
                if row is None:
                    row = rows[step] = StepRow(step_id=step, ready_at=last_dispatch, started_at=t)
                    row.queue_s = round(max(0.0, t - last_dispatch), 4)
                row.status, row.ended_at = "running", None
                row.attempts = max(row.attempts, event.attempt or 1)
                _close_bar(row, t, "lost")  # an open bar of an earlier claim never ended
                _open_bar(row, event, t)
            elif row is not None:
                _apply(row, event, t)
            elif event.kind == "step_completed" and event.payload.get("reused_from"):
                # copied from the source run when this run was made: it never ran here, so no bar
                rows[step] = StepRow(step_id=step, status="reused", ready_at=t, started_at=t, ended_at=t,
                                     attempts=0, reused_from=dict(event.payload["reused_from"]))
        alive[event.generation] = t
        if event.kind in _DISPATCHING:
            last_dispatch = t
    end = _at(origin, run.finished_at or now)
    for row in rows.values():
        if run.terminal:  # a finished run's open bar and wait ended with it
            _close_bar(row, end, "stopped")
        row.run_s = round(sum((b["ended_at"] if b["ended_at"] is not None else end) - b["started_at"]
                              for b in row.bars), 4)
        row.wait_s = round(sum((w["to"] if w["to"] is not None else end) - w["from"] for w in row.waits), 4)
    # dicts keep insertion order: a tie (a fork's reused steps, all at its creation) stays in journal order
    first_seen = {step: index for index, step in enumerate(rows)}
    ordered = sorted(rows.values(), key=lambda r: (r.started_at or 0.0, first_seen[r.step_id]))
    ordered += _unrun(rows, plan_nodes, skipped, finished=run.terminal)
    _mark_rows(ordered, markers)
    return {"run": run.as_dict() | {"graph_name": run.graph_name}, "duration_s": end,
            "rows": [asdict(r) for r in ordered], "markers": markers}


def _open_bar(row: StepRow, event: Event, t: float, resumed: bool = False) -> None:
    row.bars.append({"attempt": event.attempt, "generation": event.generation, "started_at": t,
                     "worker": event.payload.get("worker"), "ended_at": None, "outcome": "running",
                     "resumed": resumed})


def _close_bar(row: StepRow, t: float, outcome: str) -> None:
    if row.bars and row.bars[-1]["ended_at"] is None:
        row.bars[-1] |= {"ended_at": t, "outcome": outcome}
    if row.waits and row.waits[-1]["to"] is None:
        row.waits[-1]["to"] = t


def _lose_open_bars(rows: Iterable[StepRow], alive: Mapping[int, float], t: float, event: Event) -> None:
    """A recovery took the lease: every attempt of an older generation still open is lost. Its bar
    ends at its generation's last journal event and the rest, up to the recovery, is dead time."""
    generation = int(event.payload.get("generation") or event.generation)
    resumed = event.payload.get("resumed_steps") or []
    for row in rows:
        bar = row.bars[-1] if row.bars else None
        if bar is not None and bar["ended_at"] is None and bar["generation"] < generation:
            last = max(bar["started_at"], alive.get(bar["generation"], bar["started_at"]))
            bar |= {"ended_at": last, "outcome": "lost"}
            row.dead.append({"from": last, "to": t, "generation": generation})
            row.status = "recovering"
            row.recoveries.append(t)
        elif row.step_id in resumed:
            row.recoveries.append(t)


def _unrun(rows: Mapping[str, StepRow], plan_nodes: Sequence[str], skipped: Collection[str],
           finished: bool) -> list[StepRow]:
    """Rows for the plan's nodes that have no step: an untaken branch, or never reached by a run
    that ended. A loop node ran when any step of its expansion (`L[...]`) did."""
    ran = {step.split("[", 1)[0] for step in rows}
    unrun = []
    for node in plan_nodes:
        if node in ran or not (node in skipped or finished):
            continue
        reason = "branch not taken" if node in skipped else "not reached"
        unrun.append(StepRow(step_id=node, status="skipped", attempts=0, skip_reason=reason))
    return unrun


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
    if event.kind == "step_completed":
        _close_bar(row, t, "completed")
        row.status, row.ended_at, row.pending_approval = "completed", t, False
        usage = event.payload.get("usage") or {}
        row.input_tokens = int(usage.get("input_tokens", 0))
        row.output_tokens = int(usage.get("output_tokens", 0))
        row.cost_usd = str(usage.get("cost_usd", "0"))
    elif event.kind == "step_failed":
        _close_bar(row, t, "failed")
        row.status, row.ended_at, row.error = "failed", t, event.payload.get("error")
        row.pending_approval = False
    elif event.kind == "step_retrying":
        _close_bar(row, t, "retrying")
        row.retries.append({"at": t, "attempt": event.payload.get("attempt"),
                            "error": (event.payload.get("error") or {}).get("message")})
        row.status = "retrying"
    elif event.kind == "step_waiting":
        _close_bar(row, t, "waiting")
        row.waits.append({"from": t, "to": None})
        row.status = "waiting"
        kind = event.payload.get("kind")
        row.waiting_for = {"subagent": "child", "budget": "budget", "confidence": "confidence",
                           "timer": "timer"}.get(str(kind), "approval")
        row.due_at = event.payload.get("due_at")  # a sleep's timer
        row.child_run_id = event.payload.get("child_run_id")
        row.pending_approval = kind in DECIDED_WAITS
        row.approval_hash = event.payload.get("approval_hash")
        if kind in DECIDED_WAITS:
            row.approval = {key: event.payload.get(key) for key in ("kind", "prompt", "show", "approval_hash",
                                                                     "requested_at", "expires_at")}
    elif event.kind == "approval_decided":
        row.pending_approval = False
        row.approval = (row.approval or {}) | {"decided_at": t} | {
            key: event.payload.get(key) for key in ("decision", "by", "comment")}
        if event.payload.get("kind") in RESUMING_WAITS and row.status == "waiting":
            # an approved pause: the wait ends here and the step runs on, a bar of the same attempt
            _close_bar(row, t, "waiting")
            row.status = "running"
            _open_bar(row, event, t, resumed=True)
