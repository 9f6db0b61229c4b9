"""Would `streamer serve` gain from decoding two requests in one batch? Expert bytes and time per
token, two sequences decoded one after the other against the same two decoded side by side.

    python bench/batching.py [--model DIR] [--tokens 64] [--budget 0] [--read-path mapped] [--cold]

A batched step computes the union of its sequences' routed experts, so what batching saves in
expert reads is the overlap of two different sequences' routing at the same step. The default
model is the built-in demo (trained: real routing, 4 of 32 experts), repacked. Prints per mode:
decode tokens/s, routed experts and expert MB read per token, host syncs per token, and tokens/s
per expert MB read per token. `--cold` drops the expert files from the page cache before every
decode step (bench/pagecache.py; the drop is not timed), so that each step's misses come from the
disk, as they do for a model larger than memory; bench/README.md ("Batching") has the results.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from demo import add_model_option, model_or_demo

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PROMPTS = (  # two unrelated continuations, cut to one length: the batch needs no padding
    "import os\nimport sys\n\ndef main(argv):\n    parser = argparse.ArgumentParser()\n",
    'class Reader:\n    """Read records from a file."""\n\n    def __init__(self, path):\n',
)


def traffic(model):
    stats = model.streamer.stats
    return [stats.prefill, stats.decode]


def empty_pools(model) -> None:
    """The slot path's pools emptied (a fresh LFU over the same keys): each decode starts with
    nothing cached, so neither mode inherits experts the other one read."""
    from streamer.cache.policies import SlotLFU

    for pool in model.streamer.pools:
        pool.fence()
        old = pool.policy
        pool.policy = SlotLFU(pool.slots, len(old.counts), old.half_life)


def decode(model, prompts, tokens: int, cold: list[Path] = ()) -> dict:
    """Greedy decode of `prompts` (a [B, L] array) for `tokens` steps from empty slot pools:
    seconds, experts, bytes, syncs over the decode steps alone; `cold`: expert files dropped from
    the page cache before every step (the drop itself not timed)."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    from bench.pagecache import drop

    mapped = model.streamer.files
    empty_pools(model)
    cache = make_prompt_cache(model)
    logits = model(prompts, cache=cache)
    token = mx.argmax(logits[:, -1, :], axis=-1, keepdims=True)
    mx.eval(token)
    before = [(t.experts_read, t.bytes_read, t.syncs) for t in traffic(model)]
    seconds = 0.0
    for _ in range(tokens):
        if cold:
            drop(cold, evict=mapped.evict if mapped is not None else None)
        start = time.perf_counter()
        logits = model(token, cache=cache)
        token = mx.argmax(logits[:, -1, :], axis=-1, keepdims=True)
        mx.eval(token)
        seconds += time.perf_counter() - start
    after = [(t.experts_read, t.bytes_read, t.syncs) for t in traffic(model)]
    delta = [sum(a[i] - b[i] for a, b in zip(after, before)) for i in range(3)]
    return {"seconds": seconds, "experts": delta[0], "bytes": delta[1], "syncs": delta[2]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_option(ap)
    ap.add_argument("--tokens", type=int, default=64, help="decode steps per sequence")
    ap.add_argument("--budget", default="0", help="memory budget (0: every expert streams)")
    ap.add_argument("--read-path", choices=["mapped", "slots"], default=None)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cold", action="store_true", help="drop the expert files before each step")
    args = ap.parse_args()

    import mlx.core as mx

    import streamer

    with tempfile.TemporaryDirectory() as tmp:
        folder = model_or_demo(args.model, Path(tmp))
        model, tokenizer = streamer.load(
            folder, memory_budget=args.budget, read_path=args.read_path
        )
        print(f"[bench] {model.streamer.residency}", file=sys.stderr)
        ids = [tokenizer.encode(p) for p in PROMPTS]
        length = min(len(i) for i in ids)
        both = mx.array([i[:length] for i in ids])
        decode(model, both[:1], 4)  # warm the page cache and MLX's kernels
        cold = sorted(Path(folder).glob("experts/*.bin")) if args.cold else []
        rows = {"one at a time": [], "batch of 2": []}
        for _ in range(args.repeats):
            single = [decode(model, both[i : i + 1], args.tokens, cold) for i in range(2)]
            rows["one at a time"].append({k: single[0][k] + single[1][k] for k in single[0]})
            rows["batch of 2"].append(decode(model, both, args.tokens, cold))
        print(
            f"prompt {length} tokens, {args.tokens} decode steps per sequence, 2 sequences, "
            f"{'cold (files dropped before each step)' if args.cold else 'warm page cache'}"
        )
        print("| mode | tok/s | experts/tok | expert MB/tok | syncs/tok | tok/s per MB/tok |")
        print("|---|---|---|---|---|---|")
        tokens = 2 * args.tokens
        for name, runs in rows.items():
            best = min(runs, key=lambda r: r["seconds"])
            tps = tokens / best["seconds"]
            mb = best["bytes"] / tokens / 1e6
            print(
                f"| {name} | {tps:.1f} | {best['experts'] / tokens:.2f} | {mb:.4f} | "
                f"{best['syncs'] / tokens:.2f} | {tps / mb if mb else float('nan'):.3g} |"
            )
        model.streamer.close()


if __name__ == "__main__":
    main()
