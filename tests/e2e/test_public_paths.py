"""PAL on Celery's and kombu's public paths only (PAL_CELERY_FAST_PATHS=none, as when a Celery or
kombu release changed a private name a fast path needs, pal.workers.celery_private): a solo and a
prefork worker run graphs with every step once, say so in their banner, and a SIGKILL at each step
fault point loses nothing."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from pal.client import Client
from pal.core.faults import STEP_POINTS
from tests.conftest import Backend
from tests.e2e.test_crash_recovery import killed_at_then_finished
from tests.support.graphs import linear
from tests.support.processes import Processes
from tests.support.tools import calls

PUBLIC = {"PAL_CELERY_FAST_PATHS": "none"}


@pytest.mark.parametrize("pool", ["solo", "prefork"])
def test_workers_on_the_public_paths_run_every_step_once(processes: Processes, postgres_backend: Backend,
                                                         tmp_path: Path, pool: str) -> None:
    processes.common |= PUBLIC
    processes.worker(pool, concurrency=2 if pool == "prefork" else 0)
    client = Client(postgres_backend.settings)
    try:
        ledgers = [tmp_path / f"calls-{n}.log" for n in range(8)]
        run_ids = [client.start_run(linear(ledger, 3), {}) for ledger in ledgers]
        for run_id in run_ids:
            assert client.wait(run_id, timeout=120).status == "succeeded"
            completed = Counter(e.step_id for e in client.events(run_id) if e.kind == "step_completed")
            assert set(completed.values()) == {1} and len(completed) == 5, completed
        assert all(sorted(calls(ledger)) == ["s0", "s1", "s2"] for ledger in ledgers)
        banner = (processes.folder / f"{pool}.log").read_text()
        assert "fast paths publisher, inline, redis_transport, event_batches, atomic_files off" in banner
        assert "Celery/kombu fast path 'publisher' is off (PAL_CELERY_FAST_PATHS=none)" in banner
    finally:
        client.close()


@pytest.mark.parametrize("point", STEP_POINTS)
def test_a_sigkill_on_the_public_paths_loses_nothing(processes: Processes, postgres_backend: Backend,
                                                     tmp_path: Path, point: str) -> None:
    processes.common |= PUBLIC
    killed_at_then_finished(processes, postgres_backend, tmp_path, point)
