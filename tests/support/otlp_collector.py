"""A stand-in OpenTelemetry collector on 127.0.0.1: it accepts OTLP/HTTP protobuf trace exports
(`POST /v1/traces`), as a real collector does, and records every span it receives."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass(frozen=True)
class ReceivedSpan:
    trace_id: int
    span_id: int
    parent_span_id: int | None
    name: str
    attributes: dict[str, Any]
    links: list[tuple[int, int]]
    error: bool
    service: str


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


@dataclass
class OtlpCollector:
    spans: list[ReceivedSpan] = field(default_factory=list)
    requests: int = 0

    def __enter__(self) -> OtlpCollector:
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
                    self.send_response(404)
                    self.end_headers()
                    return
                request = ExportTraceServiceRequest.FromString(body)
                with collector.lock:
                    collector.requests += 1
                    for resource_spans in request.resource_spans:
                        service = next((_value(a.value) for a in resource_spans.resource.attributes
                                        if a.key == "service.name"), "")
                        for scope in resource_spans.scope_spans:
                            collector.spans.extend(_received(span, service) for span in scope.spans)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *_: Any) -> None:
                pass

        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *_: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.server.shutdown()
        self.server.server_close()

    def received(self) -> list[ReceivedSpan]:
        with self.lock:
            return list(self.spans)


def _received(span: Any, service: str) -> ReceivedSpan:
    return ReceivedSpan(
        trace_id=int.from_bytes(span.trace_id, "big"), span_id=int.from_bytes(span.span_id, "big"),
        parent_span_id=int.from_bytes(span.parent_span_id, "big") if span.parent_span_id else None,
        name=span.name, attributes={a.key: _value(a.value) for a in span.attributes},
        links=[(int.from_bytes(link.trace_id, "big"), int.from_bytes(link.span_id, "big")) for link in span.links],
        error=span.status.code == 2, service=service)
