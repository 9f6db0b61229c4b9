"""How long a client may take to send its request, and how large its head may be.

Each connection holds one of the capped slots (connection.py) until its client is done. A socket's
timeout restarts at every byte, so a client that sent its headers or body a byte a minute, or
opened a connection and sent nothing, held its slot as long as it liked: a few hundred such
connections filled the cap and real clients were answered 503. So each part of a request has a
deadline, and a client past it is answered 408 and its connection closed (its slot freed):

- the request line and headers, from the connection's start or the previous answer (an idle
  kept-alive connection ends there too, unanswered: no request of its client is pending);
- the body: none of its reads waits longer than the same span, and after that span it must have
  come at MIN_BODY_BYTES_PER_SECOND on average (a trickle of bytes otherwise holds a slot for
  days under a 32 MB Content-Length).

A client sends its head in one write and its body as fast as its link allows, so well-behaved
clients, local or remote, never come near these bounds.
"""

from __future__ import annotations

import io
import socket
import time

from .fields import ApiError

# Node's server allows 60 s for headers, Apache's 20 to 40: 30 s is far past any client that is
# sending, and an idle kept-alive connection is closed after it (Apache's: 5 s, nginx's: 75 s)
HEAD_SECONDS = 30
BODY_SECONDS = 30  # the longest wait for any read of a body, and its start's allowance
# a 128 kbit/s link's pace: a 32 MB body may take half an hour at it, but a byte a second does not
MIN_BODY_BYTES_PER_SECOND = 16 << 10
# the head, read in at most 8 KiB more than it holds: http.server takes 100 lines of 64 KiB each,
# 6.5 MB a connection held in memory; browsers and clients send a few KiB
MAX_HEAD_BYTES = 128 << 10


class Deadlines(io.RawIOBase):
    """A connection's socket as a raw stream whose reads fail (ApiError 408) past the deadline of
    the part of a request being read, or (431) past MAX_HEAD_BYTES of a head. `timeout`: the
    socket's own, which applies to writes, restored after each read."""

    def __init__(self, sock: socket.socket, timeout: float | None):
        super().__init__()
        self.sock, self.timeout = sock, timeout
        self.expect_head(HEAD_SECONDS)

    def readable(self) -> bool:
        return True

    def expect_head(self, seconds: float) -> None:
        """The next request's line and headers are awaited, for `seconds` at most."""
        self.received, self.wait = 0, seconds
        self.deadline, self.rate = time.monotonic() + seconds, None

    def expect_body(self, seconds: float) -> None:
        """The request's body is awaited: no read longer than `seconds`, then at the least rate."""
        self.received, self.wait = 0, seconds
        self.deadline, self.rate = time.monotonic() + seconds, MIN_BODY_BYTES_PER_SECOND

    def readinto(self, buffer) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise self._late()
        self.sock.settimeout(min(left, self.wait))
        try:
            size = self.sock.recv_into(buffer)
        except TimeoutError:
            raise self._late() from None
        finally:
            self.sock.settimeout(self.timeout)
        self.received += size
        if self.rate is not None:
            self.deadline += size / self.rate
        elif self.received > MAX_HEAD_BYTES:
            raise ApiError(431, f"the request's headers are over {MAX_HEAD_BYTES >> 10} KiB")
        return size

    def _late(self) -> ApiError:
        if self.rate is None:
            late = f"the request line and headers did not arrive within {self.wait:g} s"
        else:
            late = (
                f"the request body stalled for {self.wait:g} s or came slower than "
                f"{MIN_BODY_BYTES_PER_SECOND >> 10} KiB/s"
            )
        return ApiError(408, f"{late}: the connection is closed")
