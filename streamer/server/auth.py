"""`--api-key`: requests carry `Authorization: Bearer KEY`, as OpenAI's clients send their key.

A key is compared as bytes: the UTF-8 bytes of the configured key against the bytes the client
sent (http.server decodes a header as latin-1, byte for byte, so they are recovered whole). A key
no client can send (white space at its ends, which HTTP drops; a control character; bytes that are
not UTF-8, which no client types) is refused when the server starts.
"""

from __future__ import annotations

import hmac
import os

from ..errors import StreamerError
from .fields import ApiError

OPEN_ROUTES = ("/health",)  # a load balancer's probe carries no key


def usable_key(key: str, source: str) -> str:
    """`key` (from argv or the environment, undecodable bytes as surrogates), if a client can
    send it; else a StreamerError naming `source` and what is wrong."""
    raw = os.fsencode(key)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise StreamerError(
            f"{source} is not valid UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start}): "
            "a client sends its key as text; set a key of UTF-8 text."
        ) from None
    if not text.strip():
        raise StreamerError(f"{source} is empty: give a value, or leave the flag out.")
    if text != text.strip():
        raise StreamerError(
            f"{source} begins or ends with white space ({text!r}), which HTTP drops from a "
            "header, so no client can send it: remove it."
        )
    control = next((i for i, c in enumerate(text) if ord(c) < 32 or ord(c) == 127), None)
    if control is not None:
        raise StreamerError(
            f"{source} holds a control character ({text[control]!r} at character {control + 1}), "
            "which no HTTP header carries: remove it."
        )
    return text


def check_key(key: str | None, route: str, header: str | None) -> None:
    """ApiError 401 unless the server has no key, the route is open, or `header` carries it."""
    if key is None or route in OPEN_ROUTES:
        return
    scheme, _, given = (header or "").partition(" ")
    sent = given.strip().encode("latin-1", "replace")  # the bytes sent (http.server's decoding)
    # compare_digest: the time taken says nothing about how much of the key matched. Both
    # spellings a client may send are compared, always: UTF-8 (curl from a terminal) and
    # latin-1 (requests, for a key of latin-1 letters)
    matches = [hmac.compare_digest(sent, spelled) for spelled in spellings(key)]
    if scheme.lower() == "bearer" and any(matches):
        return
    raise ApiError(
        401,
        "a valid API key is required: send the header `Authorization: Bearer KEY` with the "
        "server's --api-key",
        code="invalid_api_key",
    )


def spellings(key: str) -> list[bytes]:
    """The bytes a client may send for `key`: its UTF-8, and its latin-1 where it has one."""
    utf8 = key.encode("utf-8", "surrogateescape")
    try:
        return [utf8, key.encode("latin-1")]
    except UnicodeEncodeError:  # a letter past latin-1: UTF-8 is the one way to send it
        return [utf8, utf8]


def non_ascii_note(key: str | None) -> str | None:
    """What to tell the person who set a key that is not ASCII, which some clients cannot send."""
    if key is None or key.isascii():
        return None
    return (
        "[serve] the API key is not ASCII: curl sends it (as UTF-8), as requests does (as latin-1) "
        "where it can; OpenAI's Python client sends only ASCII headers and refuses it"
    )
