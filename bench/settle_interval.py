"""How often should a gathered slot pool settle? Misses of real routing replayed through the slot
policy, synced (every call places its experts) against settles every n tokens (issue 22).

    python bench/settle_interval.py                        # the trained demo model, held-out text
    python bench/settle_interval.py --budgets 0.125,0.25 --out settle-interval.json

On CUDA a decode call never syncs: the GPU takes each routed expert from its slot or, a miss, from
the file (io/cuda_gather.py), and the pool learns the calls' routing only when it settles (one
pull, cache/settle.py). Until then an expert that missed misses again on every call that routes
it. Here each prompt of held-out text runs through mlx-lm's model (prompt, then greedy decode),
its routing recorded, and replayed through one SlotLFU per run (the budget a share of all experts):
the prompt placed as the synced prompt pass places it, then the decode calls under each schedule.
A miss is a distinct routed expert without a slot when its call runs. Misses are what a schedule
costs in bus bytes; settles are what it costs in pulls (each waits for the GPU once).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_sampler
from mlx_lm.utils import load

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from routing_summary import held_out_text  # noqa: E402

from streamer.cache.policies import SlotLFU  # noqa: E402
from streamer.cache.settle import replay  # noqa: E402
from streamer.cli import DEMO_MODEL  # noqa: E402
from streamer.families.architectures import recording_routing  # noqa: E402

# name -> (tokens between settles, the first settle after the prompt first; tokens left for the
# next settle: 1 is the pool's own, SlotPool.settle_earlier_tokens, whose pull waits for nothing)
SCHEDULES = {
    "synced": (None, 0),
    "every 16": ([16], 0),
    "every 4": ([4], 0),
    "1, 2, 4, 8, 16": ([1, 2, 4, 8, 16], 0),
    "1, 2, 4, 8, 16, a token behind": ([1, 2, 4, 8, 16], 1),
}


def routed_run(model, tokenizer, text: str, decode: int) -> tuple[list, list]:
    """(the prompt's routing per layer: distinct experts, the decode steps' routing per token:
    per layer its distinct experts), from one greedy generation."""
    prompt = mx.array(tokenizer.encode(text))
    with recording_routing(model, prefill=True) as trace:
        steps = generate_step(prompt, model, max_tokens=decode, sampler=make_sampler(temp=0.0))
        for _ in steps:
            pass
    layers = 1 + max(layer for layer, _ in trace)
    prompt_calls = len(prompt) * layers
    prefill: list[set] = [set() for _ in range(layers)]
    for layer, experts in trace[:prompt_calls]:
        prefill[layer].update(experts)
    tokens = [trace[i : i + layers] for i in range(prompt_calls, len(trace), layers)]
    return [np.array(sorted(p)) for p in prefill], [
        [np.array(experts) for _, experts in token] for token in tokens
    ]


def misses_under(prefill, tokens, num_experts: int, slots: int, intervals, behind: int) -> dict:
    """Misses per decode token and settles of one schedule (`intervals` None: synced), each
    settle leaving the last `behind` tokens' calls deferred."""
    policy = SlotLFU(slots, len(prefill) * num_experts)
    base = {layer: layer * num_experts for layer in range(len(prefill))}  # the pool's keys
    for layer, experts in enumerate(prefill):  # in rounds of `slots`, as experts/slots.py runs
        for lo in range(0, len(experts), slots):
            policy.assign(base[layer] + experts[lo : lo + slots])
    schedule = list(intervals or [0])

    def interval() -> int:  # the schedule's next, its last repeated
        return schedule.pop(0) if len(schedule) > 1 else schedule[0]

    misses, settles, deferred, every = [], 0, [], interval()
    kept = behind * len(prefill)  # calls
    for token in tokens:
        missed = 0
        for layer, experts in enumerate(token):
            keys = base[layer] + experts
            if intervals is None:
                missed += int(np.count_nonzero(policy.assign(keys)[1]))
            else:
                missed += int(np.count_nonzero(policy.slot_of[keys] < 0))
                deferred.append((layer, experts))
        misses.append(missed)
        if intervals is not None and len(deferred) - kept >= every * len(prefill):
            cut = len(deferred) - kept  # settled before the next token's calls
            replay(policy, base, deferred[:cut])  # the pool's own settle, less its reads
            deferred, settles = deferred[cut:], settles + 1
            every = interval()
    return {"misses": misses, "settles": settles}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=DEMO_MODEL)
    ap.add_argument("--prompts", type=int, default=6, help="held-out windows, one run each")
    ap.add_argument("--prompt-chars", type=int, default=600)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--budgets", default="0.125,0.25", help="shares of all experts in the pool")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    model, tokenizer = load(str(args.model))
    model.set_dtype(mx.float32)
    config = json.loads((args.model / "config.json").read_text())
    num_experts = config.get("num_experts") or config["num_local_experts"]
    text = held_out_text()
    runs = []
    for p in range(args.prompts):
        start = p * len(text) // args.prompts
        runs.append(
            routed_run(model, tokenizer, text[start : start + args.prompt_chars], args.decode)
        )
    layers = len(runs[0][0])
    results = []
    for share in (float(b) for b in args.budgets.split(",")):
        slots = max(1, round(share * layers * num_experts))
        for name, (intervals, behind) in SCHEDULES.items():
            done = [misses_under(*run, num_experts, slots, intervals, behind) for run in runs]
            misses = np.array([d["misses"] for d in done], dtype=float)  # [runs, tokens]
            row = {
                "budget": share,
                "slots": slots,
                "schedule": name,
                "misses_first_16": float(misses[:, :16].sum(1).mean()),
                "misses_all": float(misses.sum(1).mean()),
                "settles": float(np.mean([d["settles"] for d in done])),
                "routed_per_token": float(np.mean([sum(map(len, t)) for r in runs for t in r[1]])),
            }
            results.append(row)
            print(
                f"budget {share:.1%} ({slots} slots) {name:>15}: misses in the first 16 tokens "
                f"{row['misses_first_16']:.1f}, in {args.decode} {row['misses_all']:.1f}, "
                f"settles {row['settles']:.1f}",
                flush=True,
            )
    if args.out:
        args.out.write_text(json.dumps({"model": str(args.model), "results": results}, indent=1))


if __name__ == "__main__":
    main()
