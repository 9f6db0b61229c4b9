"""What assembling a repacked model and a download in place share once their streaming layers
are in place: the resident weights loaded, then the residency plan (residency.py) applied."""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from ..cache.hot_experts import HotExperts
from ..cache.slot_pool import SlotPool
from ..errors import StreamerError, one_line
from ..experts import StreamingExperts
from ..io.expert_layout import LayerLayout
from ..progress import progress_bar
from .pools import open_pools, resident_pools
from .residency import ResidencyPlan, check_fits

EVAL_BATCH = 32  # arrays per evaluation while the resident weights load


def load_resident(
    model: nn.Module,
    weights: dict[str, mx.array],
    dtype: mx.Dtype | None,
    mismatch: Callable[[str], str],
) -> None:
    """Load the resident weights into a model whose expert containers are already swapped for
    streaming layers, strictly: weights the model does not take are refused (`mismatch` words
    MLX's message, made one line); then cast to `dtype` and evaluate. `weights` is emptied: an
    array it held would keep its data once evaluated, so each weight as read (bfloat16, before a
    cast to float32) would be held beside its cast until the load returned, freed then into the
    allocator's fragments, not to the OS (bench/findings.md, "Real shapes": 35-73 KB per expert)."""
    try:
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as e:
        raise StreamerError(mismatch(one_line(e))) from e
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
    # computed lazily on this thread's stream: serve's and chat's generation thread has none
    mx.eval(kept_arrays(model))
    mx.clear_cache()  # what the casts freed goes back to the system, not kept for later arrays
    model.eval()


def kept_arrays(model: nn.Module) -> list[mx.array]:
    """The arrays modules keep beside their parameters, under names starting with "_" (a YaRN
    rope's frequencies: gpt-oss, DeepSeek-V3.2, Llama 4)."""
    return [
        v
        for _, module in model.named_modules()
        for k, v in module.items()
        if k.startswith("_") and isinstance(v, mx.array)
    ]


def apply_residency(
    plan: ResidencyPlan,
    layouts: list[LayerLayout],
    layers: list[StreamingExperts],
    checksums: list | None,
) -> list[SlotPool]:
    """Give the layers what `plan` says: every expert read into memory (a bar on a terminal), a
    slot pool per group of layers, the hot-expert cache, or nothing (the page cache). The slot
    pools made, for the handle to close."""
    check_fits(plan)
    if plan.form == "resident":
        with progress_bar(len(layers), "experts into memory", "layer") as bar:
            if plan.read_path == "slots":  # the files are not mapped: read through pools
                resident_pools(
                    layouts,
                    layers,
                    checksums,
                    lambda: bar.update(1),
                    plan.cuda_misses,
                    plan.pinnable,
                )
            else:
                for layer in layers:
                    layer.make_resident()
                    bar.update(1)
        return []
    if plan.form == "slot pool":
        groups = [group for shape in plan.classes for group in shape.groups]
        by_layer = open_pools(
            layouts,
            groups,
            checksums,
            plan.chunk_bytes,
            plan.bypass_page_cache,
            plan.cuda_misses,
            plan.pinnable,
        )
        for layout, layer in zip(layouts, layers):
            layer.use_pool(by_layer[layout.index])
        return list({id(pool): pool for pool in by_layer.values()}.values())
    if plan.form == "hot cache":
        cache = HotExperts(plan.budget, plan.largest_expert)
        for layer in layers:
            layer.use_cache(cache)
    return []
