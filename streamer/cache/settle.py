"""Gathered calls' routing given to their slot pool later, and the kernel they are gathered by.

Gathered calls (CUDA, files locked whole and mapped: `gather_source`) read no slot on the host:
the GPU takes each routed expert from its slot or, a miss, from the file (io/cuda_gather.py),
and the call's routing is only recorded (`defer`). `settle`, every SETTLE_TOKENS tokens' worth of
calls and before any `place`, gives the policy those routings in order, as `place` would have
had them, and copies each expert that ends with a new slot into it: the slots hold what the
synced path's would, a few tokens late. `version` changes whenever a slot's expert does: a
gathered call trusts its slot table, so it makes a new one then.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import TYPE_CHECKING

import mlx.core as mx
import numpy as np

from .slot_memory import LayerSource, SlotTensor

if TYPE_CHECKING:
    from .slot_pool import SlotPool


def gather_source(pool: SlotPool, layer: int) -> tuple | None:
    """(kernel, sources) for gathered calls of `layer` (io/cuda_gather.py): when the landing
    lets kernels read files, every file of the layer is locked whole, the pool is one chunk
    and no read is checked (a checksum needs the bytes on the host); else None."""
    if layer not in pool._gathers:
        pool._gathers[layer] = None
        source = pool.layers[layer]
        if (
            getattr(pool._landing, "gathers", False)
            and source.checksums is None
            and len(pool.chunks) == 1
        ):
            bases = [pool._landing.device_address(file) for file in source.files]
            if None not in bases:
                pool._gathers[layer] = _gather_source(pool.tensors, source, bases)
    return pool._gathers[layer]


def settle(pool: SlotPool) -> None:
    """The deferred routings given to the policy, in order; each expert that ends with a new
    slot is copied into it once the kernels reading the pool have run. A failed copy
    forgets every slot not yet filled."""
    if not pool._deferred:
        return
    deferred, pool._deferred = pool._deferred, []
    pool.fence()
    # one pull for all of them (each np.array of a GPU array is a sync of its own)
    routed = np.array(mx.concatenate([indices.reshape(-1) for _, indices in deferred]))
    ends = np.cumsum([indices.size for _, indices in deferred])
    before = pool.policy.slot_key.copy()
    for (layer, _), experts in zip(deferred, np.split(routed, ends[:-1])):
        pool.policy.assign(pool.base[layer] + np.unique(experts))
    keys = pool.policy.slot_key
    moved = [(int(s), int(keys[s])) for s in np.flatnonzero((keys != before) & (keys >= 0))]
    if not moved:
        return
    pool.version += 1
    owners = sorted((base, index) for index, base in pool.base.items())
    reads: dict[int, list[tuple[int, int]]] = {}
    for slot, key in moved:
        base, index = owners[bisect.bisect_right(owners, (key, float("inf"))) - 1]
        reads.setdefault(index, []).append((key - base, slot))
    done = set()
    try:
        for index, layer_reads in reads.items():
            pool._read_misses(index, layer_reads)
            done.add(index)
    except BaseException:  # no slot is left claiming an expert it does not hold
        for index, layer_reads in reads.items():
            for expert, slot in layer_reads if index not in done else ():
                pool._forget(index, expert, slot)
        raise


def _gather_source(tensors: Sequence[SlotTensor], source: LayerSource, bases: list[int]) -> tuple:
    """The gather kernel for a layer whose file `f` kernels reach at `bases[f]`, and the device
    address of expert 0's bytes and the stride of each tensor (uint64 [tensors, 2])."""
    from ..io.cuda_gather import ExpertGather

    at = source.placements
    sources = np.array([[bases[a.file] + a.offset, a.stride] for a in at], dtype=np.uint64)
    alignment = int(np.gcd.reduce(sources.ravel().astype(np.int64)))
    return ExpertGather(tensors, alignment), mx.array(sources)
