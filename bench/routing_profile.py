"""How a model routes over decode steps: expert popularity and token-to-token reuse, against
uniform routing with as many picks (an untimed run beside the timed ones)."""

from __future__ import annotations

from collections.abc import Iterable

import mlx.nn as nn
import numpy as np

from streamer.families.architectures import recording_routing
from streamer.routing_trace import routing_skew


def routing_profile(
    model: nn.Module, steps: Iterable, num_experts: int, keep_trace: bool = False
) -> dict:
    """Expert popularity and temporal correlation over the decode steps `steps` runs (a lazy
    generation, run here while routing is recorded)."""
    with recording_routing(model) as trace:  # decode steps only
        for _ in steps:
            pass
    per_layer: dict[int, list[tuple[int, ...]]] = {}
    for layer, experts in trace:
        per_layer.setdefault(layer, []).append(experts)
    layers = [routing_skew(np.array(decode), num_experts) for decode in per_layer.values()]
    steps, k = np.array(next(iter(per_layer.values()))).shape  # alike in every layer
    # The same statistic for uniform routing with as many picks: small samples inflate it.
    uniform = np.random.default_rng(0)
    picks = np.stack([uniform.permutation(num_experts)[:k] for _ in range(steps)])
    return {
        "decode_steps": steps,
        "top10pct_experts_share": float(np.mean([s["top10_share"] for s in layers])),
        "uniform_top10pct_share": routing_skew(picks, num_experts)["top10_share"],
        # the share of a token's experts the previous token also used
        "consecutive_overlap": float(np.mean([s["overlap"] for s in layers])),
        "uniform_overlap": k / num_experts,
        "experts_touched_per_layer": float(np.mean([num_experts - s["unused"] for s in layers])),
        "per_layer_top10pct_share": [round(s["top10_share"], 3) for s in layers],
        **({"trace": [[layer, list(experts)] for layer, experts in trace]} if keep_trace else {}),
    }
