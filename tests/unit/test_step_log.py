"""The per-process step log (pal.core.step_log): what a claim decides from, event by event."""

from __future__ import annotations

from typing import Any, NamedTuple

from pal.core.step_log import StepLog


class Row(NamedTuple):
    seq: int
    step_id: str
    kind: str
    payload: Any


def test_a_step_waits_until_a_decision_ends_its_wait() -> None:
    log = StepLog().extended([Row(1, "a", "step_completed", {"output": 1}),
                              Row(2, "b", "step_waiting", {"kind": "budget"})])
    assert log.waited == {"b"} and log.next_attempt("b") == 1
    approved = log.extended([Row(3, "b", "approval_decided", {"kind": "budget", "decision": "approved"})])
    assert approved.waited == frozenset() and approved.over_budget == {"b"}
    assert approved.next_attempt("b") == 2  # the paused attempt never ran its node: a new one runs
    assert log.waited == {"b"}  # the older log is never changed


def test_a_rejected_pause_or_an_approval_node_lets_no_step_past_the_budget() -> None:
    log = StepLog().extended([Row(1, "b", "step_waiting", {"kind": "budget"}),
                              Row(2, "b", "approval_decided", {"kind": "budget", "decision": "rejected"}),
                              Row(3, "g", "step_waiting", {"kind": "approval"}),
                              Row(4, "g", "approval_decided", {"decision": "approved"}),
                              Row(5, "g", "step_completed", {"output": {"branch": "approved"}})])
    assert log.over_budget == frozenset() and log.waited == frozenset()
    assert log.next_attempt("g") == 1 and log.outputs["g"] == {"branch": "approved"}


def test_usage_and_retries_add_up() -> None:
    log = StepLog().extended([
        Row(1, "m", "step_retrying", {"attempt": 1}),
        Row(2, "m", "step_completed", {"output": "x", "usage": {"input_tokens": 3, "output_tokens": 4,
                                                                "cost_usd": "0.25"}})])
    assert (log.tokens, str(log.cost_usd), log.retry_count, log.next_attempt("m")) == (7, "0.25", 1, 2)
