"""The slot pools a residency plan asks for (residency.py), opened over the layers' files; and
the all-resident case on the slot read path, each layer read once through a pool of its own.

The expert source that computes on them is experts/slots.py; the pool itself cache/slot_pool.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from ..cache.landing import CUDA_MISSES_DEFAULT
from ..cache.slot_memory import LayerSource, SlotTensor
from ..cache.slot_pool import CHUNK_BYTES, SlotPool
from ..io.expert_layout import LayerLayout
from ..io.pinning import PinAllowance
from ..io.reads import ReadFile
from .residency import PoolGroup


def resident_pools(
    layouts: list[LayerLayout],
    layers: list,
    checksums: list | None,
    done: Callable[[], object],
    cuda_misses: str = CUDA_MISSES_DEFAULT,
    pinnable: int = 0,
) -> None:
    """Every layer's experts read once into a pool of its own, then run resident; `done` is
    called after each layer (a progress bar)."""
    for layout, layer in zip(layouts, layers):
        group = PoolGroup((layout.index,), layout.num_experts, 1)
        own = open_pools(
            [layout], [group], checksums, None, cuda_misses=cuda_misses, pinnable=pinnable
        )
        layer.use_pool(own[layout.index])  # one array per tensor, as mlx-lm holds the layer
        layer.make_resident()
        done()


def open_pools(
    layouts: list[LayerLayout],
    groups: Sequence[PoolGroup],
    checksums: list | None,
    chunk_bytes: int | None = CHUNK_BYTES,
    bypass_page_cache: bool = False,
    cuda_misses: str = CUDA_MISSES_DEFAULT,
    pinnable: int = 0,
) -> dict[int, SlotPool]:
    """The pool of each layer (by index): one pool per group of layers of one shape class, of
    its slots in arrays of at most `chunk_bytes` (None: one per tensor); the layers' files opened
    for reads (never mapped), each once: the pools share them, and are closed together.
    `checksums[layer]`: [expert][tensor] crc32s, checked on every read; `cuda_misses`: where a
    miss's bytes come from on CUDA, `pinnable`: the bytes of files its pools may page-lock whole
    between them (the plan's: residency.py; 0 locks none whole; cache/landing.py)."""
    by_index = {layout.index: layout for layout in layouts}
    pools: dict[int, SlotPool] = {}
    allowance = PinAllowance(pinnable)  # one for all the pools: each its own would multiply it
    # each path opened once: a download's layer names a shard once per stacked tensor, and
    # Kimi K2's 60 layers would otherwise open 540 descriptors (macOS allows 256 by default)
    opened: dict[Path, ReadFile] = {}
    try:
        for group in groups:
            members = [by_index[index] for index in group.layers]
            tensors = [SlotTensor(t.name, t.dtype, t.shape) for t in members[0].tensors]
            sources = {}
            for layout in members:
                for path in layout.files:
                    if path not in opened:
                        opened[path] = ReadFile(path, bypass_page_cache)
                sources[layout.index] = LayerSource(
                    [opened[path] for path in layout.files],
                    [t.at for t in layout.tensors],
                    layout.num_experts,
                    checksums[layout.index] if checksums is not None else None,
                    layout.where,
                )
            pool = SlotPool(
                tensors,
                group.slots,
                sources,
                chunk_bytes,
                cuda_misses=cuda_misses,
                pinnable=allowance,
            )
            pools.update(dict.fromkeys(sources, pool))
    except BaseException:
        for file in opened.values():
            file.close()
        raise
    return pools
