"""The bytes of request bodies held at once, across connections (`HeldBytes`): bounded, and each
client's (an address's) share of them too.

Each body may be 32 MB (MAX_BODY_BYTES) and its parsed JSON takes a few times that, so the cap's
hundreds of connections sending one each could take tens of GB. One client could hold the whole
bound (8 bodies of 32 MB, sent fast then trickled), every other client's request refused while it
lasted: it holds a share of it at most (a quarter, serve's default; --max-client-connections 0
shares nothing out).
"""

from __future__ import annotations

import threading

from ..io.sizes import size_text
from .fields import ApiError

MAX_HELD_BODY_BYTES = 256 << 20  # 8 of the largest at once, or thousands of a chat's usual size


class HeldBytes:
    """The bytes of request bodies held at once: at most `most`, of which one client's at most
    `share` (None: no share)."""

    def __init__(self, most: int, share: int | None = None):
        self.most, self.share, self.held = most, share, 0
        self.by_client: dict[str, int] = {}
        self.lock = threading.Lock()

    def take(self, size: int, client: str) -> None:
        """`size` more bytes of a body from `client`; ApiError 429 past its share, 503 past the
        bound."""
        with self.lock:
            mine = self.by_client.get(client, 0)
            if self.share is not None and mine + size > self.share:
                raise ApiError(
                    429,
                    f"this client ({client}) holds its most bytes of request bodies at once "
                    f"({size_text(self.share)}) in requests not yet answered: wait for their "
                    "answers before sending more",
                )
            if self.held + size > self.most:
                raise ApiError(
                    503,
                    f"the server holds its most bytes of request bodies at once "
                    f"({size_text(self.most)}) in requests not yet answered: retry later",
                )
            self.held += size
            self.by_client[client] = mine + size

    def give_back(self, size: int, client: str) -> None:
        with self.lock:
            self.held -= size
            mine = self.by_client.pop(client, 0) - size
            if mine:
                self.by_client[client] = mine
