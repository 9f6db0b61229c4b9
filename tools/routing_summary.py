"""How a MoE checkpoint routes real text: expert-use skew and token-to-token expert reuse.

    python tools/routing_summary.py        # the shipped demo model, held-out stdlib files
    python tools/routing_summary.py --model DIR --text FILE --trace trace.npz

Runs the model (mlx-lm, float32) over text in independent windows of --seq tokens and prints, per
MoE layer: the share of routed slots taken by the top 10% of experts, the entropy of expert use
(normalised: 1.0 = uniform), and the mean overlap |S_t & S_t+1| / k of the top-k sets of
consecutive tokens (a uniformly random router would give k / num_experts).

Trace file (--trace, numpy .npz) for replaying the routing in cache benchmarks:
    experts      int16 [tokens, layers, k]  routed expert ids, in token order (ids within a token
                                            are sorted; order carries no meaning)
    tokens       int32 [tokens]             the token ids
    window_start int64 [windows]            index of each window's first token; a new window starts
                                            with an empty KV cache, so reuse across its boundary is
                                            not meaningful
    num_experts  int64 scalar, top_k int64 scalar, layers int64 [layers] (model layer index of
                                            each MoE layer), model_type str scalar
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from streamer.cli import DEMO_MODEL
from streamer.families.architectures import (
    container_projections,
    expert_containers,
    recording_routing,
)
from streamer.routing_trace import routing_skew, top_tenth


def moe_layers(model: nn.Module) -> tuple[list[int], int]:
    """The model layer index of each MoE layer, and the number of experts per layer."""
    containers = expert_containers(model)
    first = next(iter(containers.values()))
    num_experts = first[container_projections(first)[0]].num_experts
    layer_of = [next(int(t) for t in path.split(".") if t.isdigit()) for path in containers]
    return layer_of, num_experts


def route(model: nn.Module, tokens: np.ndarray, seq: int) -> tuple[np.ndarray, np.ndarray, float]:
    """Routed experts [T, L, k] (sorted per token), window starts, and mean next-token cross
    entropy (nats)."""
    experts, starts, nll, count = [], [], 0.0, 0
    with recording_routing(model, prefill=True) as trace:
        for start in range(0, len(tokens) - 1, seq):
            window = tokens[start : start + seq + 1]
            if len(window) < 2:
                break
            x, y = mx.array(window[None, :-1]), mx.array(window[None, 1:])
            trace.clear()
            logits = model(x)
            nll += nn.losses.cross_entropy(logits, y, reduction="sum").item()
            count += y.size
            starts.append(start)
            by_layer: dict[int, list[tuple[int, ...]]] = {}
            for layer, routed in trace:
                by_layer.setdefault(layer, []).append(routed)
            experts.append(
                np.stack([np.array(r) for r in by_layer.values()], axis=1)
            )  # [len, L, k]
    routed = np.concatenate(experts).astype(np.int16)
    return routed, np.array(starts, dtype=np.int64), nll / count


def held_out_text() -> str:
    """The stdlib files tools/train_demo.py never trains on."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from demo_corpus import corpus_files

    _, val_files = corpus_files()
    return "\n".join(f.read_text(encoding="utf-8", errors="replace") for f in val_files)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--model", type=Path, default=DEMO_MODEL, help="Hugging Face or mlx-lm checkpoint folder"
    )
    ap.add_argument(
        "--text", type=Path, help="text file to route (default: the demo's held-out stdlib files)"
    )
    ap.add_argument("--max-tokens", type=int, default=20_000)
    ap.add_argument(
        "--seq",
        type=int,
        default=128,
        help="window length (tokens of context; the demo model trained on 128)",
    )
    ap.add_argument("--trace", type=Path, help="write the routed expert ids to this .npz")
    args = ap.parse_args(argv)

    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # long texts are windowed below
    from mlx_lm.utils import load

    model, tokenizer = load(str(args.model))
    model.set_dtype(mx.float32)  # the CPU backend's gather_mm is float32-only
    text = args.text.read_text(encoding="utf-8", errors="replace") if args.text else held_out_text()
    tokens = np.array(tokenizer.encode(text), dtype=np.int32)[: args.max_tokens + 1]
    layers, num_experts = moe_layers(model)
    routed, starts, loss = route(model, tokens, args.seq)
    top_k = routed.shape[-1]
    print(
        f"{args.model}: {len(routed):,} tokens in windows of {args.seq}, {num_experts} experts, "
        f"top-{top_k}"
    )
    print(f"cross entropy {loss:.3f} nats/token (perplexity {math.exp(loss):.1f})")
    top = top_tenth(num_experts)
    print(
        f"top 10% of experts = the {top} most used per layer; uniform-router baseline: "
        f"top-10% share {top / num_experts:.3f}, entropy 1.000, overlap {top_k / num_experts:.3f}"
    )
    header = ("layer", 5), ("top10%share", 11), ("entropy", 8), ("overlap", 8), ("max_share", 9)
    print(" ".join(f"{name:>{width}}" for name, width in (*header, ("unused", 6))))
    rows = []
    for j, index in enumerate(layers):
        s = routing_skew(routed[:, j], num_experts, starts)
        rows.append(s)
        print(
            f"{index:>5} {s['top10_share']:>11.3f} {s['entropy']:>8.3f} {s['overlap']:>8.3f} "
            f"{s['max_share']:>9.3f} {s['unused']:>6}"
        )
    mean = {key: np.mean([r[key] for r in rows]) for key in ("top10_share", "entropy", "overlap")}
    print(
        f"{'mean':>5} {mean['top10_share']:>11.3f} {mean['entropy']:>8.3f} {mean['overlap']:>8.3f}"
    )

    if args.trace:
        np.savez_compressed(
            args.trace,
            experts=routed,
            tokens=tokens[: len(routed)],
            window_start=starts,
            num_experts=np.int64(num_experts),
            top_k=np.int64(top_k),
            layers=np.array(layers, dtype=np.int64),
            model_type=np.array(model.model_type),
        )
        print(f"trace written to {args.trace}")


if __name__ == "__main__":
    main()
