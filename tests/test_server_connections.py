"""`streamer serve`'s connections as HTTP/1.1 clients use them: several requests on one, and a
body sent only once the server says to go on (`Expect: 100-continue`)."""

from __future__ import annotations

import json
import socket
from urllib.parse import urlsplit

import pytest
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


def _raw(url: str, head: bytes, body: bytes = b"", hang_up: bool = False) -> tuple[bytes, dict]:
    """The status line and JSON body of one request sent as these bytes; `hang_up`: then the
    sending side is closed (a body cut short ends there; a request being answered would be
    cancelled, as its client is gone)."""
    parts = urlsplit(url)
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + head
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as s:
        s.sendall(head + b"\r\n" + body)
        if hang_up:
            s.shutdown(socket.SHUT_WR)
        answer = s.makefile("rb").read()
    status, _, rest = answer.partition(b"\r\n")
    return status, json.loads(rest.partition(b"\r\n\r\n")[2])


def test_a_chunked_body_is_read(server):
    """A body of unknown length sent in chunks (a 411 before), with a chunk extension and a
    trailer field, which change nothing."""
    half = len(ASK) // 2
    chunks = b"%x;ext=1\r\n%s\r\n%x\r\n%s\r\n0\r\nX-Trailer: y\r\n\r\n" % (
        half,
        ASK[:half],
        len(ASK) - half,
        ASK[half:],
    )
    status, body = _raw(server[0], b"Transfer-Encoding: chunked\r\n", chunks)
    assert status == b"HTTP/1.1 200 OK" and body["usage"]["completion_tokens"] == 1, body


@pytest.mark.parametrize(
    "head, body, words",
    [
        # framed both ways, or two lengths: a proxy in front may read another body than this
        (b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n", b"0\r\n\r\n", "not both"),
        (b"Content-Length: %d\r\nContent-Length: 2\r\n" % len(ASK), ASK, "disagree"),
        (b"Transfer-Encoding: gzip\r\n", b"", "not supported"),
        (b"Transfer-Encoding: chunked\r\n", b"ffffffff\r\n", "over 32.00 MiB"),
        *(
            (b"Transfer-Encoding: chunked\r\n", chunks, "malformed")
            for chunks in (b"0x5\r\n{}\r\n0\r\n\r\n", b"1_0\r\n", b"zz\r\n", b"f" * 2000)
        ),
        *(
            (b"Transfer-Encoding: chunked\r\n", chunks, "did not arrive in full")
            for chunks in (
                b"10\r\n{}",
                b"2\r\n{}xx",
                b"2\r\n{}\r\n0\r\n",
                b"2\r\n{}\r\n",  # the client closes where the next chunk's size would be
                b"0\r\nX: " + b"y" * 2000,
            )
        ),
    ],
    ids=lambda value: value[:24] if isinstance(value, bytes) else None,
)
def test_bodies_framed_wrong_are_refused(server, head, body, words):
    status, answer = _raw(server[0], head, body, hang_up=True)
    assert status.split()[1] in (b"400", b"413", b"501"), status
    assert words in answer["error"]["message"], answer


def test_a_body_on_a_get_ends_its_connection(server):
    """A GET's body is not read: on a kept-alive connection it was read as the next request (the
    client got a 501 for 'helloGET' it never sent)."""
    url = urlsplit(server[0])
    with socket.create_connection((url.hostname, url.port), timeout=30) as s:
        s.sendall(
            b"GET /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
            b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        answer = s.makefile("rb").read()
    assert answer.startswith(b"HTTP/1.1 200") and answer.count(b"HTTP/1.1") == 1, answer
    assert b"\r\nConnection: close\r\n" in answer


def test_a_body_with_a_byte_order_mark_is_read(server):
    """UTF-8 with a byte order mark, as Windows tools write it (JSON parsers may skip it): it was
    a 400."""
    body = b"\xef\xbb\xbf" + ASK
    status, answer = _raw(server[0], b"Content-Length: %d\r\n" % len(body), body)
    assert status == b"HTTP/1.1 200 OK" and answer["usage"]["completion_tokens"] == 1, answer
