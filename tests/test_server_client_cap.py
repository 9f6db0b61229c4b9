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
from streamer.server.body_bytes import HeldBytes


def status_from(httpd, client: str, sent: bytes) -> bytes:
    """The status line of the answer to `sent` (a request) on a connection from address
    `client`: a socket pair handed to the server as if accepted from it."""
    ours, theirs = socket.socketpair()
    with ours:
        httpd.process_request(theirs, (client, 40000))
        ours.sendall(sent)
        return ours.makefile("rb").readline().rstrip()


def test_a_client_past_its_connections_is_answered_429_and_others_are_served():
    app = App(NoEngine(), "m", Sampling(), 8, 1024)
    with running(app, most_connections=8) as httpd, contextlib.ExitStack() as held:
        httpd.share_per_client(2)
        url = f"http://127.0.0.1:{httpd.server_port}/v1"
        for _ in range(2):
            held.enter_context(socket.create_connection(address(url), timeout=5))
        status, body = request(url, "GET", "/health")
        assert (status, body["error"]["message"]) == (
            429,
            "this client (127.0.0.1) has its most connections open at once (2): close one, or "
            "wait for an answer before sending the next request",
        ), body
        health = b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n"
        assert status_from(httpd, "203.0.113.7", health) == b"HTTP/1.1 200 OK"
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


def test_a_client_past_its_share_of_the_bodies_held_is_answered_429():
    """One client could hold the whole bound of body bytes held at once (256 MB: 8 bodies of 32
    MB, sent fast then trickled), every other client's request answered 503 meanwhile."""
    two = json.dumps({"prompt": "x" * 300, "n": 2}).encode()  # read whole, then refused: a 400
    app = App(NoEngine(), "m", Sampling(), 8, 1024)
    with running(app, held_bodies=HeldBytes(4000, 1000)) as httpd:
        url = f"http://127.0.0.1:{httpd.server_port}/v1"
        with socket.create_connection(address(url), timeout=5) as first:
            first.sendall(b"POST /v1/completions HTTP/1.1\r\nContent-Length: 800\r\n\r\n{")
            for _ in range(100):  # until the server has read its head
                if httpd.held_bodies.held:
                    break
                time.sleep(0.01)
            status, body = request(url, "POST", "/v1/completions", two)
            assert (status, body["error"]["message"]) == (
                429,
                "this client (127.0.0.1) holds its most bytes of request bodies at once (1000 B) "
                "in requests not yet answered: wait for their answers before sending more",
            ), body
            head = b"POST /v1/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(two)
            assert status_from(httpd, "203.0.113.7", head + two) == b"HTTP/1.1 400 Bad Request"
