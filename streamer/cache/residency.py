"""Page-cache residency of mapped expert records, via mincore(2) (Linux and macOS)."""

from __future__ import annotations

import ctypes
import os

import numpy as np

from ..io.mapping import PAGE, libc
from ..stats import ExpertTraffic

try:
    _mincore = libc.mincore
    # Linux: unsigned char *vec; macOS: char *vec. Both set bit 0 for a resident page.
    _mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    _mincore.restype = ctypes.c_int
except AttributeError:  # a libc without mincore
    _mincore = None


class Residency:
    """Asks the OS which pages of the records of one mapped file (at `address`) are in the page cache."""

    def __init__(self, address: int, record_bytes: int):
        self._base = address
        self._length = record_bytes
        self._vec = np.zeros(-(-record_bytes // PAGE), dtype=np.uint8)
        self._vec_address = self._vec.ctypes.data
        self._bits = np.zeros_like(self._vec)

    def resident_bytes(self, offset: int) -> int | None:
        """Bytes of the record at `offset` in the page cache; None where the OS cannot tell."""
        if _mincore is None:
            return None
        if _mincore(self._base + offset, self._length, self._vec_address) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"mincore failed: {os.strerror(err)}")
        np.bitwise_and(self._vec, 1, out=self._bits)  # bit 0: resident (macOS sets other bits too)
        return min(int(np.count_nonzero(self._bits)) * PAGE, self._length)

    def is_resident(self, offset: int, traffic: ExpertTraffic) -> bool:
        """Whether the whole record is cached; counts the answer in `traffic`."""
        resident = self.resident_bytes(offset)
        if resident is None:
            return True  # unknown: no hint is given
        traffic.bytes_in_page_cache += resident
        traffic.bytes_measured += self._length
        return resident == self._length
