"""The journal's invariants, checked over the whole database (`pal doctor`): each check returns
the violations it finds, and a clean journal has none (docs/guarantees.md)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from pal.core.records import Violation
from pal.core.vocabulary import (
    DERIVED_EVENT,
    TERMINAL_EVENT,
    TERMINAL_EVENT_KINDS,
    TERMINAL_STATUSES,
    EventKind,
)
from pal.storage.base import Caches, StoreBase
from pal.storage.schema import journal_events, pruned_runs, run_locks, runs, side_effect_receipts


class ReadyCheck(Protocol):
    def is_ready(self, completed: Mapping[str, Any], step_id: str) -> bool: ...


ProgramOf = Callable[[str, Any], ReadyCheck]
"""program_of(kind, document): the run's plan; the engine passes the planner's (pal.plan)."""


class Doctor(StoreBase):
    def __init__(self, engine: Engine, caches: Caches | None = None,
                 program_of: ProgramOf | None = None) -> None:
        super().__init__(engine, caches)
        self._program_of = program_of

    def violations(self) -> list[Violation]:
        """Every breach of the journal's invariants; empty when the journal is clean. The
        ready-order check runs only when the journal was given the planner (`program_of`)."""
        checks = [self._twice, self._terminal_leases, self._status_vs_journal, self._unstarted,
                  self._started_again, self._orphan_receipts, self._totals, self._seq_order,
                  self._anomalies_twice, self._started_past_budget, self._reused_out_of_place,
                  self._pruned_but_present, self._timers]
        if self._program_of is not None:
            checks.append(self._out_of_order)
        with self._tx() as conn:
            return [v for check in checks for v in check(conn)]

    def _twice(self, conn: sa.Connection) -> list[Violation]:
        je = journal_events
        found = [Violation("step_completed_twice", r.run_id, r.step_id, f"{r.n} step_completed events")
                 for r in conn.execute(sa.select(je.c.run_id, je.c.step_id, sa.func.count().label("n"))
                                       .where(je.c.kind == EventKind.STEP_COMPLETED)
                                       .group_by(je.c.run_id, je.c.step_id)
                                       .having(sa.func.count() > 1))]
        found += [Violation("terminal_twice", r.run_id, None, f"{r.n} terminal events")
                  for r in conn.execute(sa.select(je.c.run_id, sa.func.count().label("n"))
                                        .where(je.c.kind.in_(TERMINAL_EVENT_KINDS)).group_by(je.c.run_id)
                                        .having(sa.func.count() > 1))]
        return found

    def _terminal_leases(self, conn: sa.Connection) -> list[Violation]:
        rows = conn.execute(sa.select(runs.c.id, runs.c.status)
                            .join(run_locks, run_locks.c.run_id == runs.c.id)
                            .where(runs.c.status.in_(TERMINAL_STATUSES)))
        return [Violation("terminal_run_has_lease", r.id, None, f"{r.status} but holds a lock row")
                for r in rows]

    def _status_vs_journal(self, conn: sa.Connection) -> list[Violation]:
        je = journal_events
        ends = {r.run_id: r.kind for r in conn.execute(
            sa.select(je.c.run_id, je.c.kind).where(je.c.kind.in_(TERMINAL_EVENT_KINDS)))}
        return [Violation("status_disagrees_with_journal", r.id, None,
                          f"status {r.status}, terminal event {ends.get(r.id)}")
                for r in conn.execute(sa.select(runs.c.id, runs.c.status))
                if TERMINAL_EVENT.get(r.status) != ends.get(r.id)]

    def _unstarted(self, conn: sa.Connection) -> list[Violation]:
        je, started = journal_events, journal_events.alias("started")
        rows = conn.execute(sa.select(je.c.run_id, je.c.step_id, je.c.attempt, je.c.seq, je.c.payload).where(
            je.c.kind == EventKind.STEP_COMPLETED, ~sa.exists().where(
                started.c.run_id == je.c.run_id, started.c.step_id == je.c.step_id,
                started.c.attempt == je.c.attempt, started.c.kind == EventKind.STEP_STARTED,
                started.c.seq < je.c.seq)))
        # A step a retry or fork reused never started in its new run: _reused_out_of_place checks it.
        return [Violation("completed_without_start", r.run_id, r.step_id,
                          f"step_completed (seq {r.seq}) of attempt {r.attempt} has no earlier step_started")
                for r in rows if not _reused(r.payload)]

    def _reused_out_of_place(self, conn: sa.Connection) -> list[Violation]:
        """A reused completion (`reused_from`) opens a derived run's journal: after its
        `run_retried`/`run_forked`, before any step of the run started (docs/retry-and-fork.md)."""
        je, found = journal_events, []
        kinds = (EventKind.STEP_COMPLETED, EventKind.STEP_STARTED, *DERIVED_EVENT.values())
        rows = conn.execute(sa.select(je.c.run_id, je.c.step_id, je.c.kind, je.c.seq, je.c.payload)
                            .where(je.c.kind.in_(kinds)).order_by(je.c.run_id, je.c.seq))
        for run_id, events in itertools.groupby(rows, key=lambda r: r.run_id):
            opened = started = False
            for event in events:
                opened = opened or event.kind in DERIVED_EVENT.values()
                started = started or event.kind == EventKind.STEP_STARTED
                reused = event.kind == EventKind.STEP_COMPLETED and _reused(event.payload)
                if reused and (started or not opened):
                    where = "after a step started" if started else "in a run derived from none"
                    found.append(Violation("reused_out_of_place", run_id, event.step_id,
                                           f"reused step_completed (seq {event.seq}) {where}"))
        return found

    def _pruned_but_present(self, conn: sa.Connection) -> list[Violation]:
        """A pruned run's id is never a run again (docs/retention.md)."""
        rows = conn.execute(sa.select(runs.c.id).join(pruned_runs, pruned_runs.c.run_id == runs.c.id))
        return [Violation("pruned_run_present", r.id, None, "the run was pruned, yet a run holds its id")
                for r in rows]

    def _started_again(self, conn: sa.Connection) -> list[Violation]:
        """A step started after it completed: a replay or a claim ran a finished step again."""
        je, done = journal_events, journal_events.alias("done")
        rows = conn.execute(sa.select(je.c.run_id, je.c.step_id, je.c.seq, je.c.generation).where(
            je.c.kind == EventKind.STEP_STARTED, sa.exists().where(
                done.c.run_id == je.c.run_id, done.c.step_id == je.c.step_id,
                done.c.kind == EventKind.STEP_COMPLETED, done.c.seq < je.c.seq)))
        return [Violation("started_after_completion", r.run_id, r.step_id,
                          f"step_started (seq {r.seq}, generation {r.generation}) after its step_completed")
                for r in rows]

    def _orphan_receipts(self, conn: sa.Connection) -> list[Violation]:
        je, rc = journal_events, side_effect_receipts
        rows = conn.execute(sa.select(rc.c.run_id, rc.c.step_id, rc.c.attempt, rc.c.status).where(
            ~sa.exists().where(je.c.run_id == rc.c.run_id, je.c.step_id == rc.c.step_id,
                               je.c.attempt == rc.c.attempt, je.c.kind == EventKind.STEP_STARTED)))
        return [Violation("receipt_without_step", r.run_id, r.step_id,
                          f"{r.status} receipt of attempt {r.attempt}, which never started") for r in rows]

    def _totals(self, conn: sa.Connection) -> list[Violation]:
        je = journal_events
        spent: dict[str, tuple[int, int, Decimal]] = {}
        # What was spent: model steps' completions and the confidence gate's samples.
        completions = sa.select(je.c.run_id, je.c.payload).where(
            je.c.kind.in_((EventKind.STEP_COMPLETED, EventKind.CONFIDENCE_EVALUATED)))
        for row in conn.execute(completions):
            usage = (row.payload or {}).get("usage")
            if usage:
                i, o, c = spent.get(row.run_id, (0, 0, Decimal(0)))
                spent[row.run_id] = (i + int(usage.get("input_tokens", 0)),
                                     o + int(usage.get("output_tokens", 0)),
                                     c + Decimal(str(usage.get("cost_usd", "0"))))
        found = []
        totals = sa.select(runs.c.id, runs.c.input_tokens, runs.c.output_tokens, runs.c.cost_usd)
        for r in conn.execute(totals):
            steps = spent.get(r.id, (0, 0, Decimal(0)))
            run_totals = (r.input_tokens, r.output_tokens, Decimal(r.cost_usd))
            if run_totals != steps:
                found.append(Violation("totals_disagree_with_steps", r.id, None,
                                       f"run {run_totals[0]}+{run_totals[1]} tokens ${run_totals[2]}, "
                                       f"steps {steps[0]}+{steps[1]} tokens ${steps[2]}"))
        return found

    def _seq_order(self, conn: sa.Connection) -> list[Violation]:
        """seq strictly increasing per run (the primary key guarantees it today; a schema change
        that lost it would show here)."""
        je, last, found = journal_events, dict[str, int](), []
        for r in conn.execute(sa.select(je.c.run_id, je.c.seq).order_by(je.c.run_id, je.c.seq)):
            if r.seq <= last.get(r.run_id, 0):
                found.append(Violation("seq_not_increasing", r.run_id, None, f"seq {r.seq}"))
            last[r.run_id] = r.seq
        return found

    def _anomalies_twice(self, conn: sa.Connection) -> list[Violation]:
        """At most one anomaly_detected per (run, kind, step) (docs/anomalies.md)."""
        je, seen, found = journal_events, set[tuple[str, str, str]](), []
        for r in conn.execute(sa.select(je.c.run_id, je.c.step_id, je.c.payload)
                              .where(je.c.kind == EventKind.ANOMALY_DETECTED).order_by(je.c.seq)):
            key = (r.run_id, str((r.payload or {}).get("kind")), r.step_id or "")
            if key in seen:
                found.append(Violation("anomaly_twice", r.run_id, r.step_id, f"{key[1]} journaled again"))
            seen.add(key)
        return found

    def _timers(self, conn: sa.Connection) -> list[Violation]:
        """A timer fires at most once, and only after it was set (a sleep node's)."""
        je, found = journal_events, []
        set_, fired = set[tuple[str, str, int]](), set[tuple[str, str, int]]()
        for r in conn.execute(sa.select(je.c.run_id, je.c.step_id, je.c.attempt, je.c.kind)
                              .where(je.c.kind.in_((EventKind.TIMER_SET, EventKind.TIMER_FIRED)))
                              .order_by(je.c.run_id, je.c.seq)):
            key = (r.run_id, r.step_id or "", r.attempt or 0)
            if r.kind == EventKind.TIMER_SET:
                set_.add(key)
            elif key in fired:
                found.append(Violation("timer_fired_twice", r.run_id, r.step_id, f"attempt {r.attempt}"))
            elif key not in set_:
                found.append(Violation("timer_fired_unset", r.run_id, r.step_id, f"attempt {r.attempt}"))
            else:
                fired.add(key)
        return found

    def _started_past_budget(self, conn: sa.Connection) -> list[Violation]:
        """No step is claimed after the run's budget failed it."""
        je, stop = journal_events, journal_events.alias("stop")
        rows = conn.execute(sa.select(je.c.run_id, je.c.step_id, je.c.seq, stop.c.payload).join(
            stop, sa.and_(stop.c.run_id == je.c.run_id, stop.c.kind == EventKind.STEP_FAILED,
                          stop.c.seq < je.c.seq)).where(je.c.kind == EventKind.STEP_STARTED))
        return [Violation("started_after_budget_stop", r.run_id, r.step_id,
                          f"step_started (seq {r.seq}) after the run's budget stopped it")
                for r in rows if ((r.payload or {}).get("error") or {}).get("code") == "budget_exceeded"]

    def _out_of_order(self, conn: sa.Connection) -> list[Violation]:
        """A step completed that was not on the ready frontier when it completed: replaying each
        run's completions in seq order, every one must be ready given those before it. This is
        what a forged message that started a step would leave, e.g. a step after an approval
        completed while the approval was undecided."""
        assert self._program_of is not None
        je, found = journal_events, []
        rows = conn.execute(sa.select(je.c.run_id, je.c.step_id, je.c.kind, je.c.payload)
                            .where(je.c.kind.in_((EventKind.STEP_COMPLETED, EventKind.STEP_WAITING)))
                            .order_by(je.c.run_id, je.c.seq)).all()
        plans: dict[tuple[str, str], ReadyCheck] = {}
        for run_id, events in itertools.groupby(rows, key=lambda r: r.run_id):
            run = self._run(conn, run_id)
            if run.kind == "microvm":
                continue  # its workload orders its own steps (docs/isolated-tier.md)
            key = (run.kind, run.graph_hash or run_id)
            if key not in plans:
                plans[key] = self._program_of(run.kind, run.graph)
            program, completed, waiting = plans[key], dict[str, Any](), dict[str, str]()
            for event in events:
                if event.kind == EventKind.STEP_WAITING:
                    waiting[event.step_id] = str((event.payload or {}).get("kind", "approval"))
                    continue
                if event.step_id in completed:
                    continue  # a second completion: _twice reports it
                if not program.is_ready(completed, event.step_id):
                    undecided = [s for s, kind in waiting.items()
                                 if kind == "approval" and s not in completed]
                    why = (f"completed while approval {', '.join(undecided)} was undecided" if undecided
                           else "completed before the steps it depends on")
                    found.append(Violation("completed_out_of_order", run_id, event.step_id, why))
                completed[event.step_id] = (event.payload or {}).get("output")
        return found


def _reused(payload: Any) -> bool:
    """Whether a step_completed is a step a retry or fork reused from its source run."""
    return isinstance(payload, dict) and payload.get("reused_from") is not None
