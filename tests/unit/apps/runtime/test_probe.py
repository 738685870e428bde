"""apps/runtime/probe.py: the containers' health probe, against a throwaway HTTP server on loopback."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from apps.runtime.probe import check, main


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the standard library's name
        self.send_response(200 if self.path == "/readyz" else 503)
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[int]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield int(httpd.server_address[1])
    httpd.shutdown()
    httpd.server_close()


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_2xx_answer_and_an_open_port_pass(server: int) -> None:
    assert check(f"http://127.0.0.1:{server}/readyz", 3) is None
    assert check(f"tcp://127.0.0.1:{server}", 3) is None
    assert main([f"http://127.0.0.1:{server}/readyz", f"tcp://127.0.0.1:{server}"]) == 0


def test_an_error_status_a_closed_port_or_a_bad_target_fail(server: int, capsys: pytest.CaptureFixture[str]) -> None:
    closed = _closed_port()
    assert check(f"http://127.0.0.1:{server}/metrics", 3) == f"http://127.0.0.1:{server}/metrics: HTTP 503"
    assert check(f"tcp://127.0.0.1:{closed}", 3) is not None
    assert check(f"http://127.0.0.1:{closed}/readyz", 3) is not None
    assert check("https://127.0.0.1/readyz", 3) is not None and check("tcp://127.0.0.1", 3) is not None
    assert main([f"http://127.0.0.1:{server}/readyz", f"tcp://127.0.0.1:{closed}"]) == 1
    assert capsys.readouterr().err.count("probe: ") == 1
