"""Connections past serve's cap (half its open-file limit) are answered 503 at once: a client
that opened more than the limit and sent nothing had accept() fail in a loop, /health unanswered,
until they timed out."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from urllib.parse import urlsplit

from serving import HELLO, NO_CALL, SERVE_FLAGS, live_server, request

FILES = 256  # the server's hard limit on open files: its cap is 128 connections


def test_connections_past_the_cap_are_refused_and_serving_goes_on(served_folder, tmp_path):
    flags = [*SERVE_FLAGS, "--max-client-connections", "0"]  # every connection is this client's
    with live_server(served_folder, flags, tmp_path / "serve.log", nofile=FILES) as url:
        address = urlsplit(url).hostname, urlsplit(url).port
        with contextlib.ExitStack() as held:
            for _ in range(FILES + 50):  # past the limit: each sends half a request, then waits
                idle = held.enter_context(socket.create_connection(address, timeout=30))
                idle.sendall(b"GET /health HTTP/1.1\r\n")
            status, body = request(url, "GET", "/health")
            assert status == 503 and "its most connections open (128)" in body["error"]["message"]
        while (answer := request(url, "GET", "/health"))[0] == 503:  # until their threads end
            time.sleep(0.1)
        assert answer == (200, {"status": "ok"})
        chat = {"messages": HELLO, "max_tokens": 2, "logit_bias": NO_CALL}
        status, body = request(url, "POST", "/v1/chat/completions", json.dumps(chat).encode())
        assert status == 200 and body["choices"][0]["finish_reason"] == "length"
