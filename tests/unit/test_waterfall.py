"""The waterfall is a pure function of the journal: queue wait, execution, waits, retries, recoveries."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from pal.api.waterfall import waterfall
from pal.core.records import Event, RunRecord

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def run(status: str = "succeeded", finished: float | None = 10.0) -> RunRecord:
    return RunRecord(id="r", tenant_id="t", kind="graph", status=status, graph=None, graph_hash=None, input=None,
                     output=None, error=None, parent_run_id=None, parent_step_id=None, cost_usd=Decimal(0),
                     input_tokens=0, output_tokens=0, created_at=T0, started_at=at(0.1),
                     finished_at=at(finished) if finished is not None else None)


def journal(*entries: tuple[float, str, str | None, dict[str, Any], int | None]) -> list[Event]:
    return [Event(seq=i + 1, run_id="r", step_id=step, attempt=attempt, kind=kind, payload=payload, generation=1,
                  created_at=at(t)) for i, (t, kind, step, payload, attempt) in enumerate(entries)]


def test_queue_execution_retries_tokens_and_an_approval_wait() -> None:
    events = journal(
        (0.0, "run_queued", None, {}, None),
        (0.5, "step_started", "a", {}, 1),  # queued for 0.5 s
        (1.0, "step_retrying", "a", {"attempt": 1, "error": {"message": "flaky"}}, 1),
        (1.5, "step_started", "a", {}, 2),
        (2.0, "step_completed", "a", {"output": 1, "usage": {"input_tokens": 3, "output_tokens": 4,
                                                              "cost_usd": "0.01"}}, 2),
        (2.2, "step_started", "gate", {}, 1),
        (2.3, "step_waiting", "gate", {"kind": "approval", "approval_hash": "h"}, 1),
        (6.3, "approval_decided", "gate", {"decision": "approved"}, 1),
        (6.3, "step_completed", "gate", {"output": {"branch": "approved"}}, 1),
        (7.0, "run_recovered", None, {"generation": 2, "resumed_steps": ["b"]}, None),
        (7.5, "step_started", "b", {}, 1),
        (8.0, "step_failed", "b", {"error": {"message": "kaput"}}, 1),
    )
    drawn = waterfall(run("failed", 8.0), events, at(9))
    a, gate, b = drawn["rows"]
    assert (a["step_id"], a["queue_s"], a["attempts"], a["status"]) == ("a", 0.5, 2, "completed")
    assert a["run_s"] == 1.5 and a["retries"] == [{"at": 1.0, "attempt": 1, "error": "flaky"}]
    assert (a["input_tokens"], a["output_tokens"], a["cost_usd"]) == (3, 4, "0.01")
    assert gate["queue_s"] == 0.2 and gate["run_s"] == 0.1 and gate["wait_s"] == 4.0
    assert gate["waiting_for"] == "approval" and gate["pending_approval"] is False
    assert b["queue_s"] == 0.5 and b["status"] == "failed" and b["error"] == {"message": "kaput"}
    kinds = [m["kind"] for m in drawn["markers"]]
    assert kinds == ["recovery", "step_failed"] and drawn["duration_s"] == 8.0


def test_a_pending_approval_and_a_running_step_extend_to_now() -> None:
    events = journal((0.0, "run_queued", None, {}, None), (1.0, "step_started", "g", {}, 1),
                     (1.5, "step_waiting", "g", {"kind": "approval", "approval_hash": "h"}, 1))
    [row] = waterfall(run("waiting", None), events, at(5))["rows"]
    assert row["pending_approval"] is True and row["approval_hash"] == "h"
    assert row["run_s"] == 0.5 and row["wait_s"] == 3.5
    events = journal((0.0, "run_queued", None, {}, None), (1.0, "step_started", "s", {}, 1))
    [row] = waterfall(run("running", None), events, at(4))["rows"]
    assert row["status"] == "running" and row["run_s"] == 3.0


def test_a_subagent_row_links_its_child() -> None:
    events = journal((0.0, "run_queued", None, {}, None), (0.1, "step_started", "sub", {}, 1),
                     (0.2, "step_waiting", "sub", {"kind": "subagent", "child_run_id": "child_x"}, 1),
                     (3.2, "step_completed", "sub", {"output": 1}, 1))
    [row] = waterfall(run(), events, at(10))["rows"]
    assert row["waiting_for"] == "child" and row["child_run_id"] == "child_x" and row["wait_s"] == 3.0


def test_an_anomaly_marks_its_step_and_is_listed_under_the_waterfall() -> None:
    events = journal((0.0, "run_queued", None, {}, None), (0.1, "step_started", "each[items]", {}, 1),
                     (0.2, "step_completed", "each[items]", {"output": {"items": [1, 2]}}, 1),
                     (0.3, "anomaly_detected", "each", {"kind": "runaway_loop", "message": "near the cap"}, None),
                     (0.4, "step_started", "each[0].work", {}, 1),
                     (0.5, "anomaly_detected", None, {"kind": "retry_storm", "message": "a storm"}, None))
    drawn = waterfall(run(), events, at(1))
    items, work = drawn["rows"]
    assert items["anomalies"] == ["runaway_loop"] and work["anomalies"] == []  # on the loop's first step
    assert [(m["anomaly"], m["step_id"], m["message"]) for m in drawn["markers"]] == [
        ("runaway_loop", "each", "near the cap"), ("retry_storm", None, "a storm")]
