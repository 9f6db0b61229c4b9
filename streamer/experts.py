"""The streaming expert layer: a drop-in for mlx-lm's SwitchGLU / SwitchMLP.

It keeps the call contract `(x [..., D], indices [..., k]) -> [..., k, D]`, so every architecture's
router and score code runs unchanged. Per call: one host sync to learn the routed experts, one
read of each distinct expert not in the hot-expert cache (a whole prompt chunk shares them), then
mlx-lm's own container code computes on stacked tensors that hold just those experts, with
indices remapped to them. A layer made resident holds all its experts and runs like mlx-lm's:
no sync, no reads.
"""

from __future__ import annotations

import time

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .cache.expert_cache import ExpertCache
from .io.expert_store import ExpertStore
from .stats import ExpertStats, ExpertTraffic

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
        self._num_experts = layer.num_experts
        self._stats = stats
        self._dtype = dtype
        self.cache: ExpertCache | None = None
        self.resident = False
        self._release()

    def make_resident(self) -> None:
        """Keep every expert of this layer in memory from now on."""
        self._install([self._convert(a) for a in self._store.read_layer(self._layer_index)])
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
        experts = sorted(set(routed.ravel().tolist()))
        if self._stats.trace is not None and traffic is self._stats.decode:
            self._stats.trace.append((self._layer_index, tuple(experts)))
        order, tensors, cached = self._gather(experts, traffic)
        self._install(tensors)
        position = np.zeros(self._num_experts, dtype=np.uint32)
        position[order] = np.arange(len(order), dtype=np.uint32)
        out = self._container(x, mx.array(position[routed]))
        self._store.arena.guard([out, *cached])
        self._release()  # the output's graph holds the experts until it is evaluated, nothing after
        if self._stats.profile:
            computed = time.perf_counter()
            mx.eval(out)
            traffic.compute_seconds += time.perf_counter() - computed
        traffic.layer_seconds += time.perf_counter() - start
        return out

    def _gather(self, experts: list[int], traffic: ExpertTraffic) -> tuple[list[int], list[mx.array], list[mx.array]]:
        """(expert order, stacked tensors in that order, tensors newly cached from the arena)."""
        if self.cache is None:
            arrays = self._store.read(self._layer_index, np.array(experts), traffic)
            return experts, [self._convert(a) for a in arrays], []
        hits, misses, admit = [], [], []
        for expert in experts:
            tensors, admitted = self.cache.access(self._layer_index, expert)
            if tensors is not None:
                hits.append((expert, tensors))
            else:
                misses.append(expert)
                admit.append(admitted)
        traffic.cache_hits += len(hits)
        stacked = [mx.stack(parts) for parts in zip(*(t for _, t in hits))] if hits else []
        traffic.bytes_copied += sum(a.nbytes for a in stacked)
        newly_cached = []
        if misses:
            read = [self._convert(a) for a in self._store.read(self._layer_index, np.array(misses), traffic)]
            for slot, (expert, admitted) in enumerate(zip(misses, admit)):
                if admitted:
                    copies = [mx.array(t[slot]) for t in read]  # out of the arena
                    self.cache.put(self._layer_index, expert, copies)
                    newly_cached += copies
            stacked = [mx.concatenate([h, m]) for h, m in zip(stacked, read)] if hits else read
        return [e for e, _ in hits] + misses, stacked, newly_cached

    def _convert(self, tensor: mx.array) -> mx.array:
        if self._dtype is not None and mx.issubdtype(tensor.dtype, mx.floating):
            return tensor.astype(self._dtype)
        return tensor

    def _install(self, tensors: list[mx.array]) -> None:
        for (projection, kind), tensor in zip(self._slots, tensors):
            self._container[projection][kind] = tensor

    def _release(self) -> None:
        for projection, kind in self._slots:
            self._container[projection][kind] = _EMPTY
