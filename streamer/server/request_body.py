"""A request's body as HTTP/1.1 frames it: `Content-Length` bytes, or chunks (`Transfer-Encoding:
chunked`, which clients send for a body whose length they do not know ahead: Node's fetch of a
stream, Go's client of a reader).

A request framed both ways, or with Content-Length headers that disagree, is refused: a proxy in
front may have read it the other way, and on a kept-alive connection what one reads as the end of
a body the other reads as the next request.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from email.message import Message
from typing import BinaryIO

from ..io.sizes import size_text
from .connection import GONE
from .fields import MAX_BODY_BYTES, ApiError

_CHUNK_SIZE = re.compile(rb"([0-9A-Fa-f]{1,8})[ \t]*(;[^\r\n]*)?\r?\n")  # then extensions
_LINE = 1024  # the longest chunk-size or trailer line read
# a body is read, and its bytes counted as held, 64 KiB at a time: connections that each sent a
# byte of a piece hold a piece each, the connection cap's (hundreds) far below the bound's 256 MB
_PIECE = 64 << 10


def read_body(headers: Message, rfile: BinaryIO, take: Callable[[int], None]) -> bytes:
    """The body; `take(size)` is called before each `size` bytes of it are read (it may refuse:
    connection.py bounds the bytes held)."""
    length = framing(headers)
    if length is None:
        return _chunks(rfile, take)
    body = _read(rfile, length, take)
    if len(body) < length:  # the client closed (a stalled body is a 408: deadlines.py)
        raise ApiError(400, f"the request body did not arrive in full ({length} bytes)")
    return body


def framing(headers: Message) -> int | None:
    """The body's length by its headers, or None for chunks; ApiError where the headers frame it
    wrongly or declare it over MAX_BODY_BYTES."""
    coding = headers.get("Transfer-Encoding")
    lengths = sorted(set(headers.get_all("Content-Length") or ()))
    if coding is not None and lengths:
        raise ApiError(400, "a body is framed by Transfer-Encoding or Content-Length, not both")
    if coding is not None:
        if coding.strip().lower() != "chunked":
            raise ApiError(501, f"Transfer-Encoding {coding!r} is not supported: send chunked")
        return None
    if len(lengths) > 1:
        raise ApiError(400, f"the Content-Length headers disagree ({', '.join(lengths)})")
    if not lengths:
        raise ApiError(411, "a Content-Length header is required")
    length = lengths[0]
    if not (length.isascii() and length.isdigit()):  # "²" is a digit to isdigit, not to int
        raise ApiError(400, f"Content-Length {length!r} is not a number of bytes")
    if int(length) > MAX_BODY_BYTES:
        raise ApiError(413, f"the request body is over {size_text(MAX_BODY_BYTES)}")
    return int(length)


def declares_body(headers: Message) -> bool:
    """Whether a request says a body follows its headers."""
    length = headers.get("Content-Length")
    return headers.get("Transfer-Encoding") is not None or (length or "0").strip() != "0"


def _chunks(rfile: BinaryIO, take: Callable[[int], None]) -> bytes:
    body = bytearray()
    while True:
        line = _readline(rfile)
        found = _CHUNK_SIZE.fullmatch(line)
        if not line:  # the client closed
            raise ApiError(400, "the chunked request body did not arrive in full")
        if found is None:
            raise ApiError(400, "the chunked request body is malformed (a chunk size is not hex)")
        size = int(found.group(1), 16)
        if size == 0:
            break
        if len(body) + size > MAX_BODY_BYTES:
            raise ApiError(413, f"the request body is over {size_text(MAX_BODY_BYTES)}")
        chunk = _read(rfile, size, take)
        if len(chunk) < size or _readline(rfile) not in (b"\r\n", b"\n"):
            raise ApiError(400, "the chunked request body did not arrive in full")
        body += chunk
    while (line := _readline(rfile)) not in (b"\r\n", b"\n"):  # trailer fields: ignored
        if not line.endswith(b"\n"):  # the client closed, or a line over _LINE bytes
            raise ApiError(400, "the chunked request body did not arrive in full")
    return bytes(body)


def _read(rfile: BinaryIO, size: int, take: Callable[[int], None]) -> bytes:
    """Up to `size` bytes; fewer if the client closed or reset the connection. Each _PIECE is
    taken before it is read, not the whole size at first: 8 clients declaring 32 MB and sending a
    trickle held every byte the server takes at once, and every other body was refused."""
    data = bytearray()
    while len(data) < size:
        piece = min(_PIECE, size - len(data))
        take(piece)
        try:
            read = rfile.read(piece)
        except GONE:
            read = b""
        data += read
        if len(read) < piece:
            break
    return bytes(data)


def _readline(rfile: BinaryIO) -> bytes:
    try:
        return rfile.readline(_LINE)
    except GONE:
        return b""
