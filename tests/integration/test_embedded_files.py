"""The embedded journal's files are private to the user that runs PAL (docs/security.md, "The
database and the broker"): the review found `.pal/pal.db` world-readable, with every tenant's
graphs and inputs in it. PAL never sets the umask (it is a library in other people's processes),
so these tests run under a umask of 0, where only PAL's own modes keep the files private."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from pal.client import Client
from pal.config import load_settings
from pal.storage.database import create_engine
from pal.storage.schema.migrate import upgrade
from tests.conftest import Backend
from tests.support.graphs import counted, single
from tests.support.workers import in_process_worker


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def open_umask() -> Iterator[None]:
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


def test_the_embedded_store_made_from_nothing_is_private(tmp_path: Path, open_umask: None,
                                                         counter: Path) -> None:
    home = tmp_path / "nothing" / "yet" / ".pal"
    existing = mode(tmp_path)
    settings = load_settings({"PAL_HOME": str(home)})  # the embedded default: $PAL_HOME/pal.db
    engine = create_engine(settings.database_url)
    upgrade(engine)  # what `pal db upgrade` does
    engine.dispose()
    client = Client(settings)
    try:
        client.start_run(single(counted("a", counter)), {"x": 1})  # a write: SQLite's WAL and its index
        database = home / "pal.db"
        files = [database, home / "pal.db-wal", home / "pal.db-shm"]
        assert all(f.exists() for f in files), sorted(p.name for p in home.iterdir())
        assert {f.name: mode(f) for f in files} == {f.name: 0o600 for f in files}
        folders = [home, home.parent, home.parent.parent, home / "broker" / "queue", home / "broker" / "control"]
        assert {str(f): mode(f) for f in folders} == {str(f): 0o700 for f in folders}
    finally:
        client.close()
    assert mode(tmp_path) == existing  # a folder that was there already is the operator's


def test_a_journal_an_older_pal_left_readable_is_made_private(tmp_path: Path, open_umask: None) -> None:
    """An existing database and its companions lose their group and other bits; the folder that
    held them already is the operator's and keeps its mode."""
    folder = tmp_path / "shared"
    folder.mkdir(mode=0o755)
    database = folder / "pal.db"
    engine = create_engine(f"sqlite:///{database}")
    upgrade(engine)
    engine.dispose()
    for path in (database, folder / "pal.db-wal", folder / "pal.db-journal"):
        path.touch()
        path.chmod(0o644)
    create_engine(f"sqlite:///{database}").dispose()
    assert {p.name: mode(p) for p in folder.iterdir()} == {
        "pal.db": 0o600, "pal.db-wal": 0o600, "pal.db-journal": 0o600}
    assert mode(folder) == 0o755


def test_a_message_file_that_does_not_decode_is_dropped_and_the_worker_goes_on(
        backend: Backend, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    if not backend.settings.is_embedded_broker:
        return  # Redis's counterpart: tests/e2e/test_inline_steps.py (junk pushed onto the queue)
    client = Client(backend.settings)
    queue = backend.settings.broker_folder / "queue"
    (queue / f"0_junk.{backend.settings.queue}.msg").write_bytes(b"")  # as a torn read sees it
    (queue / f"1_junk.{backend.settings.queue}.msg").write_bytes(b"\xff\xfe not json")
    try:
        with caplog.at_level("WARNING"), in_process_worker(client):
            run = client.wait(client.start_run(single(counted("only", tmp_path / "calls.log")), {}), timeout=60)
        assert run.status == "succeeded"
        assert caplog.text.count("did not decode, dropped") == 2
    finally:
        client.close()
