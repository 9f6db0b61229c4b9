"""What assembling a repacked model (load.py) and a download in place (load_in_place.py) share once
their streaming layers are in place: the resident weights loaded, then the memory budget applied
by read path."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from ..cache.budget import all_experts_bytes, chosen_budget, largest_expert_bytes
from ..cache.hot_experts import HotExperts
from ..cache.slot_pool import SlotPool
from ..errors import StreamerError
from ..experts import StreamingExperts
from ..experts.slot_pools import resident_pools, slot_budget
from ..io.expert_layout import LayerLayout
from ..io.manifest import Manifest
from ..progress import progress_bar

if TYPE_CHECKING:
    from .download_folder import Download


EVAL_BATCH = 32  # arrays per evaluation while the resident weights load


def load_resident(
    model: nn.Module,
    weights: dict[str, mx.array],
    dtype: mx.Dtype | None,
    mismatch: Callable[[ValueError], str],
) -> None:
    """Load the resident weights into a model whose expert containers are already swapped for
    streaming layers, strictly: weights the model does not take are refused (`mismatch` words
    the error); then cast to `dtype` and evaluate. `weights` is emptied: an array it held would
    keep its data once evaluated, so each weight as read (bfloat16, before a cast to float32)
    would be held beside its cast until the load returned, freed then into the allocator's
    fragments, not to the OS (bench/README.md, "Real shapes": 35-73 KB per expert)."""
    try:
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as e:
        raise StreamerError(mismatch(e)) from e
    weights.clear()
    if dtype is not None:
        model.set_dtype(dtype)
    arrays = [array for _, array in tree_flatten(model.parameters())]
    # evaluated a few at a time, so that a terminal shows the read going (GBs for large models)
    with progress_bar(sum(a.nbytes for a in arrays), "[streamer] non-expert weights", "B") as bar:
        for start in range(0, len(arrays), EVAL_BATCH):
            batch = arrays[start : start + EVAL_BATCH]
            mx.eval(batch)
            bar.update(sum(a.nbytes for a in batch))
    mx.clear_cache()  # what the casts freed goes back to the system, not kept for later arrays
    model.eval()


def apply_budget(
    read_path: str,
    manifest: Manifest | Download,
    layouts: list[LayerLayout],
    layers: list[StreamingExperts],
    budget: int | None,
    dtype: mx.Dtype | None,
    checksums: list | None,
    bypass_page_cache: bool,
) -> tuple[str, list[SlotPool]]:
    """Give the layers `budget` bytes of experts (None: the default) and say what that chose.
    Enough for every expert: each layer's are read into memory (a bar on a terminal) and run
    resident. Less: the slot path reads into pools (experts/slots.py); the mapped path caches
    the hottest, or leaves them all to the page cache (0)."""
    chosen, why = chosen_budget(manifest, budget, dtype, read_path)
    if chosen >= all_experts_bytes(manifest, dtype):
        with progress_bar(len(layers), "experts into memory", "layer") as bar:
            if read_path == "slots":
                resident_pools(layouts, layers, checksums, lambda: bar.update(1))
            else:
                for layer in layers:
                    layer.make_resident()
                    bar.update(1)
        return f"all experts resident, no streaming ({why})", []
    if read_path == "slots":
        return slot_budget(manifest, layouts, layers, budget, dtype, checksums, bypass_page_cache)
    if chosen == 0:
        return f"experts stream from disk, page cache only ({why})", []
    cache = HotExperts(chosen, largest_expert_bytes(manifest, dtype))
    for layer in layers:
        layer.use_cache(cache)
    return (
        f"experts stream from disk; up to {cache.slots} hot experts kept in memory, "
        f"LFU with aging ({why})",
        [],
    )
