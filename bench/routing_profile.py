"""How a model routes over decode steps: expert popularity and token-to-token reuse, against
uniform routing with as many picks (an untimed run beside the timed ones)."""

from __future__ import annotations

from collections.abc import Iterable

import mlx.nn as nn
import numpy as np

from streamer.architectures import recording_routing


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
    top_share, overlap, touched = [], [], []
    uniform = np.random.default_rng(0)
    for decode in per_layer.values():
        k = len(decode[0])
        counts = np.sort(np.bincount(np.concatenate(decode), minlength=num_experts))[::-1]
        top_share.append(counts[: max(1, num_experts // 10)].sum() / counts.sum())
        overlap.append(np.mean([len(set(a) & set(b)) / k for a, b in zip(decode, decode[1:])]))
        touched.append(int((counts > 0).sum()))
    # The same statistic for uniform routing with as many picks: small samples inflate it.
    picks = np.stack([uniform.permutation(num_experts)[:k] for _ in range(len(decode))]).ravel()
    reference = np.sort(np.bincount(picks, minlength=num_experts))[::-1]
    return {
        "decode_steps": len(decode),
        "top10pct_experts_share": float(np.mean(top_share)),
        "uniform_top10pct_share": float(
            reference[: max(1, num_experts // 10)].sum() / reference.sum()
        ),
        "consecutive_overlap": float(
            np.mean(overlap)
        ),  # share of a token's experts the previous token also used
        "uniform_overlap": k / num_experts,
        "experts_touched_per_layer": float(np.mean(touched)),
        "per_layer_top10pct_share": [round(float(s), 3) for s in top_share],
        **({"trace": [[layer, list(experts)] for layer, experts in trace]} if keep_trace else {}),
    }
