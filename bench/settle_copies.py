"""What a gathered slot pool's settles copy, against its misses, per routing profile and budget.

    python bench/settle_copies.py                                  # medium, uniform, high
    python bench/settle_copies.py --profiles uniform --budgets 0.125,0.5 --by-calls --json

On CUDA a gathered decode call reads each miss over the bus inside its gather kernel, and the
pool's settle (every 16 tokens) copies each expert that ended the replayed window with a new slot
into it while the host waits and the GPU idles (cache/settle.py, io/cuda_copy.py). On the H200 the
settles' time grew with the pool under low locality (bench/findings.md, issue 35). This replays
the routing model's traces (routing_model.py) through the pools a Qwen3-30B-A3B 4-bit model gets
at each budget (cache/budget.py layer_groups, one chunk a pool), each pool's SlotLFU and
`settle.replay` (SlotLFU.refresh), settling every `--settle` tokens from each prompt's first
token: per decode token the experts missed (read by the kernel) and copied (by the settles),
their bytes, and the host time of the settles' replays on this machine (a settle's main host
work, beside the pull). `--by-calls`: the settle before the refresh, each call's misses given
slots as a synced call's are (`SlotLFU.assign`). `--recent`: each layer's previous token's
experts are hits too, as if a region of top-k slots a layer, taken from the budget, kept them
(the reuse a settle every 16 tokens cannot catch; the region's copies are not counted).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from routing_model import QWEN3_30B_RECORD, RoutingModel

from streamer.cache.budget import layer_groups
from streamer.cache.policies import SlotLFU
from streamer.cache.settle import replay
from streamer.cache.slot_pool import CHUNK_BYTES

LARGEST_TENSOR = 786_432  # bytes of Qwen3-30B-A3B's gate_proj.weight (768 x 2048) at 4 bits


def by_calls(policy: SlotLFU, base: dict, calls: list) -> dict:
    """The settle before SlotLFU.refresh: each call's experts placed as `place` places a synced
    call's (every miss takes a slot, the coldest's); per layer the (expert, slot) moved."""
    before = policy.slot_key.copy()
    for layer, experts in calls:
        policy.assign(base[layer] + experts)
    reads: dict = {}
    for slot in np.flatnonzero((policy.slot_key != before) & (policy.slot_key >= 0)):
        layer = max(layer for layer, first in base.items() if first <= policy.slot_key[slot])
        reads.setdefault(layer, []).append((int(policy.slot_key[slot] - base[layer]), int(slot)))
    return reads


def pool_run(
    traces: list,
    first: int,
    end: int,
    slots: int,
    experts: int,
    settle: int,
    settles,
    recent: bool = False,
):
    """(misses, copies, seconds replaying) of one pool of `slots` over layers [first, end)
    through `traces`; `recent`: a layer's previous token's experts are hits too (held in a
    region of their own beside the pool)."""
    policy = SlotLFU(slots, (end - first) * experts)
    base = {layer: (layer - first) * experts for layer in range(first, end)}
    misses = copies = seconds = 0
    for trace in traces:  # [tokens, layers, k] per prompt
        calls = []
        for t in range(len(trace)):
            for layer in range(first, end):
                routed = np.unique(trace[t, layer])
                missed = policy.slot_of[base[layer] + routed] < 0
                if recent and t:
                    missed &= ~np.isin(routed, trace[t - 1, layer])
                misses += int(np.count_nonzero(missed))
                calls.append((layer, routed))
            if (t + 1) % settle == 0 or t + 1 == len(trace):
                start = time.perf_counter()
                reads = settles(policy, base, calls)
                seconds += time.perf_counter() - start
                copies += sum(len(moved) for moved in reads.values())
                calls = []
    return misses, copies, seconds


def run(profile: str, share: float, args) -> dict:
    model = RoutingModel(profile, args.experts, args.top_k, args.layers, args.seed)
    traces = model.prompts(args.tokens, args.prompts)
    # --recent: each layer's previous token's experts take top-k slots of the budget
    slots = (
        max(1, round(share * args.experts * args.layers)) - args.recent * args.top_k * args.layers
    )
    if slots < args.top_k:
        raise SystemExit(f"a budget of {share:g} leaves the pool no slots beside --recent's")
    misses = copies = seconds = 0
    for first, end, count in layer_groups(args.layers, slots, CHUNK_BYTES // LARGEST_TENSOR):
        m, c, s = pool_run(
            traces, first, end, count, args.experts, args.settle, args.settles, args.recent
        )
        misses, copies, seconds = misses + m, copies + c, seconds + s
    per = 1 / args.tokens
    return {
        "profile": profile,
        "share": share,
        "misses": misses * per,
        "copies": copies * per,
        "bus_mb": (misses + copies) * per * QWEN3_30B_RECORD / 1e6,
        "replay_ms": seconds * per * 1e3,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profiles", default="medium,uniform,high")
    ap.add_argument("--budgets", default="0.125,0.25,0.5", help="shares of all experts")
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--tokens", type=int, default=800, help="decode tokens in all")
    ap.add_argument("--prompts", type=int, default=2, help="a new working set per prompt")
    ap.add_argument("--settle", type=int, default=16, help="tokens between settles")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--by-calls",
        dest="settles",
        action="store_const",
        const=by_calls,
        default=replay,
        help="the settle as it was: each call's misses take slots",
    )
    ap.add_argument(
        "--recent",
        action="store_true",
        help="each layer's previous token's experts are hits too, their top-k slots taken from "
        "the pool",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = [
        run(profile, float(share), args)
        for profile in args.profiles.split(",")
        for share in args.budgets.split(",")
    ]
    if args.json:
        print(json.dumps({"rows": rows}))
        return
    print(
        "| profile | share | misses/token | settle copies/token | MB over the bus/token "
        "| replay host ms/token |"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['profile']} | {r['share']:.1%} | {r['misses']:.1f} | {r['copies']:.1f} | "
            f"{r['bus_mb']:.0f} | {r['replay_ms']:.2f} |"
        )


if __name__ == "__main__":
    main()
