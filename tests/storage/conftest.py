"""Fixtures of the storage contract tests: each test gets a Journal over its own freshly migrated
database (a Postgres schema of its own, or a copy of a SQLite file migrated once per process), and
after each test that journal must still be clean by `pal doctor`'s invariants."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pal.storage.journal import Journal
from tests.storage.kit import BACKENDS, migrated_journal, postgres_journal


@pytest.fixture(params=BACKENDS)
def journal(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Journal]:
    """A Journal on its own database; each test using it runs on SQLite and on Postgres."""
    if request.param == "postgres":
        context = postgres_journal(request.getfixturevalue("pg_admin"))
    else:  # a copy of a file migrated once per process (tests/support/migrated.py)
        context = migrated_journal(f"sqlite:///{tmp_path / 'journal.db'}")
    with context as journal:
        assert (journal.calls is None) == (request.param == "sqlite")
        yield journal
        assert journal.doctor.violations() == []
