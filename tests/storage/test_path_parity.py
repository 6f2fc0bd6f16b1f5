"""The one-call path and the transaction path of the step protocol write the same journal.

On Postgres a warm claim and a plain hand-off are one autocommit call of a server-side function
(pal.storage.one_call, migrations 0005-0006); `journal.calls = None` makes the same Journal take
the plain transaction statements instead (as on SQLite). Each scenario of the table runs once
each way, on a database of its own, with the same explicit times and workers, and after every
operation both are compared: its result, the run's events in journal order (all but their seq,
so payloads, times and generations too), its run row and its lock row. The one-call side must
also really have made the calls the scenario names, or the comparison would prove nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy as sa

from pal.core.records import Claim, ClaimOutcome, Plan, Usage
from pal.core.vocabulary import EventKind
from pal.errors import PalError
from pal.storage.journal import Journal
from pal.storage.sql.queries import Query
from tests.storage import kit
from tests.storage.kit import TTL, at, fence, new_run

Op = Callable[[Journal], Any]


def claim(step: str, seconds: float = 0.0, *, generation: int = 1, worker: str = "w1",
          ready: bool | None = None) -> Op:
    def op(journal: Journal) -> Any:
        f = fence(generation=generation, worker=worker, seconds=seconds)
        if ready is None:
            return journal.steps.claim_step(f, step)
        return journal.steps.claim_step(f, step, ready=lambda _run, _done: ready)
    return op


def complete(step: str, plan: Plan, seconds: float = 0.0, *, attempt: int = 1, generation: int = 1,
             usage: Usage | None = None) -> Op:
    return lambda journal: journal.steps.complete_step(
        fence(generation=generation, seconds=seconds), step, attempt, {"by": step}, plan=plan, usage=usage,
        frontier=kit.only())


def retry(step: str, seconds: float, backoff_s: float, *, attempt: int = 1) -> Op:
    return lambda journal: journal.steps.retry_step(fence(seconds=seconds), step, attempt, of=3,
                                                    error={"code": "flaky"}, backoff_s=backoff_s)


def park(step: str, seconds: float, *in_flight: str) -> Op:
    """Park `step`; the run parks too unless `in_flight` names other ready steps."""
    return lambda journal: journal.waits.park_step(fence(seconds=seconds), step, 1, payload={"kind": "approval"},
                                                   wake_at=at(seconds + 60), frontier=kit.only(step, *in_flight))


def recover(seconds: float, *steps: str) -> Op:
    return lambda journal: journal.recovery.recover_run(run_id="r1", worker_id="sweeper", now=at(seconds),
                                                        lease_ttl=TTL, plan=lambda _run, _done: steps)


CLAIM_STEP, COMPLETE_STEP, READ_LOG = "claim_step", "complete_step", "read_step_log"
START = [claim("start"), complete("start", kit.dispatching("a"), 1)]  # start hands off to a


@dataclass(frozen=True)
class Scenario:
    name: str
    ops: list[Op]
    one_call: frozenset[str]  # the calls the one-call side must have made
    reaches: frozenset[str]  # results the scenario must get (see `label`)


def scenario(name: str, ops: list[Op], one_call: set[str], reaches: set[str]) -> Scenario:
    return Scenario(name, ops, frozenset(one_call), frozenset(reaches))


SCENARIOS = [
    scenario("claim", [claim("start", 1)], set(), {"run"}),
    scenario("complete-with-dispatch", [
        *START, claim("a", 2), complete("a", kit.dispatching("b", "c"), 3),
        claim("b", 4), claim("c", 4), complete("b", kit.dispatching("d"), 5),
    ], {CLAIM_STEP, COMPLETE_STEP}, {"run", "Handoff"}),
    scenario("complete-that-finishes", [
        *START, claim("a", 2), complete("a", kit.dispatching("b"), 3, usage=Usage(7, 3)),
        claim("b", 4), complete("b", kit.finishing({"answer": 42}), 5),
        claim("c", 6), complete("b", kit.finishing("again"), 7),
    ], {CLAIM_STEP, COMPLETE_STEP}, {"terminal", "LeaseLost"}),
    scenario("complete-that-dispatches-nothing", [  # a fan-out's first branch, then the join
        claim("start"), complete("start", kit.dispatching("a", "b"), 1), claim("a", 2), claim("b", 2),
        complete("a", kit.dispatching(), 3), complete("b", kit.dispatching("j"), 4), claim("j", 5),
    ], {CLAIM_STEP, COMPLETE_STEP}, {"run", "Handoff"}),
    scenario("duplicate-claim", [
        claim("start"), claim("start", 1, worker="w2"), complete("start", kit.dispatching("a"), 1),
        claim("start", 1), claim("a", 2), claim("a", 3, worker="w2"), complete("a", kit.dispatching("b"), 4),
        complete("a", kit.dispatching("b"), 5),
    ], {CLAIM_STEP, COMPLETE_STEP}, {"duplicate", "completed"}),
    scenario("stale-claim", [
        *START, claim("a", 2, generation=2), claim("a", 2, generation=0), claim("a", 3),
        complete("a", kit.dispatching("b"), 4),
    ], {CLAIM_STEP, COMPLETE_STEP}, {"stale"}),
    scenario("retry-then-claim", [
        *START, claim("a", 2), retry("a", 3, 10), claim("a", 5), claim("a", 12.5), claim("a", 13),
        complete("a", kit.dispatching("b"), 14, attempt=2), claim("b", 15),
    ], {CLAIM_STEP, COMPLETE_STEP}, {"backoff", "bool"}),
    scenario("park", [
        *START, claim("a", 2), park("a", 3), claim("a", 4), complete("a", kit.dispatching("b"), 5),
    ], {CLAIM_STEP}, {"stale", "LeaseLost"}),
    scenario("park-beside-a-step-in-flight", [
        claim("start"), complete("start", kit.dispatching("a", "b"), 1), claim("a", 2), claim("b", 2),
        park("a", 3, "b"), claim("a", 4), complete("b", kit.dispatching(), 5), claim("a", 6),
    ], {CLAIM_STEP}, {"waiting", "stale"}),
    scenario("recovery-fences-out-the-old-generation", [
        *START, claim("a", 2), recover(TTL + 3, "a"), claim("a", TTL + 4),
        complete("a", kit.dispatching("b"), TTL + 4), claim("a", TTL + 5, generation=2),
        complete("a", kit.dispatching("b"), TTL + 6, generation=2), claim("b", TTL + 7, generation=2),
    ], {CLAIM_STEP, COMPLETE_STEP}, {"Recovery", "stale", "LeaseLost"}),
    scenario("claim-of-a-step-that-is-not-ready", [
        *START, claim("a", 2, ready=True), claim("b", 3, worker="w2", ready=False),
    ], {READ_LOG, CLAIM_STEP}, {"not_ready"}),
]


def result(value: Any) -> Any:
    """What an operation returned, comparable across the two paths."""
    if isinstance(value, Claim):
        completed = dict(value.completed) if value.completed is not None else None
        return ("claim", value.outcome.value, value.attempt, completed, value.wait_s,
                value.run.id if value.run else None)
    return value


def label(result: Any) -> str:
    """A result's name: a claim's outcome, a raised error's class, else the result's type."""
    return str(result[1]) if isinstance(result, tuple) else type(result).__name__


def journal_of(journal: Journal) -> dict[str, Any]:
    """Everything the scenario wrote: events (in seq order, without the seq), run row, lock row."""
    events = [(e.kind, e.step_id, e.attempt, e.generation, e.payload, e.created_at)
              for e in journal.runs.events("r1")]
    return {"events": events, "run": journal.runs.get_run("r1").as_dict(), "lock": kit.lock_row(journal)}


def replay(journal: Journal, ops: list[Op]) -> list[tuple[Any, dict[str, Any]]]:
    """Run r1 through `ops`: each operation's result, and the journal just after it."""
    new_run(journal)
    steps = []
    for op in ops:
        try:
            outcome = result(op(journal))
        except PalError as exc:
            outcome = ("raised", type(exc).__name__)
        steps.append((outcome, journal_of(journal)))
    return steps


def count_calls(journal: Journal) -> list[str]:
    """The one-call functions `journal` calls from now on, in order."""
    calls = journal.calls
    assert calls is not None
    made: list[str] = []
    rows = calls.rows

    def counted(call: Query, params: Any, meanwhile: Any = None) -> list[tuple[Any, ...]]:
        made.append(call.name)
        return rows(call, params, meanwhile)

    calls.rows = counted  # type: ignore[method-assign]
    return made


@pytest.fixture
def two_journals(pg_admin: sa.Engine) -> Iterator[tuple[Journal, Journal]]:
    """(one-call journal, transaction journal), each on a Postgres database of its own."""
    with ExitStack() as stack:
        one_call = stack.enter_context(kit.postgres_journal(pg_admin))
        transaction = stack.enter_context(kit.postgres_journal(pg_admin))
        assert one_call.calls is not None
        transaction.calls = None
        yield one_call, transaction
        for journal in (one_call, transaction):
            assert journal.doctor.violations() == []


@pytest.mark.parametrize("scenario", [pytest.param(s, id=s.name) for s in SCENARIOS])
def test_both_paths_write_the_same_journal(two_journals: tuple[Journal, Journal], scenario: Scenario) -> None:
    one_call, transaction = two_journals
    made = count_calls(one_call)
    steps = replay(one_call, scenario.ops)
    for number, (one, other) in enumerate(zip(steps, replay(transaction, scenario.ops), strict=True)):
        assert one == other, f"the paths part at operation {number}"
    assert scenario.one_call <= set(made), made
    results = [outcome for outcome, _ in steps]
    assert scenario.reaches <= {label(r) for r in results}, results
    assert steps[-1][1]["events"][-1][0] != EventKind.RUN_QUEUED  # the scenario wrote something


def test_the_scenarios_reach_every_claim_outcome() -> None:
    """The table is worth running: between them its scenarios reach each claim outcome, a
    fenced-out completion, a recovery, and both the hand-off and the finish of a completion."""
    reached = set().union(*(s.reaches for s in SCENARIOS))
    assert {o.value for o in ClaimOutcome} | {"LeaseLost", "Recovery", "Handoff", "terminal"} <= reached
