"""The streaming expert layer: a drop-in for mlx-lm's SwitchGLU / SwitchMLP.

It keeps the call contract `(x [..., D], indices [..., k]) -> [..., k, D]`, so every architecture's
router and score code runs unchanged. The container computes on the store's views of the mapped
expert file, so the routed experts are read in place from the page cache, with no copy.

While the layer's file is all in the page cache the call is just that, with no sync, as in a
resident model. Otherwise it takes one host sync to learn the routed experts and one madvise per
routed expert that is not cached, so misses arrive in large parallel reads before the compute
(a whole prompt chunk shares them).

Two cases copy the routed experts into a stacked tensor instead: a hot-expert cache (hits come
from memory, misses from the file) and a compute dtype that differs from the stored one (on the
CPU backend float32 activations need float32 scales). A layer made resident holds all its
experts in memory and runs like mlx-lm's: no sync, no madvise.
"""

from __future__ import annotations

import time

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .cache.expert_cache import ExpertCache
from .experts_parallel import ExpertShare
from .io.expert_store import ExpertStore
from .stats import ExpertStats, ExpertTraffic

RECHECK_CALLS = (
    16  # a layer running without syncs asks again this often whether its file is all cached
)


class StreamingExperts(nn.Module):
    def __init__(
        self,
        container: nn.Module,
        store: ExpertStore,
        layer_index: int,
        stats: ExpertStats,
        dtype: mx.Dtype | None,
        share: ExpertShare | None = None,
    ):
        super().__init__()
        layer = store.layers[layer_index]
        # Held outside the parameter tree: its stacked weights are views of the expert file (or
        # per-call copies) and must never be evaluated, saved or loaded with the model.
        object.__setattr__(self, "_container", container)
        object.__setattr__(self, "_slots", [tuple(t.name.split(".")) for t in layer.tensors])
        object.__setattr__(self, "_views", store.experts(layer_index))
        self._store = store
        self._layer_index = layer_index
        self._stats = stats
        self._dtype = dtype
        self._converts = any(self._convert(v) is not v for v in self._views)
        self._sizes = (store.expert_bytes[layer_index], layer.record_bytes)
        self._calls = self._next_check = self._evictions = 0
        self._file_cached = False
        self._share = share  # expert-parallel: the experts this rank computes
        self.cache: ExpertCache | None = None
        self.resident = False
        self._install(self._views)

    def make_resident(self) -> None:
        """Keep every expert of this layer in memory from now on."""
        self._install([self._convert(mx.array(v)) for v in self._views])  # mx.array copies
        mx.eval([self._container[p][k] for p, k in self._slots])
        self.resident = True

    def __call__(self, x: mx.array, indices: mx.array) -> mx.array:
        traffic = self._stats.phase(indices.size // indices.shape[-1])
        traffic.layer_calls += 1
        share = self._share
        if self.resident:
            if share is None:
                return self._container(x, indices)
            return share.sum(share.sync_free(self._container, x, indices)[0], traffic)
        if self._file_in_page_cache():  # nothing to fetch: no need to know the routing now
            if share is None:
                self._stats.unsettled.append((traffic, indices, *self._sizes))
                return self._container(x, indices)
            out, records = share.sync_free(self._container, x, indices)
            self._stats.unsettled.append((traffic, records, *self._sizes))
            return share.sum(out, traffic)
        start = time.perf_counter()
        routed = np.array(indices)  # the layer's one host sync: evaluates attention and router
        synced = time.perf_counter()
        traffic.syncs += 1
        traffic.sync_seconds += synced - start
        if share is None:
            slots, records = None, routed
        else:
            slots, records = share.owned_slots(routed)
        experts = sorted(set(records.ravel().tolist()))  # records of this layer's file
        if self._stats.trace is not None and traffic is self._stats.phase(1):
            routed_here = routed.ravel() if slots is None else routed.ravel()[slots]
            self._stats.trace.append((self._layer_index, tuple(sorted(set(routed_here.tolist())))))
        if self.cache is None and not self._converts:
            self._store.prefetch(self._layer_index, experts, traffic)
            out = (  # on the file's views: no copy
                self._container(x, indices)
                if share is None
                else share.compute_slots(self._container, x, indices.shape, slots, records)
            )
        else:
            self._install(self._gather(experts, traffic))
            position = np.searchsorted(np.array(experts, dtype=records.dtype), records)
            out = (
                self._container(x, mx.array(position.astype(np.uint32)))
                if share is None
                else share.compute_slots(self._container, x, indices.shape, slots, position)
            )
            self._install(self._views)  # the output's graph holds the copies until it is evaluated
        if share is not None:
            out = share.sum(out, traffic)
        if self._stats.profile:
            computed = time.perf_counter()
            mx.eval(out)
            traffic.compute_seconds += time.perf_counter() - computed
        traffic.layer_seconds += time.perf_counter() - start
        return out

    def _file_in_page_cache(self) -> bool:
        """Whether the layer's whole expert file is in the page cache, asked every RECHECK_CALLS
        calls. Then the layer runs like a resident one, with no sync; if the kernel evicts pages
        meanwhile they are faulted back in, and the next check returns to syncing and prefetching.
        The hot-expert cache, dtype conversion and verify_reads need the routing on the host first."""
        if (
            self.cache is not None
            or self._converts
            or self._store.verify_reads
            or self._stats.trace is not None
            or self._stats.profile
        ):
            return False
        self._calls += 1
        if self._calls >= self._next_check or self._evictions != self._store.evictions:
            self._next_check, self._evictions = self._calls + RECHECK_CALLS, self._store.evictions
            self._file_cached = self._store.file_in_page_cache(self._layer_index)
        return self._file_cached

    def _gather(self, experts: list[int], traffic: ExpertTraffic) -> list[mx.array]:
        """The routed experts stacked per tensor in the compute dtype, in `experts` order."""
        if self.cache is None:
            self._store.prefetch(self._layer_index, experts, traffic)
            taken = mx.array(experts, dtype=mx.uint32)
            traffic.bytes_copied += len(experts) * sum(v[0].nbytes for v in self._views)
            # taking whole rows of [experts, -1] (a view) copies each expert in one run, several
            # times faster on CPU than a take along the first axis of the strided 3-D view
            return [
                self._convert(
                    mx.take(v.reshape(v.shape[0], -1), taken, axis=0).reshape(
                        len(experts), *v.shape[1:]
                    )
                )
                for v in self._views
            ]
        cached = [self.cache.access(self._layer_index, expert) for expert in experts]
        misses = [expert for expert, (tensors, _) in zip(experts, cached) if tensors is None]
        traffic.cache_hits += len(experts) - len(misses)
        self._store.prefetch(self._layer_index, misses, traffic)
        per_expert = []
        for expert, (tensors, admitted) in zip(experts, cached):
            if tensors is None:
                tensors = [self._convert(v[expert]) for v in self._views]
                if admitted:  # a copy of its own: a cached expert must not be page cache
                    tensors = [mx.array(t) for t in tensors]
                    self.cache.put(self._layer_index, expert, tensors)
            per_expert.append(tensors)
        stacked = [mx.stack(parts) for parts in zip(*per_expert)]
        traffic.bytes_copied += sum(a.nbytes for a in stacked)
        return stacked

    def _convert(self, tensor: mx.array) -> mx.array:
        if (
            self._dtype is not None
            and mx.issubdtype(tensor.dtype, mx.floating)
            and tensor.dtype != self._dtype
        ):
            return tensor.astype(self._dtype)
        return tensor

    def _install(self, tensors: list[mx.array]) -> None:
        for (projection, kind), tensor in zip(self._slots, tensors):
            self._container[projection][kind] = tensor
