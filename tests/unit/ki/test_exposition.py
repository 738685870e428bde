"""Reading expositions (ki.exposition): the sums every reader of /metrics uses."""

from __future__ import annotations

import socket

from ki import exposition

TEXT = """\
# TYPE ki_search_requests counter
ki_search_requests_total{route="/v1/search",status="200"} 3.0
ki_search_requests_total{route="/v1/search",status="400"} 1.0
ki_search_requests_total{route="/v1/related",status="200"} 2.0
# TYPE ki_sync_freshness_seconds histogram
ki_sync_freshness_seconds_bucket{lane="access",le="1.0"} 4.0
ki_sync_freshness_seconds_bucket{lane="access",le="+Inf"} 5.0
ki_sync_freshness_seconds_bucket{lane="content",le="1.0"} 1.0
ki_sync_freshness_seconds_bucket{lane="content",le="+Inf"} 2.0
ki_sync_freshness_seconds_count{lane="access"} 5.0
ki_sync_freshness_seconds_sum{lane="access"} 2.5
"""


def test_totals_by_labels_and_per_label_value() -> None:
    samples = exposition.parse(TEXT)
    assert exposition.total(samples, "ki_search_requests_total") == 6.0
    assert exposition.total(samples, "ki_search_requests_total", exposition.having(status="200")) == 5.0
    assert exposition.by_label(samples, "ki_search_requests_total", "route") == {"/v1/search": 4.0, "/v1/related": 2.0}
    assert exposition.first(samples, "ki_sync_freshness_seconds_sum") == 2.5
    assert exposition.first(samples, "absent") is None


def test_histograms_sum_their_series_per_bound() -> None:
    samples = exposition.parse(TEXT)
    assert exposition.histogram(samples, "ki_sync_freshness_seconds") == {1.0: 5.0, float("inf"): 7.0}
    access = exposition.histogram(samples, "ki_sync_freshness_seconds", exposition.having(lane="access"))
    assert access == {1.0: 4.0, float("inf"): 5.0}


def test_a_closed_port_does_not_answer() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        assert not exposition.answers(f"http://127.0.0.1:{port}/metrics", timeout_s=1)


def test_a_worker_is_ready_once_it_declares_the_family_even_without_samples() -> None:
    import http.server
    import threading

    body = b"# HELP ki_sync_events_total CDC events consumed\n# TYPE ki_sync_events_total counter\n"

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        assert exposition.scrape(url) == []  # a labelled counter without children has no sample yet
        assert exposition.answers(url, "ki_sync_events_total")
        assert not exposition.answers(url, "ki_search_requests_total")
    finally:
        server.shutdown()
