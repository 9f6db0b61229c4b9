"""The client's side of a connection: whether it went away, and its request in serve's log.

A client may hang up at any moment: while its body arrives, while it waits, while its answer is
written. What that raises (`GONE`) ends the request quietly (`QuietHandler.handle`), wherever it
comes from; socketserver printed it as a traceback in the log (a GET whose client reset, a body
cut off by a reset). The request line and headers a client sends reach the log with control
characters escaped: `GET /\\x1b[2J` cleared the terminal serve logs to.
"""

from __future__ import annotations

import logging
import select
import socket
from http.server import BaseHTTPRequestHandler

log = logging.getLogger("streamer.server")
# C0 and C1 control characters (ESC starts a terminal's escape sequences), written as \xNN
_ESCAPED = {c: f"\\x{c:02x}" for c in (*range(0x20), *range(0x7F, 0xA0))}


class ClientGone(Exception):
    """The client closed its side of the connection while its answer was being made."""


# What reading from or writing to a client that went away (or stopped reading) raises.
GONE = (ClientGone, BrokenPipeError, ConnectionResetError, TimeoutError)


class QuietHandler(BaseHTTPRequestHandler):
    """http.server's handler, for clients that may leave at any point and send any bytes."""

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
