"""Which MoE layers keep all their experts in memory, within a budget.

A fully resident layer runs exactly as mlx-lm does (stacked experts, no host sync, no reads);
the other layers stream. Whole layers, not single hot experts, because what a resident layer saves
is the host sync and the read path; single hot experts are already served by the page cache.
"""

from __future__ import annotations

import mlx.core as mx
import psutil

from ..io.manifest import Manifest, MoeLayer
from ..io.safetensors import DTYPES


def layer_bytes(layer: MoeLayer, dtype: mx.Dtype | None) -> int:
    """Memory one layer's experts take once resident (floating tensors converted to `dtype`)."""
    total = 0
    for t in layer.tensors:
        size = t.nbytes
        storage, kind = DTYPES[t.dtype]
        if dtype is not None and mx.issubdtype(kind, mx.floating):
            size = size // storage.itemsize * dtype.size
        total += size
    return total * layer.num_experts


def default_budget(manifest: Manifest, dtype: mx.Dtype | None) -> tuple[int, str]:
    """All experts if they fit in half of the available memory, else none (page cache only)."""
    need = sum(layer_bytes(layer, dtype) for layer in manifest.layers)
    available = psutil.virtual_memory().available
    if need <= available // 2:
        return need, f"all experts resident ({need / 1e9:.2f} GB fits in half of {available / 1e9:.1f} GB available)"
    return 0, f"experts stream from disk ({need / 1e9:.2f} GB exceeds half of {available / 1e9:.1f} GB available)"


def resident_layers(manifest: Manifest, budget: int, dtype: mx.Dtype | None) -> list[int]:
    """Indices of the layers kept resident: as many whole layers as fit, first layers first."""
    chosen, used = [], 0
    for index, layer in enumerate(manifest.layers):
        size = layer_bytes(layer, dtype)
        if used + size > budget:
            break
        chosen.append(index)
        used += size
    return chosen
