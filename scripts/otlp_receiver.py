"""An OTLP/HTTP trace receiver on loopback, for the scripts that check traces
(scripts/trace_e2e.py, scripts/lambda-watch-roundtrip): `POST /v1/traces` with protobuf,
decoded with PyPI's opentelemetry-proto, every span kept with its service's name.

Alone: `python scripts/otlp_receiver.py --port PORT --out FILE` appends each span to FILE
as a JSON line until stopped.
"""

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


class Receiver:
    """Every span exported to it, as dicts, with its service's name."""

    def __init__(self, port=0, out=None):
        self.out = out
        self.spans = []
        self.requests = 0
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.path != "/v1/traces" or self.headers.get("content-type") != "application/x-protobuf":
                    self.send_response(404)
                    self.end_headers()
                    return
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                receiver.add(request)
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def add(self, request):
        found = []
        for resource_spans in request.resource_spans:
            service = next(
                (a.value.string_value for a in resource_spans.resource.attributes if a.key == "service.name"), "?"
            )
            for scope in resource_spans.scope_spans:
                for span in scope.spans:
                    attributes = {a.key: any_value(a.value) for a in span.attributes}
                    found.append(
                        {
                            "service": service,
                            "name": span.name,
                            "trace": span.trace_id.hex(),
                            "span": span.span_id.hex(),
                            "parent": span.parent_span_id.hex(),
                            "start": span.start_time_unix_nano,
                            "end": span.end_time_unix_nano,
                            "attributes": attributes,
                            "links": [(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                        }
                    )
        with self.lock:
            self.requests += 1
            self.spans.extend(found)
            if self.out:
                with open(self.out, "a") as out:
                    for span in found:
                        out.write(json.dumps(span) + "\n")

    def trace(self, trace_id):
        with self.lock:
            return [span for span in self.spans if span["trace"] == trace_id]

    def all(self):
        with self.lock:
            return list(self.spans)


def any_value(value):
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    receiver = Receiver(args.port, args.out)
    threading.Event().wait()
