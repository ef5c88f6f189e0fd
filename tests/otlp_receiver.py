"""A real OTLP/HTTP trace receiver for the tests: `POST /v1/traces` with a protobuf
`ExportTraceServiceRequest`, decoded with the `opentelemetry-proto` package (like the provider wire fakes,
it speaks the wire format, not our code). Spans are kept as plain `ReceivedSpan`s; tests wait on them."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


@dataclass
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    start_ns: int
    end_ns: int
    kind: int
    status_code: int
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    resource: dict[str, Any] = field(default_factory=dict)


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, which) if which else None


def _attributes(kvs: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in kvs}


class Receiver:
    """The spans received so far, and a condition to wait on for more."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self.changed = threading.Condition()
        self.url = ""

    def add(self, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        received = []
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(
                        ReceivedSpan(
                            name=span.name,
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            start_ns=span.start_time_unix_nano,
                            end_ns=span.end_time_unix_nano,
                            kind=span.kind,
                            status_code=span.status.code,
                            attributes=_attributes(span.attributes),
                            events=[(e.name, _attributes(e.attributes)) for e in span.events],
                            resource=resource,
                        )
                    )
        with self.changed:
            self.spans += received
            self.requests += 1
            self.changed.notify_all()

    def wait_for(self, condition: Callable[[list[ReceivedSpan]], bool], timeout: float = 60.0) -> list[ReceivedSpan]:
        """The spans once `condition` holds for them (an AssertionError naming what arrived, after `timeout`)."""
        with self.changed:
            if not self.changed.wait_for(lambda: condition(list(self.spans)), timeout=timeout):
                names = sorted(s.name for s in self.spans)
                raise AssertionError(f"timed out after {timeout}s waiting for spans; received: {names}")
            return list(self.spans)

    def of_turn(self, turn_id: str) -> list[ReceivedSpan]:
        with self.changed:
            trace_ids = {s.trace_id for s in self.spans if s.attributes.get("stepq.turn.id") == turn_id}
            return [s for s in self.spans if s.trace_id in trace_ids]


@contextmanager
def otlp_receiver() -> Iterator[Receiver]:
    """A receiver on a free local port, in a thread of this process."""
    receiver = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
                self.send_response(404)
                self.end_headers()
                return
            receiver.add(body)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()


def otel_env(receiver: Receiver, service: str = "stepq-test-worker") -> dict[str, str]:
    """The standard variables that point a process's exporter at the receiver (spans flushed within 50 ms)."""
    return {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.url,
        "OTEL_SERVICE_NAME": service,
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=test",
        "OTEL_BSP_SCHEDULE_DELAY": "50",
    }
