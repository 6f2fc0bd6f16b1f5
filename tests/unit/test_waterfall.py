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
    """Events of generation 1; a `run_recovered` moves the later ones to its generation."""
    events, generation = [], 1
    for i, (t, kind, step, payload, attempt) in enumerate(entries):
        generation = payload.get("generation", generation) if kind == "run_recovered" else generation
        events.append(Event(seq=i + 1, run_id="r", step_id=step, attempt=attempt, kind=kind, payload=payload,
                            generation=generation, created_at=at(t)))
    return events


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
    assert a["run_s"] == 1.0 and a["retries"] == [{"at": 1.0, "attempt": 1, "error": "flaky"}]
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


def test_an_attempt_killed_mid_step_its_dead_time_and_its_rerun_are_drawn_apart() -> None:
    events = journal((0.0, "run_queued", None, {}, None),
                     (0.2, "step_started", "a", {"worker": "w1"}, 1),
                     (0.4, "step_completed", "a", {"output": 1}, 1),
                     (0.5, "step_started", "slow", {"worker": "w1"}, 1),  # the worker dies in here
                     (6.0, "run_recovered", None, {"generation": 2, "resumed_steps": ["slow"]}, None),
                     (6.5, "step_started", "slow", {"worker": "w2"}, 1),  # the same attempt, re-run
                     (8.0, "step_completed", "slow", {"output": 2}, 1))
    drawn = waterfall(run("succeeded", 8.0), events, at(9))
    a, slow = drawn["rows"]
    assert [(b["generation"], b["worker"], b["outcome"]) for b in a["bars"]] == [(1, "w1", "completed")]
    assert a["dead"] == [] and a["recoveries"] == []
    lost, rerun = slow["bars"]
    # The killed attempt's bar ends at its generation's last sign of life (its own start here).
    assert (lost["attempt"], lost["generation"], lost["outcome"], lost["started_at"], lost["ended_at"]) == (
        1, 1, "lost", 0.5, 0.5)
    assert (rerun["generation"], rerun["worker"], rerun["outcome"], rerun["started_at"], rerun["ended_at"]) == (
        2, "w2", "completed", 6.5, 8.0)
    assert slow["dead"] == [{"from": 0.5, "to": 6.0, "generation": 2}] and slow["recoveries"] == [6.0]
    assert slow["status"] == "completed" and slow["run_s"] == 1.5  # only time in attempts
    assert [m["kind"] for m in drawn["markers"]] == ["recovery"]


def test_the_last_sign_of_life_is_the_latest_event_of_the_lost_generation() -> None:
    events = journal((0.0, "run_queued", None, {}, None),
                     (0.1, "step_started", "left", {}, 1), (0.1, "step_started", "right", {}, 1),
                     (2.0, "step_completed", "left", {"output": 1}, 1),  # generation 1 alive at 2.0
                     (9.0, "run_recovered", None, {"generation": 2, "resumed_steps": ["right"]}, None))
    rows = {r["step_id"]: r for r in waterfall(run("running", None), events, at(10))["rows"]}
    right = rows["right"]
    assert right["bars"][0] | {"worker": None} == {"attempt": 1, "generation": 1, "started_at": 0.1, "ended_at": 2.0,
                                                  "outcome": "lost", "worker": None, "resumed": False}
    assert right["dead"] == [{"from": 2.0, "to": 9.0, "generation": 2}] and right["status"] == "recovering"
    assert rows["left"]["dead"] == []  # finished before the crash: nothing lost


def test_untaken_branches_and_unreached_nodes_are_skipped_rows() -> None:
    events = journal((0.0, "run_queued", None, {}, None), (0.1, "step_started", "start", {}, 1),
                     (0.2, "step_completed", "start", {"output": 1}, 1),
                     (0.3, "step_started", "each[items]", {}, 1), (0.4, "step_completed", "each[items]", {}, 1),
                     (0.5, "step_started", "check", {}, 1),
                     (0.6, "step_failed", "check", {"error": {"type": "ValueError", "message": "no"}}, 1))
    nodes = ["start", "each", "check", "yes", "no", "after"]
    drawn = waterfall(run("failed", 0.6), events, at(1), plan_nodes=nodes, skipped={"no"})
    assert [(r["step_id"], r["status"], r["skip_reason"]) for r in drawn["rows"][3:]] == [
        ("yes", "skipped", "not reached"), ("no", "skipped", "branch not taken"), ("after", "skipped", "not reached")]
    assert [r["step_id"] for r in drawn["rows"][:3]] == ["start", "each[items]", "check"]  # the loop ran
    # While the run is in flight, only the interpreter's skipped nodes are rows: the rest may run.
    live = waterfall(run("running", None), events[:3], at(1), plan_nodes=nodes, skipped={"no"})
    assert [(r["step_id"], r["status"]) for r in live["rows"]] == [("start", "completed"), ("no", "skipped")]


def test_an_approval_row_carries_its_prompt_show_and_decision() -> None:
    waiting = {"kind": "approval", "prompt": "Refund?", "show": {"amount": 5}, "approval_hash": "h"}
    events = journal((0.0, "run_queued", None, {}, None), (0.1, "step_started", "gate", {}, 1),
                     (0.2, "step_waiting", "gate", waiting, 1))
    [row] = waterfall(run("waiting", None), events, at(3))["rows"]
    assert row["approval"] == {"kind": "approval", "prompt": "Refund?", "show": {"amount": 5},
                               "approval_hash": "h", "requested_at": None, "expires_at": None}
    assert row["waits"] == [{"from": 0.2, "to": None}] and row["wait_s"] == 2.8
    events += journal((1.0, "approval_decided", "gate", {"decision": "approved", "by": "ops", "comment": "ok",
                                                         "kind": "approval"}, 1),
                      (1.0, "step_completed", "gate", {"output": {"branch": "approved"}}, 1))
    [row] = waterfall(run(), events, at(10))["rows"]
    assert row["approval"]["decision"] == "approved" and row["approval"]["by"] == "ops"
    assert row["approval"]["comment"] == "ok" and row["pending_approval"] is False
    assert row["waits"] == [{"from": 0.2, "to": 1.0}] and row["run_s"] == 0.1


def test_an_approved_budget_pause_runs_on_in_a_second_bar_of_the_same_attempt() -> None:
    events = journal((0.0, "run_queued", None, {}, None), (0.1, "step_started", "s", {}, 1),
                     (0.2, "step_waiting", "s", {"kind": "budget"}, 1),
                     (2.0, "approval_decided", "s", {"decision": "approved", "kind": "budget"}, 1),
                     (2.5, "step_completed", "s", {"output": 1}, 1))
    [row] = waterfall(run(), events, at(10))["rows"]
    assert [(b["outcome"], b["resumed"], b["started_at"], b["ended_at"]) for b in row["bars"]] == [
        ("waiting", False, 0.1, 0.2), ("completed", True, 2.0, 2.5)]
    assert row["wait_s"] == 1.8 and row["run_s"] == 0.6


def test_a_forks_reused_steps_are_rows_without_bars_naming_their_source() -> None:
    reused = {"run_id": "src", "seq": 4, "attempt": 1, "origin_run_id": "src"}
    events = journal((0.0, "run_queued", None, {}, None),
                     (0.0, "run_forked", None, {"source_run_id": "src", "from_step": "b"}, None),
                     (0.0, "step_completed", "start", {"output": 1, "reused_from": reused}, None),
                     (0.0, "step_completed", "a", {"output": 2, "reused_from": reused | {"seq": 6}}, None),
                     (0.2, "step_started", "b", {}, 1), (0.5, "step_completed", "b", {"output": 3}, 1))
    rows = waterfall(run("succeeded", 0.5), events, at(1), plan_nodes=["start", "a", "b"])["rows"]
    assert [(r["step_id"], r["status"], len(r["bars"])) for r in rows] == [
        ("start", "reused", 0), ("a", "reused", 0), ("b", "completed", 1)]  # in journal order
    assert rows[1]["reused_from"]["seq"] == 6 and rows[1]["run_s"] == 0 and rows[1]["attempts"] == 0
