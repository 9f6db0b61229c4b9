"""The client's side of a connection: whether it went away, its request in serve's log, how many
may be open at once.

A client may hang up at any moment: while its body arrives, while it waits, while its answer is
written. What that raises (`GONE`) ends the request quietly (`QuietHandler.handle`), wherever it
comes from; socketserver printed it as a traceback in the log (a GET whose client reset, a body
cut off by a reset). The request line and headers a client sends reach the log with control
characters escaped: `GET /\\x1b[2J` cleared the terminal serve logs to.

Connections are capped (`ConnectionCap`) at half the open-file limit: each holds a thread and a
descriptor until its client is done or its request's deadline passes (deadlines.py), so a client
that opened thousands and sent nothing had accept() fail at the limit, which the serving loop
retried at once (a core busy, /health unanswered); the model's files need descriptors too. One
client (an address) holds a quarter of them at most (serve's --max-client-connections): one that
opened the cap's worth left every other client refused.
"""

from __future__ import annotations

import io
import json
import logging
import resource
import select
import socket
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler

from .body_bytes import MAX_HELD_BODY_BYTES, HeldBytes
from .deadlines import BODY_SECONDS, HEAD_SECONDS, Deadlines
from .fields import ApiError

log = logging.getLogger("streamer.server")
# C0 and C1 control characters (ESC starts a terminal's escape sequences), written as \xNN
_ESCAPED = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))}


class ClientGone(Exception):
    """The client closed its side of the connection while its answer was being made."""


CLIENT_SHARE = 4  # one client (an address) holds a quarter of the connections and body bytes
LINGER_SECONDS = 2  # how long a connection being closed reads what its client still sends
# connections refused at the cap that linger at once, each on a thread of its own; past them (a
# flood) one is closed at once, its client perhaps reset
MOST_LINGERING_REFUSALS = 64


# What reading from or writing to a client that went away (or stopped reading) raises.
GONE = (ClientGone, BrokenPipeError, ConnectionResetError, TimeoutError)


class QuietHandler(BaseHTTPRequestHandler):
    """http.server's handler, for clients that may leave at any point, send any bytes, or send
    them slowly (deadlines.py)."""

    head_seconds, body_seconds = HEAD_SECONDS, BODY_SECONDS

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # the socket's own file: requests are read against deadlines instead
        self.deadlines = Deadlines(self.connection, self.timeout)
        self.rfile = io.BufferedReader(self.deadlines)

    def handle_one_request(self) -> None:
        self.deadlines.expect_head(self.head_seconds)
        self.command, self.request_version, self.requestline = "", "HTTP/1.1", ""
        self.body_bytes = 0
        try:
            super().handle_one_request()
        except ApiError as e:  # a head too slow or too large
            self.close_connection = True
            if self.deadlines.received:  # one that sent nothing of a request is closed unanswered
                self.send_error(e.status, e.message)
        finally:
            self.server.held_bodies.give_back(self.body_bytes, self.client_address[0])

    def finish(self) -> None:
        super().finish()
        if self.close_connection:
            linger(self.connection)

    def take_body_bytes(self, size: int) -> None:
        """`size` more bytes of the request's body, counted against the server's bound on those
        held at once (ApiError 503 past it) until the request is answered."""
        self.server.held_bodies.take(size, self.client_address[0])
        self.body_bytes += size

    def parse_request(self) -> bool:
        parsed = super().parse_request()  # the head is read (and 100 Continue sent if asked)
        if parsed:
            self.deadlines.expect_body(self.body_seconds)
        return parsed

    def handle(self) -> None:
        try:
            super().handle()
        except GONE:
            pass  # the client went away (mid-body, mid-answer or waiting): no one is left to tell

    def log_message(self, format: str, *args) -> None:
        log.info("%s %s", self.address_string(), (format % args).translate(_ESCAPED))


def client_gone(sock: socket.socket) -> bool:
    """Whether the peer closed its side: readable with nothing to read (it sends no more)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def linger(sock: socket.socket) -> None:
    """Shut the server's side, then read and drop what the client still sends until it closes its
    own (LINGER_SECONDS at most): a socket closed with bytes unread sends a reset, and a client
    still sending a body that was refused unread (401, 413, 503) lost the answer to it."""
    deadline = time.monotonic() + LINGER_SECONDS
    try:
        sock.shutdown(socket.SHUT_WR)
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            if not sock.recv(1 << 16):
                return
    except OSError:  # the client reset, or sent for LINGER_SECONDS: it is closed on it
        pass


class ConnectionCap:
    """A socketserver threading mixin: a connection past the cap, or past its client's share
    (`most_per_client`, None: no share), is answered 503 (429) by the accepting thread, which
    never waits on it, then lingers (`linger`) on a thread of its own (closed with its request
    unread, it sent a reset, and a client still sending a body read that, not the refusal)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.most_connections = resource.getrlimit(resource.RLIMIT_NOFILE)[0] // 2
        self.slots = threading.BoundedSemaphore(self.most_connections)
        self.per_client: dict[str, int] = {}  # each client's open connections, under `counting`
        self.counting = threading.Lock()
        self.held_bodies = HeldBytes(MAX_HELD_BODY_BYTES)
        self.most_per_client: int | None = None
        self.share_per_client(max(self.most_connections // CLIENT_SHARE, 1))
        self.lingering = threading.BoundedSemaphore(MOST_LINGERING_REFUSALS)

    def process_request(self, request: socket.socket, client_address) -> None:
        refusal = self._admit(client_address[0])
        if refusal is not None:
            self._refuse(request, refusal)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread started: its slot is not given back by one
            self._leave(client_address[0])
            raise

    def process_request_thread(self, request: socket.socket, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._leave(client_address[0])

    def share_per_client(self, connections: int) -> None:
        """A client's share: `connections` open at once and a quarter of the body bytes held (0:
        no share of either, as behind a reverse proxy, where every client has its address)."""
        self.most_per_client = connections or None
        self.held_bodies.share = self.held_bodies.most // CLIENT_SHARE if connections else None

    def _admit(self, client: str) -> ApiError | None:
        """Take a slot for a connection of `client`, or the refusal to answer it."""
        with self.counting:
            held, most = self.per_client.get(client, 0), self.most_per_client
            if most is not None and held >= most:
                return ApiError(
                    429,
                    f"this client ({client}) has its most connections open at once ({most}): "
                    "close one, or wait for an answer before sending the next request",
                )
            if not self.slots.acquire(blocking=False):
                return ApiError(
                    503,
                    f"the server has its most connections open ({self.most_connections}): "
                    "retry later",
                )
            self.per_client[client] = held + 1
        return None

    def _leave(self, client: str) -> None:
        with self.counting:
            held = self.per_client.pop(client) - 1
            if held:
                self.per_client[client] = held
        self.slots.release()

    def _refuse(self, request: socket.socket, refusal: ApiError) -> None:
        body = json.dumps(refusal.body()).encode()
        head = (
            f"HTTP/1.1 {refusal.status} {HTTPStatus(refusal.status).phrase}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n"
        )
        try:
            request.setblocking(False)  # a few hundred bytes fit a new socket's buffer
            request.send(head.encode() + body)
        except OSError:
            pass  # the client is gone already
        if not self.lingering.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            threading.Thread(target=self._linger, args=(request,), daemon=True).start()
        except RuntimeError:  # no thread to be had
            self.lingering.release()
            self.shutdown_request(request)

    def _linger(self, request: socket.socket) -> None:
        try:
            linger(request)
        finally:
            self.close_request(request)
            self.lingering.release()
