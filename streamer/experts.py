"""The streaming expert layer: a drop-in for mlx-lm's SwitchGLU / SwitchMLP.

It keeps the call contract `(x [..., D], indices [..., k]) -> [..., k, D]`, so every architecture's
router and score code runs unchanged. Per call: one host sync to learn the routed experts, one
read of each distinct expert (a whole prompt chunk shares them), then mlx-lm's own container code
computes on stacked tensors that hold just those experts, with indices remapped to them.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .io.expert_store import ExpertStore
from .io.safetensors import DTYPES
from .stats import ExpertStats


_EMPTY = mx.zeros((0,))


class StreamingExperts(nn.Module):
    def __init__(self, container: nn.Module, store: ExpertStore, layer_index: int, stats: ExpertStats, dtype: mx.Dtype | None):
        super().__init__()
        layer = store.layers[layer_index]
        # Held outside the parameter tree: its stacked weights are placeholders, swapped per call,
        # and must never be evaluated, saved or loaded.
        object.__setattr__(self, "_container", container)
        object.__setattr__(self, "_slots", [tuple(t.name.split(".")) for t in layer.tensors])
        object.__setattr__(self, "_mlx_dtypes", [DTYPES[t.dtype][1] for t in layer.tensors])
        self._store = store
        self._layer_index = layer_index
        self._stats = stats
        self._dtype = dtype
        self._release()

    def __call__(self, x: mx.array, indices: mx.array) -> mx.array:
        routed = np.array(indices)  # the layer's one host sync: evaluates attention and router
        traffic = self._stats.phase(routed.size // routed.shape[-1])
        traffic.layer_calls += 1
        traffic.syncs += 1
        experts, local = np.unique(routed, return_inverse=True)
        arrays = self._store.read(self._layer_index, experts, traffic)
        for (projection, kind), dtype, array in zip(self._slots, self._mlx_dtypes, arrays):
            tensor = mx.array(array)
            if tensor.dtype != dtype:
                tensor = tensor.view(dtype)
            if self._dtype is not None and mx.issubdtype(dtype, mx.floating):
                tensor = tensor.astype(self._dtype)
            self._container[projection][kind] = tensor
        local = mx.array(local.reshape(routed.shape).astype(np.uint32))
        out = self._container(x, local)
        self._release()  # the output's graph holds the experts until it is evaluated, nothing after
        return out

    def _release(self) -> None:
        for projection, kind in self._slots:
            self._container[projection][kind] = _EMPTY
