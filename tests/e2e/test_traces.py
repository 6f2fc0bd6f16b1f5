"""One trace per resume across real processes: `pal worker`s export OTLP/HTTP to a local stand-in
collector. A worker SIGKILLed in step s1 and the beat-driven sweep give two traces, the second
linked to the first; steps completed before the crash get no span after it; the prefork workers'
spans of one generation all share its trace (docs/observability.md)."""

from __future__ import annotations

import signal
from pathlib import Path

from pal.cli.demo import wait_until
from pal.client import Client
from pal.engine.tracing import generation_ids
from tests.conftest import Backend
from tests.support.api_server import Api
from tests.support.graphs import linear
from tests.support.otlp_collector import OtlpCollector
from tests.support.processes import Processes


def test_a_sigkill_and_a_sweep_give_two_linked_traces(processes: Processes, postgres_backend: Backend,
                                                      tmp_path: Path) -> None:
    with OtlpCollector() as collector:
        otel = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url, "OTEL_BSP_SCHEDULE_DELAY": "100",
                "OTEL_SERVICE_NAME": "pal-test"}
        doomed = processes.worker("doomed", PAL_FAULT_POINT="after_claim_commit:s1",
                                  PAL_FAULT_ONCE_FILE=str(tmp_path / "fired"), **otel)
        client = Client(postgres_backend.settings)
        run_id = client.start_run(linear(tmp_path / "c", 3), {})
        doomed.wait(timeout=120)
        assert doomed.returncode == -signal.SIGKILL
        processes.worker("fresh", concurrency=2, **otel)  # prefork: the steps run in pool children
        processes.beat()
        assert client.wait(run_id, timeout=120).status == "succeeded"
        (trace_1, root_1), (trace_2, root_2) = generation_ids(run_id, 1), generation_ids(run_id, 2)

        def root_of(trace_id: int) -> bool:
            return any(s.span_id == (root_1 if trace_id == trace_1 else root_2) for s in collector.received())

        def steps_of(trace_id: int) -> set[str]:
            return {s.attributes["pal.step.id"] for s in collector.received()
                    if s.trace_id == trace_id and "pal.step.id" in s.attributes}

        # Each pool process exports its own batches: the root's may arrive before another's steps.
        assert wait_until(lambda: root_of(trace_1) and root_of(trace_2)
                          and {"s1", "s2", "out"} <= steps_of(trace_2), timeout=30), collector.received()
        client.close()
    spans = collector.received()
    lost = next(s for s in spans if s.span_id == root_1)
    second = next(s for s in spans if s.span_id == root_2)
    assert lost.trace_id == trace_1 and lost.error and lost.attributes["pal.run.outcome"] == "taken_over"
    assert second.trace_id == trace_2 and second.links == [(trace_1, root_1)]
    assert second.attributes["pal.run.outcome"] == "succeeded" and second.service == "pal-test"
    after = [s for s in spans if s.trace_id == trace_2 and s.span_id != root_2]
    assert {s.attributes["pal.step.id"] for s in after} == {"s1", "s2", "out"}  # start, s0: done before
    assert all(s.parent_span_id == root_2 and s.attributes["pal.run.generation"] == 2 for s in after)
    assert all(s.trace_id in (trace_1, trace_2) for s in spans)  # nothing of this run outside its traces


def test_a_traceparent_header_on_post_v1_runs_is_kept_and_a_bad_one_ignored(api: Api, tmp_path: Path) -> None:
    good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    for run_id, header in (("traced-1", good), ("traced-2", "00-nonsense"), ("traced-3", "x" * 300)):
        reply = api.post("/v1/runs", json={"graph": linear(tmp_path / "c", 1), "run_id": run_id},
                         headers={"traceparent": header})
        assert reply.status_code == (422 if len(header) > 256 else 201), reply.text
    assert api.client.events("traced-1")[0].payload["traceparent"] == good
    assert "traceparent" not in api.client.events("traced-2")[0].payload
    assert not api.client.runtime.journal.runs.run_exists("traced-3")  # refused before anything is written
