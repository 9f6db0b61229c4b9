"""A file's bytes as an MLX array without a copy: the array's memory is the file's page-cache pages.

Metal adopts page-aligned host memory (`mx.asarray(..., copy=False)` wraps it in a no-copy
buffer), so there the mapping itself becomes the array. MLX's CPU allocator cannot adopt foreign
memory, so on the CPU backend an MLX buffer is allocated, untouched (buffers.py: its pages never
written, so mapping costs what the mapping costs, not a zero-fill of the file's size), and the
file is mapped over its pages (`MAP_FIXED`): the array then reads the page cache directly. The
mapping is private and writable (copy on write): whoever holds the buffer last, a model or an
array computed lazily from it after the model was closed, reads the file's bytes, and once MLX
frees or recycles the buffer a write lands on a private copy of its page, never on the file.

Either way the array is uint8 [pages, OS page] (no dimension past 2^31, whatever the file's size)
and a tensor in it is `view`ed at its byte offset (buffers.view).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import mmap
import os
import sys

import mlx.core as mx
import numpy as np

from . import buffers

OS_PAGE = mmap.PAGESIZE  # 4 KiB on Linux x86, 16 KiB on Apple silicon
_MAP_FIXED = 0x10  # the same on Linux and macOS; Python's mmap module does not export it
_MAP_FAILED = ctypes.c_void_p(-1).value
# glibc gives allocations from 32 MiB (its largest mmap threshold) a mapping of their own, which
# free() unmaps, unless a free chunk of its heap fits them (a long-running process may have one),
# and MLX frees buffers that large at once (a 40 MB one here; a 16 MB one it kept in its cache
# until mx.clear_cache()); the pages past the file cost nothing, never touched. A buffer left in
# the heap keeps its file mapped (not its pages: close() gives them back) until the heap reuses it
OWN_MAPPING_BYTES = (32 << 20) + OS_PAGE
# Linux 5.14+: fault a range into the page tables in one call (reading what is not cached).
_MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22 if sys.platform == "linux" else None)


def align(n: int, to: int) -> int:
    """`n` rounded up to a multiple of `to`: pages here, records and tensors in the layout."""
    return -(-n // to) * to


libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)  # mmap, madvise, mincore
libc.mmap.argtypes = (
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
)
libc.mmap.restype = ctypes.c_void_p
libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
libc.madvise.restype = ctypes.c_int
try:
    _mincore = libc.mincore
    # Linux: unsigned char *vec; macOS: char *vec. Both set bit 0 for a resident page.
    _mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    _mincore.restype = ctypes.c_int
except AttributeError:  # a libc without mincore
    _mincore = None


class MappedFile:
    """A read-only map of `size` bytes of a file from `offset` (a multiple of the OS page):
    `array` (uint8 MLX [rows, ROW], the mapping from byte `start` of it), `host` (numpy, the
    mapping's bytes) and `address` share it. Offsets given to its methods are relative to the
    mapping's start."""

    def __init__(self, fd: int, size: int, offset: int = 0):
        self.size, self.offset = size, offset
        if mx.metal.is_available():
            self._map = mmap.mmap(fd, size, access=mmap.ACCESS_READ, offset=offset)
            self.host = np.frombuffer(self._map, dtype=np.uint8)
            # whole pages, as rows: the last page is mapped whole, past the file's end too
            rows = np.lib.stride_tricks.as_strided(
                self.host, (align(size, OS_PAGE) // buffers.ROW, buffers.ROW), (buffers.ROW, 1)
            )
            self.array, self.start = mx.asarray(rows, copy=False), 0
        else:
            self._map = None
            self.array, self.start = _map_over_mlx_buffer(fd, size, offset)
            self.host = buffers.host_bytes(self.array)[self.start : self.start + size]
            self.host.flags.writeable = False  # the model's bytes: no write may change them
        self.address = self.host.ctypes.data
        self.mlx_bytes = self.array.nbytes  # what MLX counts as its memory for this mapping

    def view(
        self, offset: int, dtype: mx.Dtype, shape: tuple[int, ...], strides: tuple[int, ...]
    ) -> mx.array:
        """`dtype` elements [shape] with `strides` (in elements) from byte `offset`, no copy."""
        return buffers.view(self.array, self.start + offset, dtype, shape, strides)

    def advise(self, advice: int, offset: int, length: int) -> None:
        advise(self.address, advice, offset, length)

    def populate(self, offset: int, length: int) -> bool:
        return populate(self.address, offset, length)

    def close(self) -> None:
        if self._map is None and self.array is not None:
            # the pages leave this process now, not when MLX frees the buffer (a lazy array may
            # hold it, and a small one lies in the heap, mapped until the heap reuses it); what
            # reads them after this faults them in from the file again
            self.advise(mmap.MADV_DONTNEED, 0, self.size)
        self.host = self.array = None
        if self._map is not None:
            try:
                self._map.close()
            except BufferError:  # an array still views the map: it is unmapped when that goes
                pass


def _map_over_mlx_buffer(fd: int, size: int, offset: int) -> tuple[mx.array, int]:
    """An untouched MLX buffer with the file mapped over it from its first page boundary: the
    buffer and where in it the mapping starts."""
    length = align(size, OS_PAGE)
    # a page to spare for alignment; and never below OWN_MAPPING_BYTES, so that the buffer's
    # end mostly unmaps the file: a smaller one MLX keeps in its cache or malloc in its heap
    buffer = buffers.untouched(max(length + OS_PAGE, OWN_MAPPING_BYTES))
    base = buffers.address(buffer)
    pad = -base % OS_PAGE
    protection, flags = mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | _MAP_FIXED
    got = libc.mmap(base + pad, length, protection, flags, fd, offset)
    if got in (None, _MAP_FAILED):
        err = ctypes.get_errno()
        raise OSError(err, f"mmap failed: {os.strerror(err)}")
    return buffer, pad


def advise(address: int, advice: int, offset: int, length: int) -> None:
    """madvise(2) on `length` bytes at `offset` of a mapping at `address` (rounded out to pages)."""
    start = offset - offset % OS_PAGE
    if libc.madvise(address + start, length + offset - start, advice) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"madvise failed: {os.strerror(err)}")


def populate(address: int, offset: int, length: int) -> bool:
    """Map a range into this process's page tables now, waiting for any read in flight, so the
    compute does not take a page fault per OS page (bench/findings.md has the measured gain).
    False where the OS has no such call (macOS)."""
    global _MADV_POPULATE_READ
    if _MADV_POPULATE_READ is None:
        return False
    try:
        advise(address, _MADV_POPULATE_READ, offset, length)
    except OSError as e:
        if e.errno != errno.EINVAL:  # EINVAL: a kernel before 5.14
            raise
        _MADV_POPULATE_READ = None
        return False
    return True


Span = tuple[int, int, int]  # whole pages: (address of the first, bytes, pages)


def page_span(address: int, length: int) -> Span:
    """The whole pages holding `length` bytes at `address`."""
    start = address - address % OS_PAGE
    size = align(address + length - start, OS_PAGE)
    return start, size, size // OS_PAGE


class Residency:
    """mincore(2): which pages of mapped ranges are in the page cache, many ranges per call.

    Each range is asked on its own (one call over the gaps between routed experts would make the
    kernel check pages no expert of the call uses, and it costs per page: bench/findings.md), from
    one loop over page spans made once, and the answer is counted in numpy only where some page
    is missing, so a layer call with many routed ranges (9 per expert in a download) costs
    little more than its OS calls. The page vector is kept between calls."""

    def __init__(self):
        self._vec = np.zeros(0, dtype=np.uint8)

    def resident_bytes(self, spans: list[Span], lengths: np.ndarray) -> np.ndarray | None:
        """Bytes of each range in the page cache (range i: `lengths[i]` > 0 bytes within the
        pages `spans[i]` of a mapping), counted in whole pages and at most the range's length;
        `lengths` itself when every page is resident; None where the OS cannot tell."""
        if _mincore is None:
            return None
        pages = sum(span[2] for span in spans)
        if len(self._vec) < pages:
            self._vec = np.zeros(pages, dtype=np.uint8)
        to = self._vec.ctypes.data
        for start, size, n in spans:
            if _mincore(start, size, to) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"mincore failed: {os.strerror(err)}")
            to += n
        bits = self._vec[:pages] & 1  # bit 0: resident (macOS sets other bits too)
        if bits.all():
            return lengths
        counted = np.zeros(pages + 1, dtype=np.int64)
        np.cumsum(bits, out=counted[1:])
        at = np.zeros(len(spans) + 1, dtype=np.int64)  # where each range's pages start in bits
        np.cumsum([span[2] for span in spans], out=at[1:])
        resident = counted[at[1:]] - counted[at[:-1]]
        whole = resident == at[1:] - at[:-1]
        return np.where(whole, lengths, np.minimum(resident * OS_PAGE, lengths))


def resident_bytes(address: int, offset: int, length: int) -> int | None:
    """mincore of one range (see Residency); for callers outside the decode loop."""
    counts = Residency().resident_bytes([page_span(address + offset, length)], np.array([length]))
    return None if counts is None else int(counts[0])
