"""The slot pools of a model's streamed layers: how a budget is shared among shape classes and
groups of layers, the pools opened over the layers' files, and the all-resident case.

The read path that computes on them is experts/slots.py; the pool itself cache/slot_pool.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import psutil

from ..cache.budget import chosen_budget, layer_groups
from ..cache.slot_memory import LayerSource, SlotTensor, chunk_slots
from ..cache.slot_pool import CHUNK_BYTES, SlotPool
from ..errors import StreamerError
from ..io.expert_layout import LayerLayout
from ..io.manifest import Manifest
from ..io.reads import ReadFile
from ..io.sizes import size_text


def resident_pools(
    layouts: list[LayerLayout], layers: list, checksums: list | None, done: Callable[[], object]
) -> None:
    """Every layer's experts read once into a pool of its own, then run resident; `done` is
    called after each layer (a progress bar)."""
    for layout, layer in zip(layouts, layers):
        own = open_pools([layout], {shape_class(layout): layout.num_experts}, checksums, None)
        layer.use_pool(own[layout.index])  # one array per tensor, as mlx-lm holds the layer
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
    less than every expert's bytes (more: resident_pools), and say so: per shape class its share
    of the budget in proportion to the class's experts, at least one slot, in pools of one chunk
    per group of layers (open_pools); 0: one layer's experts each, one pool (the smallest in
    which any call, a whole prompt chunk too, runs in one round). Slots that do not fit in the
    available memory are refused before any pool is made."""
    budget, why = chosen_budget(manifest, budget, dtype, "slots")
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
    need = sum(slots[key] * slot_bytes[key] for key in slots)
    available = psutil.virtual_memory().available
    if need > available:
        raise StreamerError(
            f"a slot pool of {size_text(need)} ({why}) does not fit in the {size_text(available)} "
            "of memory available: give a smaller memory budget."
        )
    by_layer = open_pools(layouts, slots, checksums, CHUNK_BYTES, bypass_page_cache, budget > 0)
    for layout, layer in zip(layouts, layers):
        layer.use_pool(by_layer[layout.index])
    pools = list({id(pool): pool for pool in by_layer.values()}.values())
    size = sum(pool.nbytes for pool in pools)
    sizes = ", ".join(str(sum(p.slots for p in pools if p.tensors == t)) for t in _classes(pools))
    arrays = sum(len(pool.chunks) for pool in pools)
    kind = "one layer's experts" if budget == 0 else "LFU with aging"
    if bypass_page_cache:
        kind += ", read around the page cache"
    if arrays > 1:
        kind += f", {arrays} chunks"
    return (
        f"experts stream from disk into a slot pool of {sizes} slots ({size_text(size)}, "
        f"{kind}; {why})",
        pools,
    )


def _classes(pools: list[SlotPool]) -> list[tuple]:
    return list(dict.fromkeys(pool.tensors for pool in pools))


def shape_class(layout: LayerLayout) -> tuple:
    return tuple((t.name, t.dtype, t.shape) for t in layout.tensors)


def open_pools(
    layouts: list[LayerLayout],
    slots: dict[tuple, int],
    checksums: list | None,
    chunk_bytes: int | None = CHUNK_BYTES,
    bypass_page_cache: bool = False,
    grouped: bool = False,
) -> dict[int, SlotPool]:
    """The pool of each layer (by index): per shape class of `layouts`, `slots[class]` slots in
    arrays of at most `chunk_bytes` (None: one per tensor), in one pool or (`grouped`) one per
    group of layers (layer_groups); the layers' files opened for reads (never mapped), each
    once: the pools share them, and are closed together.
    `checksums[layer]`: [expert][tensor] crc32s, checked on every read."""
    classes: dict[tuple, list[LayerLayout]] = {}
    for layout in layouts:
        classes.setdefault(shape_class(layout), []).append(layout)
    pools: dict[int, SlotPool] = {}
    # each path opened once: a download's layer names a shard once per stacked tensor, and
    # Kimi K2's 60 layers would otherwise open 540 descriptors (macOS allows 256 by default)
    opened: dict[Path, ReadFile] = {}
    try:
        for key, members in classes.items():
            tensors = [SlotTensor(t.name, t.dtype, t.shape) for t in members[0].tensors]
            per_chunk = chunk_slots(tensors, slots[key], chunk_bytes)
            groups = layer_groups(len(members), slots[key], per_chunk if grouped else slots[key])
            for first, end, count in groups:
                sources = {}
                for layout in members[first:end]:
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
                pool = SlotPool(tensors, count, sources, chunk_bytes)
                pools.update(dict.fromkeys(sources, pool))
    except BaseException:
        for file in opened.values():
            file.close()
        raise
    return pools
