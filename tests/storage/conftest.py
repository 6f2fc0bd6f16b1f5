"""Fixtures of the storage contract tests: each test gets a Journal over its own freshly migrated
database (a Postgres schema of its own, or a copy of a SQLite file migrated once per session), and
after each test that journal must still be clean by `pal doctor`'s invariants."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from pal.storage.journal import Journal
from tests.storage.kit import BACKENDS, migrated_journal, postgres_journal


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite journal migrated once per session; each test gets a copy of the file."""
    path = tmp_path_factory.mktemp("storage") / "template.db"
    with migrated_journal(f"sqlite:///{path}"):
        pass
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no WAL left beside it
    return path


@pytest.fixture(params=BACKENDS)
def journal(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Journal]:
    """A Journal on its own database; each test using it runs on SQLite and on Postgres."""
    if request.param == "postgres":
        context = postgres_journal(request.getfixturevalue("pg_admin"))
    else:
        copy = tmp_path / "journal.db"
        shutil.copyfile(request.getfixturevalue("sqlite_template"), copy)
        context = migrated_journal(f"sqlite:///{copy}", migrate=False)
    with context as journal:
        assert (journal.calls is None) == (request.param == "sqlite")
        yield journal
        assert journal.violations() == []
