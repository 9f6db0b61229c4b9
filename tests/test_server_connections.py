"""`streamer serve`'s connections as HTTP/1.1 clients use them: several requests on one, and a
body sent only once the server says to go on (`Expect: 100-continue`)."""

from __future__ import annotations

import json
import socket
from urllib.parse import urlsplit

from serving import HELLO, connection

ASK = json.dumps({"messages": HELLO, "max_tokens": 1}).encode()


def test_one_connection_serves_request_after_request(server):
    """A kept-alive connection, as OpenAI's client pools them: each request had a new one (the
    server answered in HTTP/1.0 and closed)."""
    http = connection(server[0])
    try:
        statuses, sockets = [], []  # each request's socket, kept: no id is reused
        for method, path, body in [
            ("POST", "/v1/chat/completions", ASK),
            ("GET", "/v1/models", None),
            ("POST", "/v1/completions", b'{"prompt": "x", "max_tokens": 1}'),
        ]:
            http.request(method, path, body=body, headers={"Content-Type": "application/json"})
            sockets.append(http.sock)
            response = http.getresponse()
            response.read()
            statuses.append(response.status)
        assert statuses == [200] * 3
        assert all(sock is sockets[0] for sock in sockets)
    finally:
        http.close()


def test_a_client_that_expects_100_continue_is_told_to_send(server):
    """curl asks before sending a body over 1 KiB; the server said nothing, so curl waited (1 s)
    and a client that waits for the answer waited until the socket timed out."""
    url = urlsplit(server[0])
    with socket.create_connection((url.hostname, url.port), timeout=30) as s:
        s.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
            b"Content-Length: %d\r\n\r\n" % len(ASK)
        )
        answer = s.makefile("rb")
        assert answer.readline() == b"HTTP/1.1 100 Continue\r\n"
        while answer.readline() != b"\r\n":  # the interim answer's headers
            pass
        s.sendall(ASK)
        assert answer.readline() == b"HTTP/1.1 200 OK\r\n"
