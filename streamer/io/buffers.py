"""MLX memory of any size that nothing has touched, and typed views into it at any byte offset.

MLX has no uninitialised allocation: `mx.zeros` and `mx.empty` write every byte (0.8 s per GB on
this CPU, and every page committed). But `mx.load` of a file-like object allocates its array and
hands the whole buffer to the file's `readinto`: a file that reads nothing there gives a buffer
whose pages were never written, so they cost nothing until a slot read fills them or a file
mapping replaces them (MAP_FIXED). The buffer may also come from MLX's cache of freed buffers:
its bytes are then whatever they were, which neither use reads.

MLX shapes are 32-bit per dimension, and `as_strided` flattens its input: so a buffer is
[rows, ROW] bytes (any size below 8 TB), and a view of any extent is `as_strided` of one
element at the view's first byte (`view`), whose flattening is one element.
"""

from __future__ import annotations

import io
import json
import struct
from collections.abc import Sequence

import mlx.core as mx
import numpy as np

ROW = 4096  # bytes per row of a buffer: a page, so a mapping's bytes are whole rows


class _ReadsNothing(io.RawIOBase):
    """A safetensors file holding one uint8 tensor `shape`, whose data is never written out."""

    def __init__(self, shape: tuple[int, ...]):
        nbytes = int(np.prod(shape, dtype=np.int64))
        header = json.dumps({"x": {"dtype": "U8", "shape": shape, "data_offsets": [0, nbytes]}})
        self._head = struct.pack("<Q", len(header)) + header.encode()
        self._size = len(self._head) + nbytes
        self._at = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._at = offset + (0, self._at, self._size)[whence]
        return self._at

    def tell(self) -> int:
        return self._at

    def readinto(self, buffer) -> int:
        into = memoryview(buffer).cast("B")
        if self._at < len(self._head):  # the header, as written
            n = min(len(into), len(self._head) - self._at)
            into[:n] = self._head[self._at : self._at + n]
        else:  # the tensor's bytes: reported read, left as they are
            n = len(into)
        self._at += n
        return n


def untouched(nbytes: int) -> mx.array:
    """An evaluated uint8 MLX array [rows, ROW] of at least `nbytes` bytes, none of them written.

    On CUDA the array is built from numpy instead (its bytes written, zeros): that is the one way
    known there (shared/notes/cuda.md) to get managed memory, which the host's view writes and the
    GPU's kernels read alike; this machine has no GPU to check an `mx.load` buffer on."""
    rows = max(1, -(-nbytes // ROW))
    if mx.cuda.is_available():
        array = mx.array(np.zeros((rows, ROW), dtype=np.uint8))
    else:
        array = mx.load(_ReadsNothing((rows, ROW)), format="safetensors")["x"]
    mx.eval(array)
    return array


def address(buffer: mx.array) -> int:
    return host_bytes(buffer).ctypes.data


def host_bytes(buffer: mx.array) -> np.ndarray:
    """The buffer's bytes as one flat numpy array (numpy's sizes are 64-bit)."""
    return np.asarray(memoryview(buffer)).reshape(-1)


def view(
    buffer: mx.array,
    offset: int,
    dtype: mx.Dtype,
    shape: Sequence[int],
    strides: Sequence[int] | None = None,
) -> mx.array:
    """`dtype` elements [shape] from byte `offset` of a [rows, ROW] uint8 `buffer`, with `strides`
    in elements (None: row-major). No copy: the view reads the buffer's memory, which need not
    be aligned to the element size (the CPU reads it as it is)."""
    if strides is None:
        strides = [int(np.prod(shape[i + 1 :], dtype=np.int64)) for i in range(len(shape))]
    row, column = divmod(offset, buffer.shape[-1])
    rows = buffer[row : row + 2]  # an element may span two rows
    first = rows.reshape(-1)[column : column + dtype.size].view(dtype)
    return mx.as_strided(first, tuple(shape), tuple(strides))
