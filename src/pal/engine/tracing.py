"""One OpenTelemetry trace per resume: each (run, generation) is a trace (docs/observability.md).

A run's generation changes whenever a new process takes the run over: the first drive is
generation 1, a crash re-drive by the sweep and the wake after an approval each start the next. The
trace id and the root span id of a generation are derived from (run id, generation) and an
optional salt (`PAL_TRACE_SALT`), so every worker that runs a step of the generation, in any
process, parents its span under the same root with no header passed and nothing lost in a crash.

- A span per claimed attempt, named by the GenAI semantic conventions where they apply
  (`chat {model}`, `execute_tool {tool}`), else `pal.step {node type}`; a step skipped because it
  already completed gets none.
- The root span of a generation is written once, when the generation ends: by the worker that
  finishes or parks the run, or by the sweep that takes over a lost generation (ended at the steal,
  status error). It links to the previous generation's root; it records how many steps it resumed.

Off unless an OTLP endpoint is configured with the standard variables (`OTEL_EXPORTER_OTLP_ENDPOINT`
or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`; `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`
turn it off); then the official SDK batches spans to the OTLP/HTTP exporter. Off, the step path pays
one attribute test.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from pal.core.records import RunRecord, Usage
from pal.core.vocabulary import EventKind
from pal.storage.journal import Journal

if TYPE_CHECKING:  # the SDK is an optional part (pal[otel]), loaded only when tracing is on
    from opentelemetry.sdk.trace import SpanProcessor

SAMPLED = TraceFlags(TraceFlags.SAMPLED)
# W3C Trace Context, version 00: what a caller's `traceparent` must be to be kept (else ignored).
TRACEPARENT = re.compile(r"00-(?!0{32})([0-9a-f]{32})-(?!0{16})([0-9a-f]{16})-([0-9a-f]{2})")


def parse_traceparent(text: object) -> str | None:
    """A caller's W3C `traceparent`, normalised; None for anything else (ignored, as the W3C
    recommendation says: a bad header never fails a run)."""
    if not isinstance(text, str) or len(text) > 64:
        return None
    value = text.strip().lower()
    return value if TRACEPARENT.fullmatch(value) else None


def current_traceparent() -> str | None:
    """The span this thread is in (a subagent's step, when tracing), as a `traceparent`."""
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def span_event(name: str, attributes: Mapping[str, str | int | float | bool]) -> None:
    """An event on the step span this thread is in; nothing when tracing is off."""
    span = trace.get_current_span()
    if span.is_recording():
        span.add_event(name, dict(attributes))


def configured(env: Mapping[str, str] | None = None) -> bool:
    """Whether the standard OpenTelemetry variables ask for traces."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() in ("none", ""):
        return False
    return bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
                or env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip())


def generation_ids(run_id: str, generation: int, salt: str = "") -> tuple[int, int]:
    """(trace id, root span id) of one generation of a run: the same in every process."""
    digest = hashlib.sha256(f"pal-trace/v1\0{salt}\0{run_id}\0{generation}".encode()).digest()
    return int.from_bytes(digest[:16], "big") or 1, int.from_bytes(digest[16:24], "big") or 1


def _forced_ids() -> Any:
    """The SDK's random ids, except the next trace and span id when a root span is written with
    its derived ids (per thread: concurrent writers never take each other's). Made when tracing
    starts: the SDK is an optional part (pal[otel])."""
    from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator

    class ForcedIds(IdGenerator):
        def __init__(self) -> None:
            self._random = RandomIdGenerator()
            self._next = threading.local()

        def force(self, trace_id: int, span_id: int) -> None:
            self._next.trace_id, self._next.span_id = trace_id, span_id

        def generate_trace_id(self) -> int:
            forced: int | None = getattr(self._next, "trace_id", None)
            self._next.trace_id = None
            return forced or self._random.generate_trace_id()

        def generate_span_id(self) -> int:
            forced: int | None = getattr(self._next, "span_id", None)
            self._next.span_id = None
            return forced or self._random.generate_span_id()

    return ForcedIds()


class StepSpan:
    """The span of one claimed attempt, finished with what the attempt came to (events while it
    runs go through `span_event`, from wherever they are learnt)."""

    def __init__(self, span: trace.Span) -> None:
        self.span = span

    @contextmanager
    def current(self) -> Iterator[None]:
        """The span is the current one while the block runs (a model call's events reach it)."""
        with trace.use_span(self.span, end_on_exit=False, record_exception=False,
                            set_status_on_exception=True):
            yield

    def end(self) -> None:
        self.span.end()

    def finish(self, outcome: str, usage: Usage | None = None,
               error: Mapping[str, Any] | None = None) -> None:
        self.span.set_attribute("pal.step.outcome", outcome)
        if usage is not None:
            self.span.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens)
            self.span.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens)
            if usage.cost_usd is not None:
                self.span.set_attribute("pal.cost_usd", float(usage.cost_usd))
        if outcome == "retrying":
            self.span.add_event("pal.step.retry", {"pal.error.type": str((error or {}).get("type", ""))})
        if error is not None:
            self.span.set_status(Status(StatusCode.ERROR, str(error.get("message", ""))[:500]))
            self.span.add_event("exception", {"exception.type": str(error.get("type", "")),
                                              "exception.message": str(error.get("message", ""))[:2000]})


class Tracing:
    """The tracer of one process and the spans PAL writes with it."""

    def __init__(self, processor: SpanProcessor | None = None, salt: str = "") -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        self._ids = _forced_ids()
        resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or "pal"})
        self.provider = TracerProvider(resource=resource, id_generator=self._ids)
        if processor is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            processor = BatchSpanProcessor(OTLPSpanExporter())
        self.provider.add_span_processor(processor)
        self.tracer = self.provider.get_tracer("pal")
        self.salt = salt
        self._lock = threading.Lock()

    def root_context(self, run_id: str, generation: int) -> Context:
        trace_id, span_id = generation_ids(run_id, generation, self.salt)
        parent = SpanContext(trace_id, span_id, is_remote=True, trace_flags=SAMPLED)
        return trace.set_span_in_context(trace.NonRecordingSpan(parent))

    def start_step(self, run: RunRecord, step_id: str, attempt: int, generation: int, node_type: str,
                   data: Mapping[str, Any], sent_at: float | None = None) -> StepSpan:
        """A span for one claimed attempt, under its generation's root, started and not yet ended
        (an awaited step's ends on a finisher thread); `sent_at`, when its message was published
        (or due), gives its queue wait (clocks of different hosts may differ)."""
        name, kind, extra = _span_name(node_type, data)
        if sent_at is not None:
            extra["pal.step.queue_wait_s"] = round(max(0.0, time.time() - sent_at), 6)
        attributes = {"pal.run.id": run.id, "pal.step.id": step_id, "pal.step.attempt": attempt,
                      "pal.run.generation": generation, "pal.node.type": node_type,
                      "pal.graph.sha256": run.graph_hash or "", "pal.run.tier": run.kind, **extra}
        return StepSpan(self.tracer.start_span(name, context=self.root_context(run.id, generation), kind=kind,
                                               attributes=attributes, record_exception=False))

    def reported_step(self, run: RunRecord, step_id: str, attempt: int, generation: int, started: datetime,
                      ended: datetime, *, outcome: str, vm_id: str) -> None:
        """A span for a step of the isolated tier, reported by its VM's harness once it ended."""
        attributes: dict[str, str | int] = {
                      "pal.run.id": run.id, "pal.step.id": step_id, "pal.step.attempt": attempt,
                      "pal.run.generation": generation, "pal.node.type": "microvm", "pal.vm.id": vm_id,
                      "pal.graph.sha256": run.graph_hash or "", "pal.run.tier": run.kind,
                      "pal.step.outcome": outcome}
        span = self.tracer.start_span(f"pal.step {step_id}", context=self.root_context(run.id, generation),
                                      attributes=attributes, start_time=_ns(started))
        if outcome == EventKind.STEP_FAILED:
            span.set_status(Status(StatusCode.ERROR, "the workload's step failed"))
        span.end(end_time=max(_ns(ended), _ns(started)))

    def generation_ended(self, run: RunRecord, generation: int, started: datetime, ended: datetime, *,
                         outcome: str, resumed: int = 0, previous: int | None = None,
                         caller: str | None = None, lost: bool = False) -> None:
        """Write the root span of a generation, linked to the `previous` generation's root, or for
        the first, to the `caller`'s traceparent (who started the run: a client, a parent step)."""
        trace_id, span_id = generation_ids(run.id, generation, self.salt)
        links = []
        if previous is not None:
            before_trace, before_span = generation_ids(run.id, previous, self.salt)
            links.append(Link(SpanContext(before_trace, before_span, is_remote=True, trace_flags=SAMPLED),
                              {"pal.link": "previous generation"}))
        if caller is not None:
            _, trace_hex, span_hex, flags = caller.split("-")
            starter = SpanContext(int(trace_hex, 16), int(span_hex, 16), is_remote=True,
                                  trace_flags=TraceFlags(int(flags, 16)))
            links.append(Link(starter, {"pal.link": "started by"}))
        attributes: dict[str, str | int] = {
                      "pal.run.id": run.id, "pal.run.generation": generation, "pal.run.outcome": outcome,
                      "pal.run.resumed_steps": resumed, "pal.graph.sha256": run.graph_hash or "",
                      "pal.run.tier": run.kind}
        with self._lock:  # the forced ids are taken by the next span this thread starts: this one
            self._ids.force(trace_id, span_id)
            span = self.tracer.start_span(f"pal.run {run.id}", context=Context(), links=links,
                                          attributes=attributes, start_time=_ns(started))
        if lost:
            span.set_status(Status(StatusCode.ERROR, "the worker was lost; the sweep took the run over"))
        span.end(end_time=max(_ns(ended), _ns(started)))

    def shutdown(self) -> None:
        """Export what is batched (a worker's shutdown); spans of a SIGKILLed process are lost."""
        self.provider.shutdown()


def end_generation(tracing: Tracing, journal: Journal, run: RunRecord, generation: int, ended: datetime,
                   *, outcome: str, lost: bool = False) -> None:
    """Write a generation's root span: it began at the run's creation (generation 1) or at the
    first event journaled under it (the `run_recovered` of a re-drive, a wake's first step), and
    links to the last generation before it that journaled anything (a park's wake-up timer takes a
    generation of its own, so they are not always consecutive). One read of the run's journal,
    only when tracing."""
    if generation < 1:
        return
    started, resumed, previous, caller = run.created_at, 0, None, None
    if generation == 1:
        queued = journal.runs.events(run.id, limit=1)
        if queued and isinstance(queued[0].payload, dict):
            caller = parse_traceparent(queued[0].payload.get("traceparent"))
    else:
        events = journal.runs.events(run.id)
        began = [e for e in events if e.generation == generation]
        previous = max((e.generation for e in events if e.generation < generation), default=None)
        if began:
            started = began[0].created_at
            if began[0].kind == EventKind.RUN_RECOVERED and isinstance(began[0].payload, dict):
                resumed = len(began[0].payload.get("resumed_steps") or ())
    tracing.generation_ended(run, generation, started, ended, outcome=outcome, resumed=resumed,
                             previous=previous, caller=caller, lost=lost)


def _ns(moment: datetime) -> int:
    return int(moment.timestamp() * 1_000_000_000)


def _span_name(node_type: str, data: Mapping[str, Any]) -> tuple[str, SpanKind, dict[str, Any]]:
    """The GenAI semantic conventions' name, kind and attributes for model and tool steps."""
    if node_type in ("ai-step", "llm"):
        model = str(data.get("model") or "")
        return f"chat {model}".strip(), SpanKind.CLIENT, {
            "gen_ai.operation.name": "chat", "gen_ai.request.model": model,
            "gen_ai.provider.name": str(data.get("provider") or "")}
    if node_type == "tool":
        tool = str(data.get("tool") or "")
        return f"execute_tool {tool}".strip(), SpanKind.INTERNAL, {
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool}
    return f"pal.step {node_type}", SpanKind.INTERNAL, {}
