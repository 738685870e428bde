"""The supervisor's liveness watch (apps.runtime.supervisor.Watch) against real HTTP answers: a child that
answers 503 is restarted at once; one that answered and then went silent, after `stall_after_s`; one that never
answered yet (still starting) is left alone."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from apps.runtime.processes import free_port
from apps.runtime.supervisor import Liveness, Watch

STATUS = {"code": 200}


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the handler's API
        body = b'{"status": "stalled"}' if STATUS["code"] == 503 else b'{"status": "ok"}'
        self.send_response(STATUS["code"])
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:
        pass


@contextlib.contextmanager
def health_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/healthz"
    finally:
        server.shutdown()
        server.server_close()


def test_a_stalled_answer_restarts_and_silence_restarts_only_after_the_bound() -> None:
    silent = f"http://127.0.0.1:{free_port()}/healthz"  # nothing listens: no answer
    with health_server() as url:
        watch = Watch(Liveness({"access": url, "content": silent}, interval_s=1.0, stall_after_s=30.0), started=0.0)
        assert not watch.due(0.5) and watch.due(1.0)
        STATUS["code"] = 200
        assert watch.to_restart(1.0) == {}  # healthy; the silent one never answered: still starting
        STATUS["code"] = 503
        assert list(watch.to_restart(2.0)) == ["access"]  # stalled, said so itself
        watch.restarted("access", 2.0)
    # Now the access lane's successor answered once, then the port goes silent.
    with health_server() as url:
        STATUS["code"] = 200
        watch = Watch(Liveness({"access": url}, interval_s=1.0, stall_after_s=30.0), started=0.0)
        assert watch.to_restart(10.0) == {}
    assert watch.to_restart(35.0) == {}  # silent for 25 s: within the bound
    assert watch.to_restart(41.0) == {"access": "no answer for 31 s"}
