"""How much expert memory to keep, and in what form.

A budget that holds every expert makes every layer resident: it then runs exactly as mlx-lm's
(stacked experts, no host sync, no reads). A smaller budget holds the hottest single experts
(streamer/cache/hot_experts.py) and every layer streams the rest.
"""

from __future__ import annotations

import mlx.core as mx

from ..errors import StreamerError
from ..io.manifest import Manifest, MoeLayer
from ..io.safetensors import DTYPES
from ..io.sizes import size_text
from .expected_hits import expected_hits_line, expected_pool_hits


def layer_bytes(layer: MoeLayer, dtype: mx.Dtype | None) -> int:
    """Memory one layer's experts take once resident (floating tensors converted to `dtype`)."""
    total = 0
    for t in layer.tensors:
        storage, kind = DTYPES[t.dtype]
        converted = dtype is not None and mx.issubdtype(kind, mx.floating)
        total += t.nbytes // storage.itemsize * dtype.size if converted else t.nbytes
    return total * layer.num_experts


def largest_expert_bytes(manifest: Manifest, dtype: mx.Dtype | None) -> int:
    """Memory of the largest single expert once resident."""
    return max(layer_bytes(layer, dtype) // layer.num_experts for layer in manifest.layers)


def all_experts_bytes(manifest: Manifest, dtype: mx.Dtype | None) -> int:
    return sum(layer_bytes(layer, dtype) for layer in manifest.layers)


# The slot path's default: this share of the memory available once the resident weights are in
# memory, the rest left to the KV cache, the OS and the page cache; why most of what is left goes
# to the pool: bench/findings.md, "A budget people can pick" (bench/budget_model.py).
SLOT_SHARE = 0.75


def slot_default(expert_bytes: int, largest_expert: int, available: int) -> int:
    """The slot pool's default bytes: all experts if they fit in SLOT_SHARE of `available`, else
    that share (at least one expert)."""
    return min(expert_bytes, max(int(available * SLOT_SHARE), largest_expert))


def default_budget(
    need: int, largest_expert: int, available: int, read_path: str, memory: str = "memory"
) -> tuple[int, str]:
    """The budget for None, and why, for experts of `need` bytes in all (the largest one
    `largest_expert`) and `available` bytes of `memory` (which memory: "GPU memory" on CUDA).
    The slot path: slot_default. The mapped path: all experts if they fit in half of it;
    otherwise none, leaving the memory to the page cache, whose hits it computes on in place at
    no cost (an application cache beside it mostly duplicates it)."""
    free = f"{size_text(available)} of {memory} available"
    if read_path == "slots":
        chosen = slot_default(need, largest_expert, available)
        if chosen >= need:
            return need, f"default: all {size_text(need)} fit in {SLOT_SHARE:.0%} of {free}"
        return chosen, (
            f"default: {SLOT_SHARE:.0%} of {free}, "
            f"{chosen / need:.0%} of {size_text(need)} of experts; expect about "
            f"{expected_pool_hits(chosen / need):.0%} pool hits on typical routing "
            f"({expected_hits_line(chosen / need)})"
        )
    if need <= available // 2:
        return need, f"default: all {size_text(need)} fit in half of {free}"
    return 0, f"default: {size_text(need)} of experts exceed half of {free}"


def check_budget(manifest: Manifest, budget: int, dtype: mx.Dtype | None) -> None:
    one = largest_expert_bytes(manifest, dtype)  # the budget must hold any one expert
    if budget < 0 or 0 < budget < one:
        raise StreamerError(
            f"memory budget {size_text(budget)} is below the minimum: one expert takes "
            f"{size_text(one)}. Give 0 to stream every expert, or at least {size_text(one)}."
        )


def layer_groups(layers: int, slots: int, per_chunk: int) -> list[tuple[int, int, int]]:
    """(first, end, slots) of groups of consecutive layers, each group's share of `slots` (in
    proportion to its layers) within one chunk of `per_chunk` slots, where one layer's share
    fits in one; a layer whose share does not is a group of its own."""
    if slots <= per_chunk:
        return [(0, layers, slots)]
    size = max(1, layers * per_chunk // slots)
    bounds = [*range(0, layers, size), layers]
    return [(a, b, _share(slots, layers, a, b, per_chunk)) for a, b in zip(bounds, bounds[1:])]


def _share(slots: int, layers: int, first: int, end: int, per_chunk: int) -> int:
    share = max(1, slots * end // layers - slots * first // layers)
    return share if end - first == 1 else min(share, per_chunk)  # rounding may pass a chunk
