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
from pal.engine.vms import report, token_hash
from tests.support.graphs import approval, flaky, linear, parent_of
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
    # Each doorbell carried when it was sent (Redis fast path and send_task alike): its queue wait.
    waits = [s.attributes["pal.step.queue_wait_s"] for s in spans if s.attributes and "pal.step.id" in s.attributes]
    assert len(waits) == 5 and all(0 <= w < 30 for w in waits)  # type: ignore[operator]


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


TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_the_first_trace_links_to_the_callers_traceparent_and_a_bad_one_is_ignored(
        client: Client, tmp_path: Path) -> None:
    exporter = traced(client)
    with in_process_worker(client):
        linked = client.start_run(linear(tmp_path / "c", 1), {}, traceparent=TRACEPARENT.upper())
        ignored = client.start_run(linear(tmp_path / "c", 1), {}, traceparent="00-" + "0" * 32 + "-00f067aa0ba902b7-01")
        client.app.send_task("pal.start_run", args=[linear(tmp_path / "c", 1)], kwargs={"run_id": "by-celery"},
                             queue=client.runtime.settings.queue, headers={"traceparent": TRACEPARENT})
        assert wait_until(lambda: client.runtime.journal.runs.run_exists("by-celery"), timeout=30)
        for run_id in (linked, ignored, "by-celery"):
            assert client.wait(run_id, timeout=30).status == "succeeded"
        assert wait_until(lambda: all(roots(exporter.get_finished_spans(), r) for r in (linked, ignored, "by-celery")),
                          timeout=10)
    spans = exporter.get_finished_spans()
    for run_id, links in ((linked, [(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7)]), (ignored, []),
                          ("by-celery", [(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7)])):
        root = roots(spans, run_id)[1]
        assert [(link.context.trace_id, link.context.span_id) for link in root.links] == links, run_id
    assert "traceparent" not in client.events(ignored)[0].payload  # nothing invalid is journaled


def test_a_child_runs_first_trace_links_to_its_parent_steps_span(client: Client, tmp_path: Path) -> None:
    exporter = traced(client)
    with in_process_worker(client):
        parent = client.start_run(parent_of(linear(tmp_path / "c", 1)), {})
        assert client.wait(parent, timeout=30).status == "succeeded"
        child = next(r.id for r in client.list_runs(limit=10) if r.parent_run_id == parent)
        assert wait_until(lambda: roots(exporter.get_finished_spans(), child), timeout=10)
    spans = exporter.get_finished_spans()
    asking = [s for s in spans if s.attributes and s.attributes.get("pal.run.id") == parent
              and s.attributes.get("pal.step.id") == "sub" and s.attributes.get("pal.run.generation") == 1]
    root = roots(spans, child)[1]
    assert [(link.context.trace_id, link.context.span_id) for link in root.links] == \
        [(asking[0].context.trace_id, asking[0].context.span_id)]
    assert asking[0].name == "pal.step subagent"


def test_a_retried_attempt_and_an_anomaly_are_events_on_their_spans(client: Client, tmp_path: Path) -> None:
    exporter = traced(client)
    graph = flaky(tmp_path / "f", 2, {"maxAttempts": 3, "backoffMs": 1})
    graph["anomalies"] = {"maxRetries": 1}
    with in_process_worker(client):
        run_id = client.start_run(graph, {})
        assert client.wait(run_id, timeout=30).status == "succeeded"
        assert wait_until(lambda: roots(exporter.get_finished_spans(), run_id), timeout=10)
    attempts = sorted((s for s in exporter.get_finished_spans() if s.attributes
                       and s.attributes.get("pal.step.id") == "f"), key=lambda s: s.attributes["pal.step.attempt"])  # type: ignore[index]
    assert [a.attributes["pal.step.outcome"] for a in attempts] == ["retrying", "retrying", "completed"]  # type: ignore[index]
    assert attempts[0].status.status_code is StatusCode.ERROR
    assert [e.name for e in attempts[0].events] == ["pal.step.retry", "exception"]
    assert [e.name for e in attempts[2].events] == ["pal.anomaly"]  # two retries: past maxRetries 1
    assert attempts[2].events[0].attributes["pal.anomaly.kind"] == "retry_storm"  # type: ignore[index]


def test_the_isolated_tiers_reported_steps_share_their_vms_generation_trace(client: Client) -> None:
    exporter = traced(client)
    client.runtime.publish_vm = lambda vm_id: None  # no VM host here: the reports are made by hand
    run_id = client.start_run({"kind": "microvm", "command": ["python3", "agent.py"], "workdir": "w"}, {})
    [vm] = client.runtime.journal.vms.vms(run_id)
    assert client.runtime.journal.vms.take_vm(vm_id=vm.id, host="h", token_hash=token_hash("tok"), now=utcnow())
    for body in ({"type": "step", "step_id": "fetch", "event": "started"},
                 {"type": "step", "step_id": "fetch", "event": "completed", "output": 1},
                 {"type": "step", "step_id": "fetch", "event": "completed", "output": 2},  # repeated: no span
                 {"type": "exit", "code": 0, "output": "done"}):
        report(client.runtime, "tok", body)
    spans = exporter.get_finished_spans()
    trace_id, root_id = generation_ids(run_id, vm.generation)
    [step] = [s for s in spans if s.name == "pal.step fetch"]
    assert (step.context.trace_id, step.parent.span_id if step.parent else None) == (trace_id, root_id)
    assert step.attributes["pal.vm.id"] == vm.id and step.attributes["pal.step.outcome"] == "step_completed"  # type: ignore[index]
    root = roots(spans, run_id)[vm.generation]
    assert (root.context.span_id, root.attributes["pal.run.outcome"]) == (root_id, "succeeded")  # type: ignore[index]
