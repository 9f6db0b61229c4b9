"""Compute mode with a hot-expert cache (cache/hot_experts.py): hits come from memory, misses from
the files; the routed experts are stacked per tensor in the compute dtype."""

from __future__ import annotations

import time

import mlx.core as mx

from ..expert_traffic import ExpertTraffic
from .routing import compute_stacked, finish, host_routing


class HotReads:
    def __init__(self, layer):
        self._cache = layer.cache

    def __call__(self, layer, x: mx.array, indices: mx.array, traffic: ExpertTraffic) -> mx.array:
        start = time.perf_counter()
        routed, experts = host_routing(layer, indices, traffic)
        cached = [self._cache.access(layer.index, expert) for expert in experts]
        misses = [expert for expert, (tensors, _) in zip(experts, cached) if tensors is None]
        traffic.cache_hits += len(experts) - len(misses)
        if layer.stats.verifying is not None:
            layer.stats.verifying[-1].hits.update(set(experts) - set(misses))
        layer.prefetcher.fetch(misses, traffic)
        per_expert = []
        for expert, (tensors, admitted) in zip(experts, cached):
            if tensors is None:
                tensors = [layer.convert(v[expert]) for v in layer.views]
                if admitted:  # a copy of its own: a cached expert must not be page cache
                    tensors = [mx.array(t) for t in tensors]
                    self._cache.put(layer.index, expert, tensors)
            per_expert.append(tensors)
        stacked = [mx.stack(parts) for parts in zip(*per_expert)]
        traffic.bytes_copied += sum(a.nbytes for a in stacked)
        return finish(layer, compute_stacked(layer, x, stacked, experts, routed), traffic, start)
