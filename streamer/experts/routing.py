"""What the synced compute modes share: the routing on the host, compute on stacked copies,
timing."""

from __future__ import annotations

import time

import mlx.core as mx
import numpy as np

from ..expert_traffic import ExpertTraffic
from ..io.cuda_gather import UNWANTED


def host_routing(layer, indices: mx.array, traffic: ExpertTraffic) -> tuple[np.ndarray, list[int]]:
    """The routed indices on the host and the distinct experts among them, sorted: the layer's
    one host sync (it evaluates attention and the router). Counted, and traced for decode."""
    start = time.perf_counter()
    routed = np.array(indices)
    traffic.syncs += 1
    traffic.sync_seconds += time.perf_counter() - start
    experts = sorted(
        set(routed.ravel().tolist())
    )  # little code to run on caches the compute flushed
    if layer.stats.trace is not None:
        layer.stats.record_routing(layer.index, routed)
    return routed, experts


def compute_stacked(
    layer, x: mx.array, stacked: list[mx.array], experts: list[int], routed: np.ndarray
) -> mx.array:
    """The container on `stacked` (the routed experts' tensors, in `experts` order)."""
    layer.install(stacked)
    position = np.searchsorted(np.array(experts, dtype=routed.dtype), routed).astype(np.uint32)
    out = layer.compute(x, mx.array(position))
    layer.install(layer.views)  # the output's graph holds the copies until it is evaluated
    return out


def finish(layer, out: mx.array, traffic: ExpertTraffic, start: float) -> mx.array:
    """Count the layer's time since `start`; when profiling, evaluate `out` to time the compute."""
    if layer.stats.profile:
        computed = time.perf_counter()
        mx.eval(out)
        traffic.compute_seconds += time.perf_counter() - computed
    traffic.layer_seconds += time.perf_counter() - start
    return out


def in_routed_order(routed: np.ndarray, entries: list, outs: list[mx.array]) -> mx.array:
    """Parts computed for `entries` (flat positions in `routed`), put back in routed order:
    [*routed.shape, hidden], as the container's output on every entry at once."""
    back = mx.array(np.argsort(np.concatenate(entries)).astype(np.uint32))
    return mx.take(mx.concatenate(outs), back, 0).reshape(*routed.shape, -1)


def kept(routed: np.ndarray, group: np.ndarray, new: mx.array, old: mx.array) -> mx.array:
    """`new` on the entries routed to `group`'s experts, `old` on the rest: both the container's
    output on every entry ([*routed.shape, hidden])."""
    return mx.where(mx.array(np.isin(routed, group))[..., None], new, old)


def routed_rows(indices: mx.array, experts: int) -> mx.array:
    """A layer's `experts` as the rows of a prompt's gathered stack: each expert where `indices`
    routes it, UNWANTED where not (no index points at that row, so the GPU moves only what the
    prompt routes: a 64-token prompt routes about 73 of Qwen3-30B-A3B's 128 experts a layer)."""
    rows = mx.arange(experts, dtype=mx.uint32)
    return mx.where((indices.reshape(-1, 1) == rows).any(axis=0), rows, UNWANTED)
