#!/usr/bin/env python3
"""Hit rate against cache share: the routing model's profiles (bench/routing_model.py, per-layer
LRU and the slot pool's LFU with aging) beside the published points of trained models
(../shared/notes/routing.md).

    python bench/routing_plot.py [OUT.png]     # default bench/results/routing-hits.png

Needs matplotlib (`pip install -e ".[bench]"`). The curves replay 16 layers, 2000 tokens over 4
prompts (layers are drawn independently: 48 give the same curves with less noise).
"""

from __future__ import annotations

import sys
from pathlib import Path

from routing_model import PROFILES, RoutingModel, replay

SHARES = [0.0625, 0.125, 0.1875, 0.25, 0.375, 0.5, 0.625, 0.75]
PUBLISHED = {  # model (policy, source): [(share of experts, hit rate)]; ranges at their middle
    "Qwen3-30B-A3B (LRU, imp PR 1374)": [
        (0.06, 0.366),
        (0.19, 0.741),
        (0.38, 0.894),
        (0.64, 0.962),
    ],
    "Qwen3-30B-A3B (LRU, Nunspark)": [(0.32, 0.84), (0.48, 0.94)],
    "Gemma-4-26B-A4B (slot LRU, oMLX PR 2595)": [(0.125, 0.45), (0.25, 0.67), (0.5, 0.89)],
    "512 experts top-10 (LRU, imp PR 2061)": [
        (0.06, 0.435),
        (0.12, 0.62),
        (0.18, 0.72),
        (0.24, 0.789),
        (0.33, 0.85),
    ],
    "Qwen3.5-397B (LRU sim., flash-moe)": [(0.03, 0.49), (0.06, 0.59), (0.125, 0.68), (0.25, 0.71)],
    "Qwen3-235B-A22B (LRU, Nunspark)": [(0.49, 0.845)],
    "gpt-oss-120b (LRU, Nunspark)": [(0.09, 0.47)],
    "OLMoE (LRU, colibri PR 1092)": [(0.25, 0.514)],
}
COLOURS = {"high": "tab:red", "medium": "tab:orange", "low": "tab:blue", "uniform": "tab:gray"}


def curves() -> dict[tuple[str, str], list[float]]:
    out = {}
    for profile in PROFILES:
        model = RoutingModel(profile, 128, 8, layers=16)
        for policy in ("lru", "pool"):
            out[profile, policy] = replay(model, SHARES, policy, tokens=2000, prompts=4)["hits"]
            print(f"[routing_plot] {profile} {policy}: done", file=sys.stderr, flush=True)
    return out


def plot(lines: dict[tuple[str, str], list[float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    for (profile, policy), hits in lines.items():
        style = "-" if policy == "lru" else ":"
        label = f"model: {profile}, " + ("per-layer LRU" if policy == "lru" else "pool LFU-aging")
        ax.plot(SHARES, hits, style, color=COLOURS[profile], label=label)
    markers = iter("osD^v<>Px")
    for name, points in PUBLISHED.items():
        xs, ys = zip(*points)
        ax.plot(xs, ys, next(markers), color="black", fillstyle="none", label=name, ms=7)
    ax.set_xlabel("cache: share of each layer's experts")
    ax.set_ylabel("routed experts found in the cache")
    ax.set_xlim(0, 0.78)
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right", ncol=2)
    ax.set_title("Routing profiles (issue 35) against published hit rates")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    print(path)


if __name__ == "__main__":
    out = (
        Path(sys.argv[1])
        if len(sys.argv) > 1
        else Path(__file__).parent / "results" / "routing-hits.png"
    )
    plot(curves(), out)
