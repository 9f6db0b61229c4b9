"""Where a slot pool's reads land, by backend: the slot itself, or CUDA's pinned staging.

On Metal the pool is unified memory and the CPU backend's is host memory: a miss is read straight
into its slot. On CUDA the pool is managed memory, which the CPU's stores migrate page by page:
there the copy engine writes the slot, from a pinned staging buffer a miss was read into, or
(`reads_files`) from the file's mapping itself (io/cuda_copy.py, measured in bench/findings.md).
A load's `cuda_misses` (loading/options.py; bench/worker.py --cuda-misses) picks one on CUDA:
"staged", "mapped", "registered" (page-locked for each copy), "pinned" (whole files page-locked
while the plan's `pinnable` bytes allow: half the host's memory available, loading/residency.py;
each copy's pages past that) or "gathered" (the default: pinned, and mapped for kernels too,
so that a decode call's misses are read by the GPU itself with no host sync: io/cuda_gather.py,
experts/slots.py); benchmarks compare them side by side. The GPU reads only page-locked host
memory, so the no-sync decode keeps every expert file it locked in RAM whatever the budget
(RssFile 15.9 GiB on the 48-layer model at any budget on an H200); "staged" holds only its
buffers (0.97-1.40 GiB) but syncs every layer call and decoded at 0.06-0.21x of mlx-lm there
against gathered's 0.32-0.63x (medium and uniform routing, bench/findings.md, issue 35).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

import numpy as np

from ..errors import StreamerError
from ..io.compute_backend import backend
from ..io.pinning import PinAllowance

_LOCKS = {"mapped": "none", "registered": "copy", "pinned": "file", "gathered": "file"}
CUDA_MISSES = ("staged", *_LOCKS)  # _LOCKS: MappedCopies' `lock` for each way
CUDA_MISSES_DEFAULT = "gathered"


class Landing(Protocol):
    """Where a miss is read: `into(rows)` gives the buffers to read one slot's tensors into and,
    on leaving without an error, has put their bytes in `rows` (the slot's host rows)."""

    buffers: int  # how many `into` blocks can be open at once
    reads_files: bool  # True: `copy(spans)` moves a slot's bytes from the files, not `into`

    def into(self, rows: Sequence[np.ndarray]) -> AbstractContextManager[Sequence[np.ndarray]]: ...

    def close(self) -> None: ...


def landing_for(
    tensors: Sequence, buffers: int, page_cache: bool, misses: str, pinnable: PinAllowance | None
) -> Landing | None:
    """Copy-engine copies when MLX computes on a CUDA GPU, from pinned staging (`buffers` reads at
    once) or, when the reads go through the page cache, from the files' mappings as `misses`
    says (one of CUDA_MISSES), whole files page-locked while `pinnable` allows (the load's, shared
    by its pools); else None (reads land in the slot). io/cuda_copy.py is imported only
    then. `tensors`: the pool's SlotTensors."""
    if backend() != "cuda":  # the only backend whose reads need a landing
        return None
    from ..io.cuda_copy import MappedCopies, StagedCopies
    from ..io.cuda_runtime import CudaRuntime

    if misses == "staged" or not page_cache:
        return StagedCopies([t.nbytes for t in tensors], buffers, CudaRuntime())
    return MappedCopies(CudaRuntime(), _LOCKS[misses], pinnable, gathers=misses == "gathered")


def unreadable(where: str, expert: int, error: OSError) -> StreamerError:
    return StreamerError(
        f"{where}: cannot read expert {expert} ({error}); check the disk, "
        "or run `streamer verify` on the model folder."
    )


def copy_mapped(
    landing, source, tensors: Sequence, reads: list[tuple[int, int]], rows_of: Callable
) -> list[list[np.ndarray]]:
    """CUDA from the page cache (`landing.reads_files`): the copy engine moves each (expert, slot)
    of `reads` from the files of `source` (a LayerSource) to the slot's host rows (`rows_of`),
    all queued before one wait; each expert's mapped source bytes returned."""
    moves = []
    for expert, slot in reads:
        spans = [
            (source.files[at.file], at.offset + expert * at.stride, t.nbytes)
            for at, t in zip(source.placements, tensors)
        ]
        try:
            sources = landing.sources(spans)
        except OSError as e:
            raise unreadable(source.where(source.placements[0].file), expert, e) from e
        moves.append((sources, rows_of(slot)))
    landing.copy(moves)
    return [sources.views for sources, _ in moves]
