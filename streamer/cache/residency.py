"""Page-cache residency of mapped memory, via mincore(2) (Linux and macOS)."""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os

PAGE = mmap.PAGESIZE  # the OS page: 4 KiB on Linux x86, 16 KiB on Apple silicon

try:
    _libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    _mincore = _libc.mincore
    # Linux: unsigned char *vec; macOS: char *vec. Both set bit 0 for a resident page.
    _mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    _mincore.restype = ctypes.c_int
except (OSError, AttributeError, TypeError):  # no libc mincore (e.g. Windows)
    _mincore = None

AVAILABLE = _mincore is not None


def resident_bytes(address: int, length: int) -> int | None:
    """Bytes of [address, address+length) in the page cache; None where the OS cannot tell.

    `address` must be page-aligned (expert records start on 16 KiB boundaries, so they are).
    """
    if _mincore is None or length <= 0:
        return None
    pages = -(-length // PAGE)
    vec = (ctypes.c_ubyte * pages)()
    if _mincore(address, length, vec) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mincore failed: {os.strerror(err)}")
    resident = sum(1 for v in bytes(vec) if v & 1)
    return min(resident * PAGE, length)
