"""`pal runs prune` as a user runs it (docs/retention.md): progress per batch and a summary, a dry
run that writes nothing, kept receipts that `pal receipts export` still serves and that verify,
every bad option refused with exit 2 and nothing deleted, and a run in flight under a real worker
left whole while a prune runs in another process, `pal doctor` clean after it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from pal.cli.demo import wait_until
from pal.client import Client
from pal.core import dsse
from pal.storage.database import create_engine
from pal.storage.journal import Journal
from pal.storage.schema import journal_events, runs
from tests.conftest import Backend
from tests.storage import kit
from tests.storage.kit import at, fence, new_run
from tests.storage.test_run_receipts import KEY
from tests.support.graphs import linear
from tests.support.processes import Processes

SIGNING = {"PAL_SIGNING_KEY": dsse.private_text(KEY.private)}
YEARS_BEFORE_T0 = -8 * 365 * 86400.0  # kit's clock starts in 2030: these runs finished in 2022


@contextmanager
def journal_of(backend: Backend) -> Iterator[Journal]:
    engine = create_engine(backend.settings.database_url)
    try:
        yield Journal(engine)
    finally:
        engine.dispose()


def finished_runs(backend: Backend, count: int, *, seconds: float = YEARS_BEFORE_T0, prefix: str = "old") -> None:
    with journal_of(backend) as journal:
        for n in range(count):
            run_id = f"{prefix}-{n}"
            new_run(journal, run_id, seconds=seconds + n)
            f = fence(run_id, seconds=seconds + n + 0.5)
            claim = journal.steps.claim_step(f, "a")
            journal.steps.complete_step(f, "a", claim.attempt, {"n": n}, plan=kit.finishing({"n": n}))


def count_runs(backend: Backend) -> tuple[int, int]:
    with journal_of(backend) as journal, journal.engine.connect() as conn:
        return (conn.execute(sa.select(sa.func.count()).select_from(runs)).scalar_one(),
                conn.execute(sa.select(sa.func.count()).select_from(journal_events)).scalar_one())


@pytest.fixture
def cli(backend: Backend, tmp_path: Path) -> Iterator[Processes]:
    processes = Processes(backend, tmp_path)
    yield processes
    processes.stop_all()  # the workers a test started, not left running after it


def test_progress_per_batch_then_a_summary(backend: Backend, cli: Processes) -> None:
    finished_runs(backend, 5)
    finished_runs(backend, 1, seconds=0, prefix="young")  # finished in 2030
    pruned = cli.cli("runs", "prune", "--finished-before", "2023-01-01", "--batch", "2")
    assert pruned.returncode == 0, pruned.stderr
    lines = pruned.stdout.splitlines()
    assert lines[0] == ("pruning runs finished before 2023-01-01T00:00:00+00:00, 2 families per batch")
    assert [line.split(" so far")[0] for line in lines[1:4]] == [
        "batch 1: pruned 2 runs, 8 events", "batch 2: pruned 4 runs, 16 events", "batch 3: pruned 5 runs, 20 events"]
    assert all("runs/s" in line and "events/s" in line for line in lines[1:4])
    assert lines[4].startswith("pruned 5 run families (5 runs, 20 events) in 3 batches, ")
    assert count_runs(backend) == (1, 4)


def test_a_dry_run_counts_and_writes_nothing(backend: Backend, cli: Processes) -> None:
    finished_runs(backend, 3)
    before = count_runs(backend)
    dry = cli.cli("runs", "prune", "--finished-before", "30d", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    summary = json.loads(dry.stdout)
    assert (summary["dry_run"], summary["families"], summary["runs"], summary["events"]) == (True, 3, 3, 12)
    assert count_runs(backend) == before
    assert cli.cli("runs", "show", "old-0").returncode == 0


@pytest.mark.parametrize(("args", "message"), [
    (["--finished-before", "yesterday"], "is not an ISO 8601 date"),
    (["--finished-before", "2030-13-45"], "is not an ISO 8601 date"),
    (["--finished-before", "9" * 5000], "--finished-before must be an ISO 8601 date"),
    (["--finished-before", "-30d"], "is not an ISO 8601 date"),
    (["--finished-before", ""], "--finished-before must be an ISO 8601 date"),
    (["--finished-before", "30d", "--batch", "0"], "--batch must be between 1 and 10000"),
    (["--finished-before", "30d", "--batch", "-5"], "--batch must be between 1 and 10000"),
    (["--finished-before", "30d", "--batch", "10000000"], "--batch must be between 1 and 10000"),
    (["--finished-before", "30d", "--tenant", "../other tenant"], "tenant '../other tenant' is invalid"),
    (["--finished-before", "30d", "--keep-receipts"], "receipts are off: set PAL_SIGNING_KEY"),
])
def test_bad_options_exit_2_and_delete_nothing(backend: Backend, cli: Processes, args: list[str],
                                               message: str) -> None:
    finished_runs(backend, 1)
    refused = cli.cli("runs", "prune", *args)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert message in refused.stderr and "Traceback" not in refused.stderr
    assert count_runs(backend) == (1, 4)


def test_a_far_future_cutoff_prunes_only_finished_runs(backend: Backend, cli: Processes) -> None:
    finished_runs(backend, 2)
    with journal_of(backend) as journal:
        new_run(journal, "live", seconds=YEARS_BEFORE_T0)
    pruned = cli.cli("runs", "prune", "--finished-before", "9999-12-31T23:59:59Z", "--json")
    assert pruned.returncode == 0, pruned.stderr
    assert json.loads(pruned.stdout)["runs"] == 2
    assert count_runs(backend) == (1, 1) and cli.cli("runs", "show", "live").returncode == 0


def test_kept_receipts_are_exported_after_the_prune_and_verify(backend: Backend, cli: Processes,
                                                               tmp_path: Path) -> None:
    finished_runs(backend, 2)
    before = cli.cli("receipts", "export", "old-0", **SIGNING)
    assert before.returncode == 0, before.stderr
    pruned = cli.cli("runs", "prune", "--finished-before", "2023-01-01", "--keep-receipts", **SIGNING)
    assert pruned.returncode == 0, pruned.stderr
    assert "2 receipts kept" in pruned.stdout and count_runs(backend) == (0, 0)
    after = cli.cli("receipts", "export", "old-0", "-o", str(tmp_path / "old-0.json"), **SIGNING)
    assert after.returncode == 0, after.stderr
    assert (tmp_path / "old-0.json").read_text() == before.stdout
    public = dsse.public_text(KEY.public)
    verified = cli.cli("receipts", "verify", str(tmp_path / "old-0.json"), "--key", public)
    assert verified.returncode == 0 and "verified: run old-0 succeeded, 4 events" in verified.stdout
    gone = cli.cli("runs", "show", "old-0")
    assert gone.returncode == 3
    (tmp_path / "g.json").write_text(json.dumps(linear(tmp_path / "calls.log", 1)))
    again = cli.cli("run", str(tmp_path / "g.json"), "--run-id", "old-0", "--no-follow")
    assert again.returncode == 6 and "run id 'old-0' is not available" in again.stderr
    doctor = cli.cli("doctor")
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr


@pytest.mark.parametrize("backend", ["postgres"], indirect=True)
def test_a_run_in_flight_under_a_worker_is_untouched_by_a_concurrent_prune(
        backend: Backend, cli: Processes, tmp_path: Path) -> None:
    finished_runs(backend, 40)
    cli.worker("w1")
    client = Client(backend.settings)
    try:
        graph = linear(tmp_path / "calls.log", 30)
        # One step naps, so that the run is still in flight while the prune runs: a solo worker
        # runs 30 quick steps in less time than a poll takes to see the run running.
        nap = next(node for node in graph["nodes"] if node["id"] == "s15")
        nap["data"] = {"tool": "nap", "args": {"seconds": 4}}
        run_id = client.start_run(graph, run_id="busy")
        cutoff = datetime.now(UTC).isoformat()  # the busy run finishes after it: never pruned
        assert wait_until(lambda: client.get_run(run_id).status == "running", timeout=60)
        assert client.get_run(run_id).status == "running"  # in flight as the prune starts: s15 naps
        prune = subprocess.Popen([sys.executable, "-m", "pal.cli", "runs", "prune", "--finished-before", cutoff,
                                  "--batch", "1"], env=cli.env(), stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
        out, err = prune.communicate(timeout=120)
        assert prune.returncode == 0, err
        assert "pruned 40 run families" in out
        finished = client.wait(run_id, timeout=120)
        assert finished.status == "succeeded"
        kinds = [e.kind for e in client.events(run_id)]
        assert kinds.count("step_completed") == 32 and kinds[-1] == "run_succeeded"
    finally:
        client.close()
    assert count_runs(backend)[0] == 1
    doctor = cli.cli("doctor")
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr


def test_the_cutoff_forms(backend: Backend, cli: Processes) -> None:
    """An ISO date is UTC midnight; a time without an offset is UTC; an offset is honoured."""
    finished_runs(backend, 1, seconds=0)  # finished at 2030-01-01T00:00:00.5Z
    for cutoff in ("2030-01-01", "2030-01-01T00:00:00", "2030-01-01T01:00:00+01:00", "2030-01-01T00:00:00.5Z"):
        kept = cli.cli("runs", "prune", "--finished-before", cutoff, "--json")
        assert kept.returncode == 0 and json.loads(kept.stdout)["runs"] == 0, (cutoff, kept.stderr)
    assert at(0.5).isoformat() == "2030-01-01T00:00:00.500000+00:00"
    pruned = cli.cli("runs", "prune", "--finished-before", "2029-12-31T19:00:00.6-05:00", "--json")
    assert json.loads(pruned.stdout)["runs"] == 1
