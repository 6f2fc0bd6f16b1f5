"""A stand-in for Firecracker's API (`firecracker --api-sock PATH`): serves HTTP on that Unix socket,
records every call as a JSON line in $FC_RECORD and answers 204 (400 for the path in $FC_FAIL_PATH);
writes its pid to $FC_PIDFILE."""

from __future__ import annotations

import json
import os
import socketserver
import sys
from http.server import BaseHTTPRequestHandler
from typing import Any


class Api(BaseHTTPRequestHandler):
    def do_PUT(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"null")
        with open(os.environ["FC_RECORD"], "a") as record:
            record.write(json.dumps({"method": "PUT", "path": self.path, "body": body}) + "\n")
        self.send_response(400 if os.environ.get("FC_FAIL_PATH") == self.path else 204)
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


class UnixHttpServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def get_request(self) -> tuple[Any, Any]:
        request, _ = super().get_request()
        return request, ("firecracker-client", 0)  # the handler wants an address pair


if __name__ == "__main__":
    if os.environ.get("FC_PIDFILE"):
        with open(os.environ["FC_PIDFILE"], "w") as pidfile:
            pidfile.write(str(os.getpid()))
    UnixHttpServer(sys.argv[sys.argv.index("--api-sock") + 1], Api).serve_forever()
