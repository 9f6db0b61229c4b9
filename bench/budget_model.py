"""What slot budget maximises tokens/s, given the memory a run has beside its resident weights.

    python bench/budget_model.py trace DIR TRACE.npz [--tokens 600]    # record decode routing
    python bench/budget_model.py replay TRACE.npz [--json OUT]         # the model, per budget

`trace` decodes a generated checkpoint (bench/generate_checkpoint.py: the calibrated synthetic
routing; temperature 1) with mlx-lm and records every MoE layer's routed experts.

`replay` models the slot path's two levels on that routing: the pool (cache/policies.py SlotLFU,
the engine's own policy) of B bytes, and under it the page cache, an LRU over the pool's misses
(every pool read goes through it) holding whatever the run's memory leaves, F - B. F is "the
memory left": what a run has beyond its resident weights and KV cache, as a fraction of all
expert bytes. A routed expert costs nothing in the pool, a copy from the page cache at
COPY_GBPS, or a read from the SSD at the disk's rate; compute is the same at every budget, so
the budget that minimises read time per token maximises tokens/s. Bandwidths are published Mac
figures (shared/notes/prior-art.md): cached copies 9.3 GB/s; expert-sized preads 3 GB/s (older
SSDs) to 9.5 GB/s (M5 Pro, queue depth 1).
"""

from __future__ import annotations

import argparse
import json
from collections import OrderedDict
from pathlib import Path

import numpy as np

from streamer.cache.budget import SLOT_SHARE
from streamer.cache.policies import SlotLFU

COPY_GBPS = 9.3
DISK_GBPS = (3.0, 9.5)
ONE_LAYER = 1 / 48  # the slot path's old default: one layer's experts, of a 48-layer model
FRACTIONS = [0.0, ONE_LAYER] + [round(0.05 * i, 2) for i in range(1, 21)]  # of all expert bytes
MEMORY_LEFT = [0.1, 0.25, 0.5, 0.75, 0.9]  # F, as a share of all expert bytes
WARMUP = 100  # decode tokens replayed before counting: the pool and page cache start full


def record(folder: Path, out: Path, tokens: int) -> None:
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step
    from mlx_lm.sample_utils import make_sampler

    from streamer.families.architectures import recording_routing

    model, _ = load(str(folder))
    model.set_dtype(mx.float32)  # as streamer computes on the CPU: several times faster than bf16
    prompt = mx.array(np.random.default_rng(7).integers(4, 512, 32), dtype=mx.uint32)
    mx.random.seed(1)
    with recording_routing(model) as trace:  # decode steps only
        for _ in generate_step(prompt, model, max_tokens=tokens, sampler=make_sampler(temp=1.0)):
            pass
    layers = 1 + max(layer for layer, _ in trace)
    experts = np.array([e for _, e in trace]).reshape(-1, layers, len(trace[0][1]))
    np.savez(out, experts=experts, num_experts=model.args.num_experts)  # a qwen3_moe checkpoint


class PageCache:
    """An LRU of `capacity` experts: what the OS keeps of the files the pool reads."""

    def __init__(self, capacity: int):
        self.capacity, self.entries = capacity, OrderedDict()

    def read(self, key: int) -> bool:
        hit = key in self.entries
        if hit:
            self.entries.move_to_end(key)
        elif self.capacity > 0:
            self.entries[key] = None
            if len(self.entries) > self.capacity:
                self.entries.popitem(last=False)
        return hit


def two_levels(experts: np.ndarray, num_experts: int, pool: int, cache: int) -> dict:
    """Shares of routed experts found in the pool, in the page cache, and read from disk."""
    layers = experts.shape[1]
    policy = SlotLFU(max(pool, 1), layers * num_experts) if pool else None
    page_cache = PageCache(cache)
    found = np.zeros(3)  # pool, page cache, disk
    for step, token in enumerate(experts):
        for layer, routed in enumerate(token):
            keys = layer * num_experts + np.unique(routed)
            if policy is not None and len(keys) <= pool:
                _, miss = policy.assign(keys)
            else:
                miss = np.ones(len(keys), dtype=bool)
            cached = np.array([page_cache.read(int(k)) for k in keys[miss]], dtype=bool)
            if step >= WARMUP:
                found += (len(keys) - miss.sum(), cached.sum(), (~cached).sum())
    return dict(zip(("pool", "page_cache", "disk"), found / found.sum()))


def model(experts: np.ndarray, num_experts: int) -> list[dict]:
    """Per memory left and budget: where routed experts come from, and read seconds per routed
    expert byte at each disk rate (times the routed bytes per token: read time per token)."""
    total = experts.shape[1] * num_experts
    rows = []
    for left in MEMORY_LEFT:
        for fraction in [f for f in FRACTIONS if f <= left]:
            pool = int(fraction * total)
            shares = two_levels(experts, num_experts, pool, int(left * total) - pool)
            cost = {
                f"s_per_gb_disk_{disk:g}": shares["page_cache"] / COPY_GBPS + shares["disk"] / disk
                for disk in DISK_GBPS
            }
            rows.append({"memory_left": left, "budget": fraction, **shares, **cost})
    return rows


def compare(rows: list[dict], share: float) -> list[dict]:
    """Per memory left and disk rate: read seconds per routed GB at the old default (one layer's
    experts), at `share` of the memory left (the new default, where what is available is the
    memory left), and at the best budget."""
    out = []
    for left in MEMORY_LEFT:
        mine = {r["budget"]: r for r in rows if r["memory_left"] == left}
        new = min(mine, key=lambda b: abs(b - share * left))
        for disk in DISK_GBPS:
            key = f"s_per_gb_disk_{disk:g}"
            top = min(mine, key=lambda b: mine[b][key])
            out.append(
                {"memory_left": left, "disk_gbps": disk}
                | {
                    f"{name}_{field}": mine[b][field]
                    for name, b in (("old", ONE_LAYER), ("new", new), ("best", top))
                    for field in ("budget", "pool", key)
                }
            )
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    t = sub.add_parser("trace")
    t.add_argument("folder", type=Path)
    t.add_argument("out", type=Path)
    t.add_argument("--tokens", type=int, default=600)
    r = sub.add_parser("replay")
    r.add_argument("trace", type=Path)
    r.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.command == "trace":
        record(args.folder, args.out, args.tokens)
        return
    data = np.load(args.trace)
    rows = model(data["experts"], int(data["num_experts"]))
    summary = compare(rows, SLOT_SHARE)
    for c in summary:
        key = f"s_per_gb_disk_{c['disk_gbps']:g}"
        print(
            f"| {c['memory_left']:.0%} | {c['disk_gbps']:g} | "
            + " | ".join(
                f"{c[f'{n}_budget']:.0%}: {c[f'{n}_pool']:.0%} hits, {c[f'{n}_{key}'] * 1e3:.0f} ms"
                for n in ("old", "new", "best")
            )
            + " |"
        )
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "compare": summary}, indent=1))


if __name__ == "__main__":
    main()
