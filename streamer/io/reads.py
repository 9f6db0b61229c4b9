"""Reading expert records into memory the caller owns: one scatter read each, page cache or not.

A record is read with one `preadv` whose buffers are the destinations themselves (one per tensor),
so nothing passes through an intermediate buffer. Bytes between tensors (alignment padding) land
in a small scratch buffer. Reads bypass the page cache where asked: `O_DIRECT` on Linux (buffers,
lengths and offsets must then be multiples of DIRECT_ALIGN, else that record is read through the
cache), `F_NOCACHE` on macOS (no alignment needed).
"""

from __future__ import annotations

import fcntl
import os
import sys

import numpy as np

DIRECT_ALIGN = 4096  # O_DIRECT's alignment for buffers, lengths and file offsets (a safe bound)
_O_DIRECT = getattr(os, "O_DIRECT", 0)
_F_NOCACHE = getattr(fcntl, "F_NOCACHE", 48 if sys.platform == "darwin" else None)


class RecordFile:
    """An expert file opened for scatter reads, through the page cache or around it."""

    def __init__(self, path: os.PathLike, bypass_page_cache: bool):
        self.fd = os.open(path, os.O_RDONLY)
        self.direct_fd: int | None = None  # Linux: a second descriptor opened with O_DIRECT
        try:
            if bypass_page_cache and sys.platform == "darwin":
                fcntl.fcntl(self.fd, _F_NOCACHE, 1)
            elif bypass_page_cache and _O_DIRECT:
                try:
                    self.direct_fd = os.open(path, os.O_RDONLY | _O_DIRECT)
                except OSError:  # a file system without O_DIRECT (tmpfs): read through the cache
                    self.direct_fd = None
        except BaseException:
            self.close()
            raise

    def read_into(
        self, offset: int, spans: list[tuple[int, np.ndarray]], scratch: np.ndarray
    ) -> None:
        """Read the file bytes at `offset` + each span's start into that span's buffer, in one
        preadv. `spans` are (start within the record, writable contiguous uint8 buffer), sorted and
        non-overlapping; gaps between them are read into `scratch` (at least as long as any gap)."""
        buffers, position = [], spans[0][0]
        for start, buffer in spans:
            if start > position:
                buffers.append(scratch[: start - position])
            buffers.append(buffer)
            position = start + buffer.nbytes
        want = position - spans[0][0]
        fd = (
            self.direct_fd
            if self.direct_fd is not None and _aligned(offset + spans[0][0], buffers)
            else self.fd
        )
        got = os.preadv(fd, buffers, offset + spans[0][0])
        if got != want:
            raise OSError(f"short read: {got} of {want} bytes at offset {offset}")

    def close(self) -> None:
        for fd in (self.fd, self.direct_fd):
            if fd is not None:
                os.close(fd)
        self.fd = self.direct_fd = None


def _aligned(offset: int, buffers: list[np.ndarray]) -> bool:
    return offset % DIRECT_ALIGN == 0 and all(
        b.ctypes.data % DIRECT_ALIGN == 0 and b.nbytes % DIRECT_ALIGN == 0 for b in buffers
    )
