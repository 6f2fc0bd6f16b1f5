"""One trace per resume, in process (pal.engine.tracing, docs/observability.md): the official
OpenTelemetry SDK with its in-memory exporter, a real worker on each backend. Every step of a
generation shares its trace under a root with derived ids; an approval's park and wake give two
traces, the second linked to the first; a sweep's take-over writes the lost generation's root and
the next generation's links to it; with tracing off no span is made."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from pal.cli.demo import wait_until
from pal.client import Client
from pal.core.clock import utcnow
from pal.engine.recovery import sweep
from pal.engine.tracing import Tracing, generation_ids
from tests.support.graphs import approval, linear
from tests.support.workers import in_process_worker


def traced(client: Client) -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    client.runtime.__dict__["tracing"] = Tracing(SimpleSpanProcessor(exporter))
    return exporter


def roots(spans: tuple[ReadableSpan, ...], run_id: str) -> dict[int, ReadableSpan]:
    return {s.attributes["pal.run.generation"]: s for s in spans  # type: ignore[index,misc]
            if s.name == f"pal.run {run_id}"}


def steps(spans: tuple[ReadableSpan, ...]) -> list[tuple[Any, ...]]:
    return [(s.attributes["pal.step.id"], s.attributes["pal.run.generation"], s.context.trace_id,  # type: ignore[index,union-attr]
             s.parent.span_id if s.parent else None) for s in spans if s.attributes and "pal.step.id" in s.attributes]


def test_every_step_of_a_run_shares_one_trace_under_its_derived_root(client: Client, tmp_path: Path) -> None:
    exporter = traced(client)
    with in_process_worker(client):
        run_id = client.start_run(linear(tmp_path / "c", 3), {})
        assert client.wait(run_id, timeout=30).status == "succeeded"
        assert wait_until(lambda: roots(exporter.get_finished_spans(), run_id), timeout=10)
    spans = exporter.get_finished_spans()
    trace_id, root_id = generation_ids(run_id, 1)
    assert sorted(steps(spans)) == sorted((s, 1, trace_id, root_id) for s in ("start", "s0", "s1", "s2", "out"))
    [root] = roots(spans, run_id).values()
    assert (root.context.trace_id, root.context.span_id, root.parent) == (trace_id, root_id, None)
    assert root.attributes["pal.run.outcome"] == "succeeded" and not root.links  # type: ignore[index]
    tool = next(s for s in spans if s.attributes and s.attributes.get("pal.step.id") == "s0")
    assert tool.name == "execute_tool count" and tool.attributes["gen_ai.tool.name"] == "count"  # type: ignore[index]
    assert tool.attributes["pal.step.outcome"] == "completed" and tool.attributes["pal.step.attempt"] == 1  # type: ignore[index]


def test_an_approval_park_and_wake_are_two_traces_the_second_linked_to_the_first(client: Client,
                                                                                 tmp_path: Path) -> None:
    exporter = traced(client)
    with in_process_worker(client):
        run_id = client.start_run(approval(tmp_path / "c"), {"amount": 3, "customer": "z"})
        assert wait_until(lambda: client.get_run(run_id).status == "waiting", timeout=30)
        assert wait_until(lambda: 1 in roots(exporter.get_finished_spans(), run_id), timeout=10)
        client.approve(run_id, "gate")
        assert client.wait(run_id, timeout=30).status == "succeeded"
        assert wait_until(lambda: len(roots(exporter.get_finished_spans(), run_id)) == 2, timeout=10)
    assert len(roots(exporter.get_finished_spans(), run_id)) == 2  # one trace per drive, none for the timer
    spans = exporter.get_finished_spans()
    found = roots(spans, run_id)
    first, second = found[1], found[max(found)]  # the park's wake-up timer took a generation too
    assert first.attributes["pal.run.outcome"] == "waiting"  # type: ignore[index]
    assert second.attributes["pal.run.outcome"] == "succeeded"  # type: ignore[index]
    assert first.context.trace_id != second.context.trace_id
    assert [link.context.span_id for link in second.links] == [first.context.span_id]
    by_step = {s: (gen, trace) for s, gen, trace, _ in steps(spans)}
    assert by_step["gate"][0] == 1 and by_step["pay"] == (max(found), second.context.trace_id)


def test_a_sweep_take_over_writes_the_lost_root_and_the_next_generation_links_to_it(client: Client,
                                                                                     tmp_path: Path) -> None:
    exporter = traced(client)
    run_id = client.start_run(linear(tmp_path / "c", 2), {})  # no worker yet: gen 1's lease lapses
    later = utcnow() + timedelta(seconds=client.runtime.settings.lease_ttl * 3)
    assert run_id in sweep(client.runtime, now=later).recovered
    [lost] = roots(exporter.get_finished_spans(), run_id).values()
    assert lost.attributes["pal.run.generation"] == 1 and lost.status.status_code is StatusCode.ERROR  # type: ignore[index]
    with in_process_worker(client):
        assert client.wait(run_id, timeout=30).status == "succeeded"
        assert wait_until(lambda: 2 in roots(exporter.get_finished_spans(), run_id), timeout=10)
    spans = exporter.get_finished_spans()
    second = roots(spans, run_id)[2]
    assert [link.context.span_id for link in second.links] == [generation_ids(run_id, 1)[1]]
    assert second.attributes["pal.run.resumed_steps"] == 1  # type: ignore[index]
    assert {gen for _, gen, _, _ in steps(spans)} == {2}  # the stale generation-1 messages ran nothing


def test_tracing_is_off_without_an_otlp_endpoint(client: Client, tmp_path: Path) -> None:
    assert client.runtime.tracing is None  # no OTEL_EXPORTER_OTLP_* in the test environment
