"""What a slot pool is made of: its tensors, where its layers' experts lie, its arrays.

cache/slot_pool.py builds a pool from these; each array is MLX's (io/buffers.py), viewed from a
SLOT_ALIGN boundary, with a writable host view of its rows for the reads that land there.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from ..errors import StreamerError
from ..io import buffers
from ..io.compute_backend import backend
from ..io.reads import ReadFile

SLOT_ALIGN = 16384  # Apple silicon's page size; a multiple of Linux's 4 KiB and of DIRECT_ALIGN


@dataclass(frozen=True)
class SlotTensor:
    name: str  # mlx-lm's name inside the container, e.g. "gate_proj.weight"
    dtype: mx.Dtype
    shape: tuple[int, ...]  # one expert's shape

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.size


@dataclass
class LayerSource:
    """Where one MoE layer's experts lie: per tensor, expert e's bytes start at
    `offset + e * stride` of file number `file` (objects with those three attributes)."""

    files: Sequence[ReadFile]
    placements: Sequence  # one per pool tensor, in the pool's order
    num_experts: int
    checksums: Sequence | None = None  # [expert][tensor] crc32: checked on every read
    where: Callable[[int], str] = str  # file number -> where to say a read failed

    def check(self, tensors: Sequence[SlotTensor], expert: int, read: Sequence) -> None:
        """Refuse `expert`'s bytes as `read` (one buffer per tensor) unless they match their
        checksums (none kept: nothing to check)."""
        if self.checksums is None:
            return
        for t, at, buffer, crc in zip(tensors, self.placements, read, self.checksums[expert]):
            if zlib.crc32(buffer) != crc:
                raise StreamerError(
                    f"{self.where(at.file)}: expert {expert} tensor {t.name} does not "
                    "match its checksum: the file is corrupt. Run `streamer verify` on the "
                    "model folder to list every bad tensor, then repack."
                )


def chunk_slots(tensors: Sequence[SlotTensor], slots: int, chunk_bytes: int | None) -> int:
    """Slots per chunk: as many as keep every tensor's array within `chunk_bytes` (None: all)."""
    if chunk_bytes is None:
        return slots
    return max(1, min(slots, chunk_bytes // max(t.nbytes for t in tensors)))


def aligned_host(nbytes: int) -> np.ndarray:
    raw = np.zeros(nbytes + SLOT_ALIGN, dtype=np.uint8)
    pad = -raw.ctypes.data % SLOT_ALIGN
    return raw[pad : pad + nbytes]


def allocate(slots: int, t: SlotTensor) -> tuple[mx.array, np.ndarray]:
    """One tensor's slots: an MLX array [slots, *shape] and a writable host view of its rows.

    The buffer is MLX's, untouched (on CUDA: managed memory, which both the host's reads and the
    GPU's kernels reach; on Metal: unified memory), viewed from its first SLOT_ALIGN boundary.
    On a CUDA GPU its pages are then moved to the GPU (`on_gpu`)."""
    length = slots * t.nbytes
    buffer = buffers.untouched(length + SLOT_ALIGN)
    pad = -buffers.address(buffer) % SLOT_ALIGN
    array = buffers.view(buffer, pad, t.dtype, (slots, *t.shape))
    mx.eval(array)
    rows = buffers.host_bytes(buffer)
    if backend() == "cuda":
        on_gpu(rows)
    return array, rows[pad : pad + length].reshape(slots, t.nbytes)


def on_gpu(rows: np.ndarray) -> None:
    """A CUDA pool's managed pages moved to the GPU once, at allocation. Built from numpy, they
    start in host memory, where they count in the process's RSS: the whole pool, as file-backed
    pages of the driver's mapping (on an H200, 48 layers at a 7.6 GiB budget: RssFile 8.16 GiB
    staged, 1.40 moved; decode as fast or faster, bench/findings.md). Only the copy engine
    writes slots there (cache/landing.py), which leaves the pages on the GPU."""
    from ..io.cuda_runtime import CudaRuntime

    CudaRuntime().to_device(rows.ctypes.data, rows.nbytes)
