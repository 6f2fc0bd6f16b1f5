"""Completions (phase 3 of the step protocol): step_completed once, usage counted once, fenced
out completions refused, and a finishing hand-off ends the run once."""

from __future__ import annotations

from decimal import Decimal

import pytest

from pal.core.records import ClaimOutcome, Handoff, Plan, Usage
from pal.core.vocabulary import EventKind, RunStatus
from pal.errors import LeaseLost
from pal.storage.journal import Journal
from tests.storage import kit
from tests.storage.kit import TTL, at, fence, new_run

NO_OP = Handoff(dispatch=(), finished=False)


def totals(journal: Journal, run_id: str = "r1") -> tuple[int, int, Decimal]:
    run = journal.runs.get_run(run_id)
    return run.input_tokens, run.output_tokens, run.cost_usd


@pytest.mark.parametrize("process", ["same", "other"])
def test_a_step_completes_at_most_once(journal: Journal, process: str) -> None:
    new_run(journal)
    assert kit.claim_and_complete(journal, "a", kit.dispatching("b")) == Handoff(("b",), False)
    again = journal if process == "same" else Journal(journal.engine)
    second = again.steps.complete_step(fence(seconds=3), "a", 1, {"step": "late"}, plan=kit.dispatching("c"))
    assert second == NO_OP
    assert [e.payload for e in kit.events(journal, kind=EventKind.STEP_COMPLETED)] == [
        {"output": {"step": "a"}}]
    assert journal.runs.get_run("r1").status == RunStatus.RUNNING


def test_usage_is_added_to_the_run_totals_exactly_once(journal: Journal) -> None:
    new_run(journal)
    usage = Usage(input_tokens=100, output_tokens=20, cost_usd=Decimal("0.0125"))
    f = fence(seconds=1)
    assert journal.steps.claim_step(f, "a").outcome is ClaimOutcome.RUN
    for _ in range(2):
        journal.steps.complete_step(f, "a", 1, "out", plan=kit.dispatching("b"), usage=usage)
    assert totals(journal) == (100, 20, Decimal("0.0125"))
    assert kit.events(journal, kind=EventKind.STEP_COMPLETED)[0].payload == {
        "output": "out", "usage": {"input_tokens": 100, "output_tokens": 20, "cost_usd": "0.0125"}}
    assert journal.steps.claim_step(f, "b").outcome is ClaimOutcome.RUN
    journal.steps.complete_step(f, "b", 1, "out", plan=kit.finishing(), usage=Usage(1, 2, Decimal("0.5")))
    assert totals(journal) == (101, 22, Decimal("0.5125"))


def test_a_completion_without_usage_adds_nothing(journal: Journal) -> None:
    new_run(journal)
    usage = Usage()  # a step that spent nothing
    assert journal.steps.claim_step(fence(), "a").outcome is ClaimOutcome.RUN
    journal.steps.complete_step(fence(), "a", 1, None, plan=kit.dispatching("b"), usage=usage)
    assert totals(journal) == (0, 0, Decimal(0))
    assert all("usage" not in e.payload for e in kit.events(journal, kind=EventKind.STEP_COMPLETED))


@pytest.mark.parametrize("plan", [kit.dispatching("b"), kit.finishing("x")], ids=["hand-off", "finish"])
@pytest.mark.parametrize("usage", [None, Usage(5, 5, Decimal(1))], ids=["no-usage", "usage"])
def test_a_fenced_out_completion_raises_lease_lost_and_writes_nothing(
    journal: Journal, plan: Plan, usage: Usage | None
) -> None:
    new_run(journal)
    assert journal.steps.claim_step(fence(), "a").outcome is ClaimOutcome.RUN
    assert journal.recovery.recover_run(run_id="r1", worker_id="sweeper", now=at(TTL + 1), lease_ttl=TTL,
                                        plan=lambda _run, _done: ["a"]) is not None
    before, lease = kit.events(journal), kit.lock_row(journal)
    with pytest.raises(LeaseLost):
        journal.steps.complete_step(fence(seconds=TTL + 2), "a", 1, "zombie", plan=plan, usage=usage)
    assert kit.events(journal) == before
    assert kit.lock_row(journal) == lease
    run = journal.runs.get_run("r1")
    assert (run.status, run.output) == (RunStatus.RUNNING, None)
    assert totals(journal) == (0, 0, Decimal(0))


def test_a_finishing_hand_off_ends_the_run_once_and_drops_its_lock_row(journal: Journal) -> None:
    new_run(journal)
    kit.claim_and_complete(journal, "a", kit.dispatching("b", "c"))
    f = fence(seconds=4)
    assert journal.steps.claim_step(f, "b").outcome is ClaimOutcome.RUN
    assert journal.steps.claim_step(f, "c").outcome is ClaimOutcome.RUN
    done = journal.steps.complete_step(f, "b", 1, "B", plan=kit.finishing({"answer": 42}))
    assert done == Handoff(dispatch=(), finished=True, output={"answer": 42})
    run = journal.runs.get_run("r1")
    assert (run.status, run.output, run.finished_at) == (RunStatus.SUCCEEDED, {"answer": 42}, at(4))
    assert kit.lock_row(journal) is None and journal.runs.get_lease("r1") is None
    # Another step of the same generation finds no lease any more: nothing else is journaled.
    with pytest.raises(LeaseLost):
        journal.steps.complete_step(f, "c", 1, "C", plan=kit.finishing("other"))
    assert not journal.steps.fail_step(f, "c", 1, {"code": "late"})
    assert [e.payload for e in kit.events(journal, kind=EventKind.RUN_SUCCEEDED)] == [{"output": {"answer": 42}}]
    assert [e.kind for e in kit.events(journal)][-1] == EventKind.RUN_SUCCEEDED
    assert journal.runs.get_run("r1").output == {"answer": 42}


def test_a_hand_off_with_an_error_fails_the_run_once(journal: Journal) -> None:
    new_run(journal)
    failing = Handoff(dispatch=(), finished=True, error={"code": "turn_limit"})
    assert kit.claim_and_complete(journal, "a", lambda _done: failing, seconds=2) == failing
    run = journal.runs.get_run("r1")
    assert (run.status, run.error, run.finished_at) == (RunStatus.FAILED, {"code": "turn_limit"}, at(2))
    assert [e.payload for e in kit.events(journal, kind=EventKind.RUN_FAILED)] == [{"error": {"code": "turn_limit"}}]
    assert kit.lock_row(journal) is None
