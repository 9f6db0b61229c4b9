"""How much expert memory to keep, and in what form.

A budget that holds every expert makes every layer resident: it then runs exactly as mlx-lm's
(stacked experts, no host sync, no reads). A smaller budget holds the hottest single experts
(streamer/cache/expert_cache.py) and every layer streams the rest.
"""

from __future__ import annotations

import mlx.core as mx
import psutil

from ..errors import StreamerError
from ..io.manifest import Manifest, MoeLayer
from ..io.safetensors import DTYPES
from ..io.sizes import size_text


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


def default_budget(manifest: Manifest, dtype: mx.Dtype | None) -> tuple[int, str]:
    """All experts if they fit in half of the available memory; otherwise none, leaving the memory
    to the page cache (an application cache beside it mostly duplicates what it holds)."""
    need = all_experts_bytes(manifest, dtype)
    available = psutil.virtual_memory().available
    if need <= available // 2:
        return (
            need,
            f"default: all {size_text(need)} fit in half of {size_text(available)} available",
        )
    return (
        0,
        f"default: {size_text(need)} of experts exceed half of {size_text(available)} available",
    )


def chosen_budget(
    manifest: Manifest, budget: int | None, dtype: mx.Dtype | None
) -> tuple[int, str]:
    """The budget to apply and why: `budget` as given, or the default for None."""
    if budget is None:
        return default_budget(manifest, dtype)
    return budget, f"memory budget {size_text(budget)}"


def check_budget(manifest: Manifest, budget: int, dtype: mx.Dtype | None) -> None:
    one = largest_expert_bytes(manifest, dtype)  # the budget must hold any one expert
    if budget < 0 or 0 < budget < one:
        raise StreamerError(
            f"memory budget {budget} bytes is below the minimum: one expert takes {one} bytes "
            f"({size_text(one)}). Give 0 to stream every expert, or at least {size_text(one)}."
        )
