"""One client (an address) may hold at most --max-client-connections of serve's connections at
once: one that opened the cap's worth (idle, or each waiting on a queued request) left every other
client a 503 until its own closed."""

from __future__ import annotations

import contextlib
import json
import socket
import time

from serving import request
from test_server_abuse import NoEngine, address, running

from streamer.server.api import Sampling
from streamer.server.app import App


def _health_from(httpd, client: str) -> bytes:
    """The status line of GET /health on a connection from address `client` (a socket pair
    handed to the server as if accepted from it)."""
    ours, theirs = socket.socketpair()
    with ours:
        httpd.process_request(theirs, (client, 40000))
        ours.sendall(b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n")
        return ours.makefile("rb").readline().rstrip()


def test_a_client_past_its_connections_is_answered_429_and_others_are_served():
    app = App(NoEngine(), "m", Sampling(), 8, 1024)
    with running(app, most_connections=8) as httpd, contextlib.ExitStack() as held:
        httpd.most_per_client = 2
        url = f"http://127.0.0.1:{httpd.server_port}/v1"
        for _ in range(2):
            held.enter_context(socket.create_connection(address(url), timeout=5))
        status, body = request(url, "GET", "/health")
        assert (status, body["error"]["message"]) == (
            429,
            "this client (127.0.0.1) has its most connections open at once (2): close one, or "
            "wait for an answer before sending the next request",
        ), body
        assert _health_from(httpd, "203.0.113.7") == b"HTTP/1.1 200 OK"
        held.close()  # the client closes its connections: its slots are free once the server's
        for _ in range(100):  # threads have closed them
            if request(url, "GET", "/health")[0] == 200:
                break
            time.sleep(0.05)
        else:
            raise AssertionError(json.dumps(request(url, "GET", "/health")))


def test_a_negative_max_client_connections_is_refused_before_loading(capsys):
    from streamer.cli import main

    assert main(["serve", "--model", "/nonexistent", "--max-client-connections", "-1"]) == 2
    assert capsys.readouterr().err == (
        "streamer: error: --max-client-connections must be at least 0 (got -1).\n"
    )
