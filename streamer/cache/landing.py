"""Where a slot pool's reads land, by backend: the slot itself, or CUDA's pinned staging.

On Metal the pool is unified memory and the CPU backend's is host memory: a miss is read straight
into its slot. On CUDA the pool is managed memory, which the CPU's stores migrate page by page:
there a miss is read into a pinned staging buffer and copied into its slot by the copy engine
(io/cuda_copy.py, measured in bench/README.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Protocol

import mlx.core as mx
import numpy as np


class Landing(Protocol):
    """Where a miss is read: `into(rows)` gives the buffers to read one slot's tensors into and,
    on leaving without an error, has put their bytes in `rows` (the slot's host rows)."""

    buffers: int  # how many `into` blocks can be open at once

    def into(self, rows: Sequence[np.ndarray]) -> AbstractContextManager[Sequence[np.ndarray]]: ...

    def close(self) -> None: ...


def landing_for(tensors: Sequence, buffers: int) -> Landing | None:
    """Pinned staging (`buffers` reads at once) and copy-engine copies when MLX computes on a CUDA
    GPU; else None (reads land in the slot). io/cuda_copy.py is imported only then. `tensors`:
    the pool's SlotTensors."""
    if not (mx.default_device() == mx.gpu and mx.cuda.is_available()):
        return None
    from ..io.cuda_copy import CudaRuntime, StagedCopies

    return StagedCopies([t.nbytes for t in tensors], buffers, CudaRuntime())
