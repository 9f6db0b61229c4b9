"""The streaming expert layer: a drop-in for mlx-lm's SwitchGLU / SwitchMLP.

It keeps the call contract `(x [..., D], indices [..., k]) -> [..., k, D]`, so every architecture's
router and score code runs unchanged. Per call: one host sync to learn the routed experts, one
read of each distinct expert (a whole prompt chunk shares them), then mlx-lm's own container code
computes on stacked tensors that hold just those experts, with indices remapped to them.
A layer made resident holds all its experts and runs like mlx-lm's: no sync, no reads.
"""

from __future__ import annotations

import time

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .io.expert_store import ExpertStore
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
        self._store = store
        self._layer_index = layer_index
        self._stats = stats
        self._dtype = dtype
        self.resident = False
        self._release()

    def make_resident(self) -> None:
        """Keep every expert of this layer in memory from now on."""
        self._install(self._store.read_layer(self._layer_index))
        mx.eval([self._container[p][k] for p, k in self._slots])
        self.resident = True

    def __call__(self, x: mx.array, indices: mx.array) -> mx.array:
        if self.resident:
            self._stats.phase(indices.size // indices.shape[-1]).layer_calls += 1
            return self._container(x, indices)
        start = time.perf_counter()
        routed = np.array(indices)  # the layer's one host sync: evaluates attention and router
        synced = time.perf_counter()
        traffic = self._stats.phase(routed.size // routed.shape[-1])
        traffic.layer_calls += 1
        traffic.syncs += 1
        traffic.sync_seconds += synced - start
        # np.unique costs ~9 us on a handful of ids; a set and searchsorted ~2 us
        experts = np.array(sorted(set(routed.ravel().tolist())), dtype=routed.dtype)
        self._install(self._store.read(self._layer_index, experts, traffic))
        local = mx.array(np.searchsorted(experts, routed).astype(np.uint32))
        out = self._container(x, local)
        self._store.arena.guard(out)
        self._release()  # the output's graph holds the experts until it is evaluated, nothing after
        if self._stats.profile:
            computed = time.perf_counter()
            mx.eval(out)
            traffic.compute_seconds += time.perf_counter() - computed
        traffic.layer_seconds += time.perf_counter() - start
        return out

    def _install(self, arrays: list[mx.array]) -> None:
        for (projection, kind), tensor in zip(self._slots, arrays):
            if self._dtype is not None and mx.issubdtype(tensor.dtype, mx.floating):
                tensor = tensor.astype(self._dtype)
            self._container[projection][kind] = tensor

    def _release(self) -> None:
        for projection, kind in self._slots:
            self._container[projection][kind] = _EMPTY
