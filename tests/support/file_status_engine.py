"""A stand-in engine that serves one file, byte for byte, as its ``/status`` document.

    python file_status_engine.py --socket PATH --document FILE

The live tests point a supervisor's ``status_url`` at it to make the exporter read exactly
cuzk's reference example (``tests/fixtures/cuzk-status.example.json``), or a malformed or
wrong-schema document, without involving cuzkd's own code on the engine side: what reaches
``/metrics`` is then the supervisor's reading of those bytes and nothing else. Stdlib only, so
it starts in a few tens of milliseconds; every request answers 200 with the file's bytes.
"""

from __future__ import annotations

import argparse
import os
import socketserver
from http.server import BaseHTTPRequestHandler
from pathlib import Path


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


def _handler(body: bytes) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def address_string(self) -> str:  # a Unix socket peer has no host to print
            return "unix"

        def log_message(self, format: str, *args: object) -> None:
            """Silent: the supervisor re-logs engine output, one line per poll is noise."""

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--socket", required=True, type=Path)
    parser.add_argument("--document", required=True, type=Path)
    args = parser.parse_args()
    body = args.document.read_bytes()
    if args.socket.exists():
        args.socket.unlink()
    server = _UnixHTTPServer(str(args.socket), _handler(body))
    print(f"doc engine pid {os.getpid()} serving {args.document}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
