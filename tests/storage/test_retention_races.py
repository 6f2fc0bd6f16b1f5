"""A prune racing a retry or fork of the run it deletes, on Postgres (docs/retention.md): the retry
sees its source whole or gets a clean "no run", and a prune passes over a source a retry holds.
(SQLite serialises every writing transaction: BEGIN IMMEDIATE, pal.storage.database.)"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from pal.cli.demo import wait_until
from pal.core.vocabulary import RunStatus, SourceKind
from pal.errors import RunNotFound
from pal.storage.journal import Journal
from pal.storage.lineage import Derived, DerivedRequest
from pal.storage.retention import PruneQuery
from pal.storage.schema import journal_events, runs
from tests.storage.kit import TTL, at, postgres_journal
from tests.storage.test_retention import CUTOFF, failed


@pytest.fixture
def pg_journal(pg_admin: sa.Engine) -> Iterator[Journal]:
    with postgres_journal(pg_admin) as journal:
        yield journal
        assert journal.doctor.violations() == []


def retry(journal: Journal, run_id: str) -> Derived:
    request = DerivedRequest("r1", run_id, SourceKind.RETRY, None, {"x": 1}, keep=lambda _s: True,
                             allowed=(RunStatus.FAILED,), tenant_id="t1")
    return journal.lineage.create_derived_run(request, frontier=lambda _s, _r: ("a",), now=at(50), lease_ttl=TTL)


def test_a_prune_passes_over_a_source_a_retry_is_reading(pg_journal: Journal) -> None:
    failed(pg_journal, "r1", 10)
    with pg_journal.engine.connect() as reader, reader.begin():
        # What create_derived_run takes first on its source (pal.storage.lineage).
        reader.execute(sa.select(runs.c.id).where(runs.c.id == "r1").with_for_update(read=True, key_share=True))
        passed = pg_journal.retention.prune_batch(PruneQuery(CUTOFF), after=None, now=at(60))
        assert (passed.families, passed.runs) == (0, 0)
    assert pg_journal.runs.get_run("r1").status == "failed"
    done = pg_journal.retention.prune_batch(PruneQuery(CUTOFF), after=None, now=at(60))
    assert (done.families, done.runs, done.events) == (1, 1, 4)


def test_a_retry_waiting_on_a_prune_gets_no_run_not_half_a_source(pg_journal: Journal) -> None:
    failed(pg_journal, "r1", 10)
    outcome: list[BaseException | Derived] = []

    def derive() -> None:
        try:
            outcome.append(retry(pg_journal, "d1"))
        except BaseException as exc:
            outcome.append(exc)

    with pg_journal.engine.connect() as pruner:
        tx = pruner.begin()
        # A prune's transaction, stopped between its deletes and its commit.
        pruner.execute(sa.select(runs.c.id).where(runs.c.id == "r1").with_for_update())
        pruner.execute(journal_events.delete().where(journal_events.c.run_id == "r1"))
        pruner.execute(runs.delete().where(runs.c.id == "r1"))
        thread = threading.Thread(target=derive)
        thread.start()
        assert wait_until(lambda: _waiting_for_a_lock(pg_journal), timeout=30)
        tx.commit()
    thread.join(timeout=60)
    assert len(outcome) == 1 and isinstance(outcome[0], RunNotFound)
    with pytest.raises(RunNotFound):
        pg_journal.runs.get_run("d1")


def _waiting_for_a_lock(journal: Journal) -> bool:
    with journal.engine.connect() as conn:
        return bool(conn.execute(sa.text(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query ILIKE '%FOR KEY SHARE%'")).scalar_one())
