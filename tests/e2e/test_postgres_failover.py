"""The journal's Postgres fails over mid-run: the primary dies as a crashed host's would, its
synchronous standby is promoted, and PAL, on a libpq multi-host URL with
`target_session_attrs=read-write`, finds the new primary. Every run finishes, every step completes
once, no completion a reader saw is lost, and `pal doctor` finds the journal clean."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pal.cli.demo import wait_until
from pal.client import Client
from tests.conftest import REDIS_URL, migrated_postgres_backend
from tests.e2e.test_crash_recovery import assert_exactly_once, steps_completed
from tests.e2e.test_service_loss import napping_graph
from tests.support.postgres_servers import PostgresPair
from tests.support.processes import Processes


@pytest.fixture
def postgres_pair() -> Iterator[PostgresPair]:
    pair = PostgresPair()
    try:
        pair.start()
        yield pair
    finally:
        pair.stop_all()


def test_a_promoted_standby_takes_over_mid_run(postgres_pair: PostgresPair, redis_prefix: str,
                                               tmp_path: Path) -> None:
    backend = migrated_postgres_backend(tmp_path, postgres_pair.url(), REDIS_URL, redis_prefix)
    procs = Processes(backend, tmp_path)
    client = Client(backend.settings)
    try:
        procs.two_solo_workers_and_beat()
        run_ids = [client.start_run(napping_graph(0.3, 6), {"i": i}) for i in range(4)]
        assert wait_until(lambda: steps_completed(client, run_ids) >= 6, timeout=60)
        seen = {(e.run_id, e.seq, e.kind, e.step_id) for r in run_ids for e in client.events(r)}
        assert sum(kind == "step_completed" for _, _, kind, _ in seen) < 4 * 7  # runs still in flight
        postgres_pair.stop_primary()
        postgres_pair.promote_standby()
        client.runtime.journal.engine.dispose()  # this process's connections died with the primary
        runs = [client.wait(r, timeout=180) for r in run_ids]
        assert [r.status for r in runs] == ["succeeded"] * 4
        after = {(e.run_id, e.seq, e.kind, e.step_id) for r in run_ids for e in client.events(r)}
        # Synchronous replication: every event a reader saw committed survived, but for claims
        # (step_started), which commit without waiting for their WAL (docs/guarantees.md, "Durable
        # commits"): one lost in the failover is claimed again, with the same attempt, or written
        # back by its completion (assert_exactly_once's doctor finds no completion without a start).
        assert {s for s in seen if s[2] != "step_started"} <= after
        for run_id in run_ids:
            assert_exactly_once(client, run_id)
    finally:
        client.close()
        procs.stop_all()
