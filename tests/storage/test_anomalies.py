"""Anomalies: each journaled once per (run, kind, step), by the holder of the lease only, and listed
per run or per tenant, newest first."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from pal.core.anomalies import Anomaly, AnomalyKind
from pal.storage.journal import Journal
from tests.storage.kit import at, events, fence, new_run


def loop_anomaly(observed: int = 8, step: str | None = "each") -> Anomaly:
    return Anomaly(AnomalyKind.RUNAWAY_LOOP, observed, 8.0, "static", step, "near the cap")


def test_an_anomaly_is_journaled_once_per_run_kind_and_step(journal: Journal) -> None:
    new_run(journal)
    storm = Anomaly(AnomalyKind.RETRY_STORM, 11, 10, "static", None, "a storm")
    assert journal.anomalies.record_anomalies(fence(seconds=1), [loop_anomaly(), storm]) == [loop_anomaly(), storm]
    assert journal.anomalies.record_anomalies(fence(seconds=2), [loop_anomaly(9), storm]) == []
    fresh = Journal(journal.engine)  # another process: no memory of what was journaled
    assert fresh.anomalies.record_anomalies(fence(seconds=3), [loop_anomaly(10), storm]) == []
    other_step = loop_anomaly(step="inner")
    assert fresh.anomalies.record_anomalies(fence(seconds=4), [other_step]) == [other_step]
    journaled = events(journal, kind="anomaly_detected")
    assert [(e.step_id, e.payload["kind"], e.payload["observed"]) for e in journaled] == [
        ("each", "runaway_loop", 8), (None, "retry_storm", 11), ("inner", "runaway_loop", 8)]
    assert journal.doctor.violations() == []


def test_a_fenced_out_worker_journals_nothing(journal: Journal) -> None:
    new_run(journal)
    assert journal.anomalies.record_anomalies(fence(generation=2, seconds=1), [loop_anomaly()]) == []
    assert events(journal, kind="anomaly_detected") == []
    # ...and did not mark it journaled: the lease's holder still reports it.
    assert journal.anomalies.record_anomalies(fence(seconds=2), [loop_anomaly()]) == [loop_anomaly()]


def test_anomalies_are_listed_per_run_and_per_tenant_newest_first(journal: Journal) -> None:
    new_run(journal, "r1", tenant="t1")
    new_run(journal, "r2", tenant="t1")
    new_run(journal, "r3", tenant="t2")
    journal.anomalies.record_anomalies(fence("r1", seconds=1), [loop_anomaly()])
    journal.anomalies.record_anomalies(fence("r2", seconds=2), [loop_anomaly()])
    journal.anomalies.record_anomalies(fence("r3", seconds=3), [loop_anomaly()])
    assert [a["run_id"] for a in journal.anomalies.anomalies(tenant_id="t1")] == ["r2", "r1"]
    assert [a["run_id"] for a in journal.anomalies.anomalies(run_id="r3")] == ["r3"]
    assert journal.anomalies.anomalies(tenant_id="t1", since=at(2)) == [journal.anomalies.anomalies(run_id="r2")[0]]
    assert journal.anomalies.anomalies(tenant_id="nobody") == []


def test_racing_reporters_journal_an_anomaly_once(journal: Journal) -> None:
    """Four processes (fresh journals, no shared memory) report the same anomaly at once: one
    row, one event; every other report writes nothing."""
    new_run(journal)
    reporters = [Journal(journal.engine) for _ in range(4)]
    barrier = threading.Barrier(len(reporters))

    def report(reporter: Journal) -> list[Anomaly]:
        barrier.wait()
        return reporter.anomalies.record_anomalies(fence(seconds=1), [loop_anomaly()])

    with ThreadPoolExecutor(len(reporters)) as pool:
        written = list(pool.map(report, reporters))
    assert sorted(len(w) for w in written) == [0, 0, 0, 1]
    assert len(events(journal, kind="anomaly_detected")) == 1
