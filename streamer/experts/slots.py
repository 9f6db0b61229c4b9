"""Read path on a slot pool (cache/slot_pool.py): the only expert memory the kernels are given.

One host sync learns the routing; the routed experts are placed in the pool (hits cost nothing,
misses are read into their slots), and mlx-lm's own container then runs on the pool's arrays with
slot indices, so its kernels compute exactly what they compute on the resident stacked tensors.
Nothing the compute sees views a file: the expert files are opened for reads, never mapped.

A call that routes more experts than the pool has slots (a long prompt chunk on a small pool)
runs in rounds of at most `slots` experts; each round's output is kept for its own experts.
Where the compute dtype differs from the stored one (the CPU backend with bf16 scales) the routed
slots are taken and converted per call (counted in bytes_copied); on a GPU the default compute
dtype is the stored one and nothing is copied.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import mlx.core as mx
import numpy as np

from ..cache.budget import chosen_budget
from ..cache.slot_pool import LayerSource, SlotPool, SlotTensor
from ..io.expert_layout import LayerLayout
from ..io.manifest import Manifest
from ..io.reads import ReadFile
from ..stats import ExpertTraffic
from .routing import finish, host_routing


class Slots:
    def __init__(self, pool: SlotPool):
        self._pool = pool

    def __call__(self, layer, x: mx.array, indices: mx.array, traffic: ExpertTraffic) -> mx.array:
        start = time.perf_counter()
        routed, experts = host_routing(layer, indices, traffic)
        experts = np.array(experts, dtype=np.int64)
        pool = self._pool
        out = None
        for lo in range(0, len(experts), pool.slots):
            group = experts[lo : lo + pool.slots]
            placed = time.perf_counter()
            slots, misses = pool.place(layer.index, group)
            traffic.read_seconds += time.perf_counter() - placed
            traffic.experts_read += misses
            traffic.experts_fetched += misses
            traffic.bytes_read += misses * pool.slot_bytes
            traffic.cache_hits += len(group) - misses
            part = self._compute(layer, x, routed, group, slots, traffic)
            pool.computed(part)  # no slot it reads is rewritten before it is computed
            if out is None:
                out = part
            else:  # every routed entry belongs to exactly one round
                mask = mx.array(np.isin(routed, group))[..., None]
                out = mx.where(mask, part, out)
        return finish(layer, out, traffic, start)

    def _compute(
        self,
        layer,
        x: mx.array,
        routed: np.ndarray,
        group: np.ndarray,
        slots: np.ndarray,
        traffic: ExpertTraffic,
    ) -> mx.array:
        pool = self._pool
        if layer.converts:  # take the routed slots, converted, in `group` order
            taken = mx.array(slots.astype(np.uint32))
            tensors = [layer.convert(mx.take(a, taken, axis=0)) for a in pool.arrays]
            traffic.bytes_copied += sum(t.nbytes for t in tensors)
            position = np.minimum(np.searchsorted(group, routed), len(group) - 1)
        else:  # the pool itself: the kernels gather the routed slots
            tensors = pool.arrays
            table = np.zeros(layer.num_experts, dtype=np.int64)  # outside the group: any slot
            table[group] = slots
            position = table[routed]
        layer.install(tensors)
        return layer.container(x, mx.array(position.astype(np.uint32)))


def resident_pools(
    layouts: list[LayerLayout], layers: list, checksums: list | None, done: Callable[[], object]
) -> None:
    """Every layer's experts read once into a pool of its own, then run resident; `done` is
    called after each layer (a progress bar)."""
    for layout, layer in zip(layouts, layers):
        own = open_pools([layout], {shape_class(layout): layout.num_experts}, checksums, False)
        layer.use_pool(own[shape_class(layout)])
        layer.make_resident()
        done()


def slot_budget(
    manifest: Manifest,
    layouts: list[LayerLayout],
    layers: list,
    budget: int | None,
    dtype: mx.Dtype | None,
    checksums: list | None,
    bypass_page_cache: bool = False,
) -> tuple[str, list[SlotPool]]:
    """Give every layer its pool for `budget` bytes of slots (None: the default, cache/budget.py),
    less than every expert's bytes (more: resident_pools), and say so: one pool per shape class,
    its share of the budget in proportion to the class's experts, at least one slot; 0: one
    layer's experts each (the smallest pool in which any call, a whole prompt chunk too, runs in
    one round)."""
    budget, why = chosen_budget(manifest, budget, dtype)
    experts, slot_bytes, per_layer = {}, {}, {}
    for layout in layouts:
        key = shape_class(layout)
        experts[key] = experts.get(key, 0) + layout.num_experts
        per_layer[key] = max(per_layer.get(key, 0), layout.num_experts)
        slot_bytes[key] = sum(t.at.length for t in layout.tensors)
    total = sum(experts[key] * slot_bytes[key] for key in experts)
    slots = {
        key: min(experts[key], max(1, budget * experts[key] // total) if budget else per_layer[key])
        for key in experts
    }
    by_class = open_pools(layouts, slots, checksums, bypass_page_cache)
    for layout, layer in zip(layouts, layers):
        layer.use_pool(by_class[shape_class(layout)])
    pools = list(by_class.values())
    size = sum(pool.nbytes for pool in pools)
    sizes = ", ".join(str(pool.slots) for pool in pools)
    kind = "one layer's experts" if budget == 0 else "LFU with aging"
    if bypass_page_cache:
        kind += ", read around the page cache"
    return (
        f"experts stream from disk into a slot pool of {sizes} slots ({size / 1e9:.2f} GB, "
        f"{kind}; {why})",
        pools,
    )


def shape_class(layout: LayerLayout) -> tuple:
    return tuple((t.name, t.dtype, t.shape) for t in layout.tensors)


def open_pools(
    layouts: list[LayerLayout],
    slots: dict[tuple, int],
    checksums: list | None,
    bypass_page_cache: bool = False,
) -> dict[tuple, SlotPool]:
    """One pool per shape class of `layouts` with `slots[class]` slots; each layer's files opened
    for reads (never mapped). `checksums[layer]`: [expert][tensor] crc32s, checked on every read."""
    classes: dict[tuple, list[LayerLayout]] = {}
    for layout in layouts:
        classes.setdefault(shape_class(layout), []).append(layout)
    pools: dict[tuple, SlotPool] = {}
    sources: dict[int, LayerSource] = {}
    try:
        for key, members in classes.items():
            sources = {}
            for layout in members:
                files = []
                sources[layout.index] = LayerSource(
                    files,
                    [t.at for t in layout.tensors],
                    layout.num_experts,
                    checksums[layout.index] if checksums is not None else None,
                    layout.where,
                )
                files.extend(ReadFile(path, bypass_page_cache) for path in layout.files)
            tensors = [SlotTensor(t.name, t.dtype, t.shape) for t in members[0].tensors]
            pools[key] = SlotPool(tensors, slots[key], sources)
    except BaseException:
        for pool in pools.values():
            pool.close()
        for source in sources.values():  # the class whose pool was not made
            for file in source.files:
                file.close()
        raise
    return pools
