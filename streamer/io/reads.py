"""Reading expert bytes into memory the caller owns, with as few and as large reads as possible.

Each read is one `preadv` whose buffers are the destinations themselves, so nothing passes through
an intermediate buffer: the tensors of one expert that lie back to back in a file (a repacked
record) become one read, the bytes between them (alignment padding) landing in a small scratch
buffer. Reads bypass the page cache where asked: `O_DIRECT` on Linux (buffers, lengths and file
offsets must then be multiples of DIRECT_ALIGN, else that read goes through the cache) and
`F_NOCACHE` on macOS (no alignment needed).

Read-ahead is off on every descriptor (`POSIX_FADV_RANDOM` on Linux, `F_RDAHEAD` 0 on macOS): a
read here is a whole expert record the caller chose, never the start of a sequential scan, and the
kernel's read-ahead around it (up to read_ahead_kb, 8 MiB on this VM's disk) read the next
records too: squeezed, the slot path read 4.6-5.3x the mapped path's bytes from disk, 1.18-1.34x
without it (bench/findings.md, "Squeezed: the slot path's bytes from disk").
"""

from __future__ import annotations

import fcntl
import os
import sys
from concurrent.futures import Future, wait
from pathlib import Path

import numpy as np

from .files import close_when_collected

DIRECT_ALIGN = 4096  # O_DIRECT's alignment for buffers, lengths and file offsets (a safe bound)
MAX_GAP = 1 << 16  # bytes between two tensors that one read still spans (into the scratch)
_O_DIRECT = getattr(os, "O_DIRECT", 0)
DESCRIPTORS = 2 if _O_DIRECT else 1  # a ReadFile's at most: Linux's second is opened O_DIRECT
_F_NOCACHE = getattr(fcntl, "F_NOCACHE", 48 if sys.platform == "darwin" else None)
_F_RDAHEAD = getattr(fcntl, "F_RDAHEAD", 45 if sys.platform == "darwin" else None)

Span = tuple[int, int, np.ndarray]  # (file index, file offset, writable contiguous uint8 buffer)
Read = tuple[int, int, list[np.ndarray]]  # (file index, file offset, the buffers it fills in turn)


class ReadFile:
    """A file opened for reads into caller buffers, through the page cache or around it."""

    def __init__(self, path: Path, bypass_page_cache: bool):
        self.path = Path(path)
        self.fd: int | None = os.open(path, os.O_RDONLY)
        self.direct_fd: int | None = None  # Linux: a second descriptor opened with O_DIRECT
        opened = [self.fd]
        self._close = close_when_collected(self, opened)
        try:
            no_read_ahead(self.fd)
            if bypass_page_cache and sys.platform == "darwin":
                fcntl.fcntl(self.fd, _F_NOCACHE, 1)
            elif bypass_page_cache and _O_DIRECT:
                try:
                    self.direct_fd = os.open(path, os.O_RDONLY | _O_DIRECT)
                    opened.append(self.direct_fd)
                except OSError:  # a file system without O_DIRECT (tmpfs): read through the cache
                    self.direct_fd = None
        except BaseException:
            self.close()
            raise

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def preadv(self, offset: int, buffers: list[np.ndarray]) -> None:
        direct = self.direct_fd is not None and _aligned(offset, buffers)
        want = sum(b.nbytes for b in buffers)
        got = os.preadv(self.direct_fd if direct else self.fd, buffers, offset)
        if got != want:
            raise OSError(f"short read: {got} of {want} bytes at offset {offset}")

    def close(self) -> None:
        self._close()
        self.fd = self.direct_fd = None


def no_read_ahead(fd: int) -> None:
    """Reads of `fd` fetch what they ask for, no more: its read-ahead turned off."""
    if sys.platform == "darwin":
        fcntl.fcntl(fd, _F_RDAHEAD, 0)
    elif hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)


def plan_reads(spans: list[Span], scratch: np.ndarray) -> list[Read]:
    """Group spans into reads: (file, offset, buffers), spans of one file at most
    min(MAX_GAP, len(scratch)) bytes apart sharing one read, the gap read into `scratch`."""
    reads: list[Read] = []
    end = None
    for file, offset, buffer in sorted(spans, key=lambda s: (s[0], s[1])):
        gap = None if end is None or reads[-1][0] != file else offset - end
        if gap is not None and 0 <= gap <= min(MAX_GAP, scratch.nbytes):
            if gap:
                reads[-1][2].append(scratch[:gap])
            reads[-1][2].append(buffer)
        else:
            reads.append((file, offset, [buffer]))
        end = offset + buffer.nbytes
    return reads


def split(read: Read, size: int) -> list[Read]:
    """`read` as consecutive reads of at most `size` bytes (a multiple of DIRECT_ALIGN keeps an
    aligned read's pieces aligned), its buffers cut where a piece ends."""
    file, offset, buffers = read
    pieces: list[Read] = []
    parts, length = [], 0
    for buffer in buffers:
        at = 0
        while at < buffer.nbytes:
            take = min(size - length, buffer.nbytes - at)
            parts.append(buffer[at : at + take])
            at, length = at + take, length + take
            if length == size:
                pieces.append((file, offset, parts))
                offset, parts, length = offset + size, [], 0
    if parts:
        pieces.append((file, offset, parts))
    return pieces


def _aligned(offset: int, buffers: list[np.ndarray]) -> bool:
    return offset % DIRECT_ALIGN == 0 and all(
        b.ctypes.data % DIRECT_ALIGN == 0 and b.nbytes % DIRECT_ALIGN == 0 for b in buffers
    )


def finish_all(reads: list[Future]) -> None:
    """Wait for every read, then raise the first failure: none may still write into a buffer
    once the caller lends it again, a slot another expert is read into. A Ctrl-C in the wait
    (the main thread's) waits for them too before it is raised."""
    try:
        finished = wait(reads).done
    except BaseException:
        wait(reads)
        raise
    for read in finished:
        read.result()
