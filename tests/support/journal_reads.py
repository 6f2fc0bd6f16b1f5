"""What tests of the step protocol read of a journal: the attempts a step started, the one-call
statements and transactions a process made, and which events one transaction wrote."""

from __future__ import annotations

import itertools
from typing import Any

import sqlalchemy as sa

from pal.client import Client
from pal.storage.sql.queries import Query


def started(client: Client, run_id: str, step_id: str) -> list[int | None]:
    """The attempts of the step's `step_started` events, in order."""
    return [e.attempt for e in client.events(run_id) if e.kind == "step_started" and e.step_id == step_id]


class Counted:
    """Counts the autocommit calls and the transactions of a journal."""

    def __init__(self, client: Client) -> None:
        journal = client.runtime.journal
        self.calls: list[str] = []
        self.transactions = 0
        autocommit = journal.calls
        assert autocommit is not None
        original = autocommit.rows

        def rows(call: Query, params: Any, meanwhile: Any = None) -> Any:
            self.calls.append(call.name)
            return original(call, params, meanwhile)

        autocommit.rows = rows  # type: ignore[method-assign]

        def begun(*_: Any) -> None:
            self.transactions += 1

        sa.event.listen(journal.engine, "begin", begun)


def step_transactions(client: Client, run_id: str) -> list[tuple[str, str, str]]:
    """(xmin, kind, step) of the run's step_started and step_completed events in seq order (Postgres:
    one xmin per transaction)."""
    with client.runtime.journal.engine.connect() as conn:
        rows = conn.execute(sa.text(
            "SELECT xmin::text, kind, step_id FROM journal_events WHERE run_id = :r "
            "AND kind IN ('step_started', 'step_completed') ORDER BY seq"), {"r": run_id}).all()
    return [(row[0], row[1], row[2]) for row in rows]


def started_in_completions(client: Client, run_id: str) -> list[str]:
    """The steps whose step_started is in the transaction of the step_completed just before it."""
    return [b[2] for a, b in itertools.pairwise(step_transactions(client, run_id))
            if a[1] == "step_completed" and b[1] == "step_started" and a[0] == b[0]]
