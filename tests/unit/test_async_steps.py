"""The event loop of awaited steps (pal.engine.async_steps), on its real loop and finisher threads:
slots bound what runs at once, a finisher's next step takes its slot over, a time limit and a lost
lease stop an effect, and a drain waits for what is in flight."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from pal.engine.async_steps import AsyncSteps, Slot
from pal.engine.heartbeat import LeaseGone, LeaseKeeper, TimeLimitReached


def keeper(kept: bool = True) -> LeaseKeeper:
    return LeaseKeeper(lambda run_id, generation: kept, lease_ttl=0.3)


class Outcomes:
    def __init__(self) -> None:
        self.seen: list[Any] = []
        self.event = threading.Event()

    def __call__(self, outcome: Any, slot: Slot | None = None) -> None:
        self.seen.append(outcome)
        self.event.set()


async def answer(value: Any, seconds: float = 0.0) -> Any:
    await asyncio.sleep(seconds)
    return value


def test_an_effect_is_awaited_on_the_loop_and_its_outcome_finished_on_a_finisher() -> None:
    steps, outcomes = AsyncSteps(4, keeper()), Outcomes()
    threads: list[str] = []

    def finish(outcome: Any, slot: Slot) -> None:
        threads.append(threading.current_thread().name)
        outcomes(outcome)

    with steps.slot() as slot:
        steps.submit(answer({"ok": 1}), run_id="r", generation=1, limit_s=5, finish=finish, slot=slot)
        assert not slot.held  # the effect took it over
    assert outcomes.event.wait(5)
    assert outcomes.seen == [{"ok": 1}]
    assert threads[0].startswith("pal-finish")
    assert steps.drain(5) and steps.in_flight == 0


def test_a_full_process_makes_the_next_claim_wait_for_a_slot() -> None:
    steps, outcomes = AsyncSteps(1, keeper()), Outcomes()
    with steps.slot() as slot:
        steps.submit(answer("first", 0.5), run_id="r", generation=1, limit_s=5, finish=outcomes, slot=slot)
    seen_on_entry: list[list[Any]] = []

    def second() -> None:
        with steps.slot():
            seen_on_entry.append(list(outcomes.seen))

    thread = threading.Thread(target=second)
    thread.start()
    thread.join(10)
    assert seen_on_entry == [["first"]]  # the slot came free only once the first was journaled
    assert steps.in_flight == 0


def test_a_finisher_runs_its_next_step_in_its_own_slot_without_waiting() -> None:
    steps = AsyncSteps(1, keeper())
    done = threading.Event()
    results: list[Any] = []

    def then(outcome: Any, slot: Slot) -> None:
        results.append(outcome)
        done.set()

    def first_finished(outcome: Any, slot: Slot) -> None:  # a chain: the successor's effect, from the finisher
        results.append(outcome)
        with steps.slot(slot) as held:  # the finisher's slot: nothing more is taken, so this cannot block
            assert held is slot
            steps.submit(answer("second"), run_id="r", generation=1, limit_s=5, finish=then, slot=held)

    with steps.slot() as slot:
        steps.submit(answer("first"), run_id="r", generation=1, limit_s=5, finish=first_finished, slot=slot)
    assert done.wait(5), "the chained step waited for a slot its own predecessor held"
    assert results == ["first", "second"]
    assert steps.drain(5)


def test_an_effect_past_its_time_limit_is_cancelled() -> None:
    steps, outcomes = AsyncSteps(2, keeper()), Outcomes()
    cancelled = threading.Event()

    async def forever() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with steps.slot() as slot:
        steps.submit(forever(), run_id="r", generation=1, limit_s=0.1, finish=outcomes, slot=slot)
    assert outcomes.event.wait(10)
    assert isinstance(outcomes.seen[0], TimeLimitReached) and cancelled.is_set()


def test_an_effect_whose_lease_is_lost_is_cancelled() -> None:
    steps, outcomes = AsyncSteps(2, keeper(kept=False)), Outcomes()
    with steps.slot() as slot:
        steps.submit(answer("never", 60), run_id="r", generation=1, limit_s=120, finish=outcomes, slot=slot)
    assert outcomes.event.wait(10)  # the keeper renews after a third of 0.3 s and finds it gone
    assert isinstance(outcomes.seen[0], LeaseGone)


def test_a_failing_effect_is_its_outcome_and_a_failing_finish_frees_its_slot() -> None:
    steps, outcomes = AsyncSteps(1, keeper()), Outcomes()

    async def broken() -> None:
        raise ValueError("no")

    with steps.slot() as slot:
        steps.submit(broken(), run_id="r", generation=1, limit_s=5, finish=outcomes, slot=slot)
    assert outcomes.event.wait(5) and isinstance(outcomes.seen[0], ValueError)

    def journal_down(outcome: Any, slot: Slot) -> None:
        raise RuntimeError("the journal is down")

    with steps.slot() as slot:
        steps.submit(answer(1), run_id="r", generation=1, limit_s=5, finish=journal_down, slot=slot)
    assert steps.drain(5) and steps.in_flight == 0
