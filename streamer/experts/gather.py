"""Compute mode for a compute dtype other than the stored one (on the CPU backend float32
activations need float32 scales): the routed experts are copied out of the files, converted."""

from __future__ import annotations

import time

import mlx.core as mx

from ..expert_traffic import ExpertTraffic
from .routing import compute_stacked, finish, host_routing


class GatherConvert:
    def __call__(self, layer, x: mx.array, indices: mx.array, traffic: ExpertTraffic) -> mx.array:
        start = time.perf_counter()
        routed, experts = host_routing(layer, indices, traffic)
        layer.prefetcher.fetch(experts, traffic)
        taken = mx.array(experts, dtype=mx.uint32)
        traffic.bytes_copied += len(experts) * sum(v[0].nbytes for v in layer.views)
        # taking whole rows of [experts, -1] (a view) copies each expert in one run, several
        # times faster on CPU than a take along the first axis of the strided 3-D view
        stacked = [
            layer.convert(
                mx.take(v.reshape(v.shape[0], -1), taken, axis=0).reshape(
                    len(experts), *v.shape[1:]
                )
            )
            for v in layer.views
        ]
        return finish(layer, compute_stacked(layer, x, stacked, experts, routed), traffic, start)
