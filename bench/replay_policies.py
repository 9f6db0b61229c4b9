#!/usr/bin/env python3
"""Replay routing traces through expert-cache policies and print hit rates per budget.

A trace is an .npz with `experts`: int array [tokens, moe_layers, top_k] of routed expert ids
(tools/routing_summary.py --trace writes one from the trained demo model; streamer records one
with `model.streamer.stats.trace = []`). Budgets are fractions of all experts.

    python bench/replay_policies.py TRACE.npz [--budgets 0.05 0.1 0.25 0.5] [--json]
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from streamer.cache.policies import LRU, LFUAging, StaticLayers


def hit_rate(policy, experts: np.ndarray) -> float:
    hits = total = 0
    for token in experts:
        for layer, routed in enumerate(token):
            for expert in set(routed.tolist()):
                hits += policy.access((layer, expert))[0]
                total += 1
    return hits / max(total, 1)


def replay(experts: np.ndarray, num_experts: int, budgets: list[float]) -> list[dict]:
    layers = experts.shape[1]
    rows = []
    for fraction in budgets:
        slots = int(fraction * layers * num_experts)
        rows.append(
            {
                "budget_fraction": fraction,
                "slots": slots,
                "lru": hit_rate(LRU(slots), experts),
                "lfu-aging": hit_rate(LFUAging(slots), experts),
                "static-layers": hit_rate(StaticLayers(slots, num_experts), experts),
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--num-experts", type=int, help="experts per layer (default: from the trace)")
    ap.add_argument("--budgets", type=float, nargs="+", default=[0.05, 0.1, 0.25, 0.5])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    data = np.load(args.trace)
    experts = data["experts"]
    if args.num_experts:
        num_experts = args.num_experts
    else:
        num_experts = int(data["num_experts"]) if "num_experts" in data else int(experts.max()) + 1
    rows = replay(experts, num_experts, args.budgets)
    if args.json:
        print(json.dumps({"trace": args.trace, "tokens": len(experts), "rows": rows}))
        return
    print(
        f"{args.trace}: {len(experts)} tokens, {experts.shape[1]} MoE layers, "
        f"{num_experts} experts, top-{experts.shape[2]}"
    )
    print(f"{'budget':>8} {'slots':>7} {'LRU':>7} {'LFU-aging':>10} {'static layers':>14}")
    for r in rows:
        print(
            f"{r['budget_fraction']:>8.0%} {r['slots']:>7} {r['lru']:>7.1%} "
            f"{r['lfu-aging']:>10.1%} {r['static-layers']:>14.1%}"
        )


if __name__ == "__main__":
    main()
