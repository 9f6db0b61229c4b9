"""Routing traces: which experts each MoE layer routed each token to, recorded from mlx-lm's own
expert containers (streamed layers record their own), and how a trace is spread (skew, reuse)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np

# One routed token of one MoE layer: (MoE layer number, the token's experts, sorted).
Routing = tuple[int, tuple[int, ...]]


class RoutingRecorder(nn.Module):
    """An mlx-lm expert container that hands each call's routing to `record` (a model's
    `ExpertStats.record_routing`; streamed layers record their own)."""

    def __init__(self, inner: nn.Module, record: Callable[[int, np.ndarray], None], layer: int):
        super().__init__()
        self.inner = inner
        object.__setattr__(self, "_record", record)
        self._layer = layer

    def __call__(self, x: mx.array, indices: mx.array) -> mx.array:
        self._record(self._layer, np.array(indices))
        return self.inner(x, indices)


def top_tenth(num_experts: int) -> int:
    """How many experts "the top 10%" of a layer's are: at least one."""
    return max(1, math.ceil(0.1 * num_experts))


def routing_skew(routed: np.ndarray, num_experts: int, starts: Sequence[int] = (0,)) -> dict:
    """How one MoE layer's routing (`routed`: [tokens, k] expert ids) is spread: the share of its
    picks the top 10% of experts take, the entropy of its expert use (1: uniform), the share of a
    token's experts the previous token also used (pairs across a window start in `starts`
    skipped), the largest share, and the experts never used."""
    k = routed.shape[1]
    counts = np.bincount(routed.reshape(-1), minlength=num_experts).astype(np.float64)
    share = counts / counts.sum()
    top = top_tenth(num_experts)
    p = share[share > 0]
    entropy = float(-(p * np.log(p)).sum() / math.log(num_experts))
    same_window = np.ones(len(routed) - 1, dtype=bool)
    same_window[np.asarray(starts, dtype=np.int64)[1:] - 1] = False
    a, b = routed[:-1][same_window], routed[1:][same_window]
    overlap = (a[:, :, None] == b[:, None, :]).any(-1).sum(-1).mean() / k
    return {
        "top10_share": float(np.sort(share)[::-1][:top].sum()),
        "top10_experts": top,
        "entropy": entropy,
        "overlap": float(overlap),
        "max_share": float(share.max()),
        "unused": int((counts == 0).sum()),
    }
