"""mlx-lm resident and streamer in one process, prompt by prompt: ratios a noisy machine keeps.

    python bench/paired.py MLX_DIR REPACKED --routing medium --memory-budget BYTES \
        [--pairs 6] [--prompt-tokens 16] [--decode-tokens 128] [--cuda-misses gathered] \
        [--setup CODE] [--bus-gbps GBPS] > OUT.json

On lent GPU machines mlx-lm's own steady rate moved 1.9x between runs of one call (its median
step 10.4 to 19.7 ms, bench/findings.md), more than the differences worth deciding, and a
ratio taken across two processes minutes apart carries all of it. Here both engines are loaded
once, in one process, each with its own routing model's gates (profile_routing.py: the same
experts at the same positions), and run the same prompts in turn, ABBA (mlx-lm first on even
prompts, streamer first on odd ones), so a slow minute falls on both sides of a pair. Each
pair's ratio is streamer's steady rate over mlx-lm's (tokens past the first COLD_TOKENS; the
median step's ratio beside it), and the summary is the median pair and the spread. The tokens
must agree in every pair: greedy by default, the same token ids and routing. Beside it, the
bus floor (on CUDA, where misses and settle copies cross the bus): mlx-lm's step over that step
plus streamer's bytes a token at the bus's rate (--bus-gbps, else BUS_GBPS), with no overlap, and
`to_floor`, the step ratio over it (1: the token costs mlx-lm's plus its bytes; above 1, reads
overlapped other work). Beside it, `kernel_gbps`: the gather kernel's rate alone on this machine
(`bus_rate`), which is not the floor's: a lone call reads slower than a token's bytes cost
within its layers (bench/step_bytes_plot.py fits that marginal rate from the pairs).

`--setup CODE` runs Python before the models load (a variant: a constant of the tree changed,
as `bash bench/cuda_goals.sh variant` does). Progress goes to stderr, the JSON to stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
from profile_routing import install
from routing_model import COLD_TOKENS, PROFILES
from worker import load, prompt_ids, run_once

from streamer.cache.landing import CUDA_MISSES
from streamer.io.cuda_gather import NO_SLOT
from streamer.loading.handle import streaming

ENGINES = ("mlx_lm", "streamer")
# The bus's rate for a token's misses and settle copies, GB/s: what a megabyte more a token cost
# decode's step on H100s, 42 GB/s (bench/findings.md, "The bus, measured at 12.5%") and 46.8
# (seventh session: bench/step_bytes_plot.py over the paired runs of three profiles)
BUS_GBPS = 45.0


def bus_rate(model, experts: int = 64, repeats: int = 4) -> float | None:
    """GB/s at which the gather kernel reads experts from the pinned files (a table naming no
    slot: every row from the files), best of `repeats` on the first gathered layer: one call
    alone on this machine's bus. None where no layer gathers (the CPU)."""
    for pool in streaming(model).pools:  # each pool once
        for layer, source in pool.layers.items():
            gather = pool.gather_source(layer)
            if gather is None:
                continue
            kernel, sources = gather
            routed = mx.arange(min(experts, source.num_experts), dtype=mx.uint32)
            table = mx.full((source.num_experts,), NO_SLOT, dtype=mx.uint32)
            best = float("inf")
            for _ in range(repeats):  # the first compiles the kernel
                mx.eval(routed, table)
                start = time.perf_counter()
                mx.eval(kernel(routed, table, sources, pool.arrays))
                best = min(best, time.perf_counter() - start)
            return routed.size * pool.slot_bytes / best / 1e9
    return None


def pair_order(index: int) -> tuple[str, str]:
    """ABBA: mlx-lm first on even prompts, streamer first on odd ones."""
    return ENGINES if index % 2 == 0 else ENGINES[::-1]


def summary(pairs: list[dict]) -> dict:
    """The median pair's ratios and their spread, and whether every pair made the same tokens."""
    rate = [p["ratio"] for p in pairs]
    step = [p["step_ratio"] for p in pairs]
    return {
        "pairs": len(pairs),
        "ratio_median": float(np.median(rate)),
        "ratio_range": [min(rate), max(rate)],
        "step_ratio_median": float(np.median(step)),  # mlx-lm's median step over streamer's
        # the step ratio over the best one the bytes allow (1: at the bus floor)
        "to_floor_median": float(np.median([p["to_floor"] for p in pairs])),
        "same_tokens": all(p["same_tokens"] for p in pairs),
    }


def pair(runs: dict[str, dict], bus_gbps: float = BUS_GBPS) -> dict:
    """One prompt's two runs (in the order they ran), reduced to what the ratio needs; the bus
    floor: mlx-lm's step plus streamer's steady bytes a token (misses read, settles' copies) at
    `bus_gbps`, with no overlap, over mlx-lm's step."""
    ours, theirs = runs["streamer"]["steady"], runs["mlx_lm"]["steady"]
    moved = ours["decode"]["bytes_read"] + ours["decode"]["settled_bytes"]
    per_token = moved / ours["decode_tokens"]
    floor = theirs["median_step_s"] / (theirs["median_step_s"] + per_token / (bus_gbps * 1e9))
    step_ratio = theirs["median_step_s"] / ours["median_step_s"]
    return {
        "first": next(iter(runs)),
        "mlx_lm_tok_s": theirs["decode_tok_s"],
        "streamer_tok_s": ours["decode_tok_s"],
        "mlx_lm_step_ms": theirs["median_step_s"] * 1e3,
        "streamer_step_ms": ours["median_step_s"] * 1e3,
        "hits": ours.get("hits"),
        "ratio": ours["decode_tok_s"] / theirs["decode_tok_s"],
        "step_ratio": step_ratio,
        "bus_mb_per_token": per_token / 1e6,
        "floor_ratio": floor,
        "to_floor": step_ratio / floor,
        "same_tokens": runs["streamer"]["tokens_sha1"] == runs["mlx_lm"]["tokens_sha1"],
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mlx_model", type=Path, help="the MLX checkpoint mlx-lm loads resident")
    ap.add_argument("repacked", type=Path, help="the same checkpoint repacked, streamer's")
    ap.add_argument("--routing", choices=PROFILES, required=True)
    ap.add_argument("--memory-budget", type=int, required=True, help="streamer's, in bytes")
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--temp", type=float, default=0.0, help="0: greedy")
    ap.add_argument("--read-path", choices=["slots", "mapped"], default="slots")
    ap.add_argument("--cuda-misses", choices=CUDA_MISSES)
    ap.add_argument("--setup", default="", help="Python run before the models load")
    ap.add_argument("--bus-gbps", type=float, help=f"for the bus floor (default {BUS_GBPS})")
    args = ap.parse_args(argv)
    bus_gbps = BUS_GBPS if args.bus_gbps is None else args.bus_gbps
    if args.decode_tokens <= COLD_TOKENS + 1 or args.pairs < 1 or not bus_gbps > 0:
        raise SystemExit(
            f"--decode-tokens must pass {COLD_TOKENS + 1} (the cold start), --pairs 1+,"
            " --bus-gbps above 0"
        )
    exec(args.setup, {})  # a variant of the tree, as `cuda_goals.sh variant` runs them
    folders = {"mlx_lm": args.mlx_model, "streamer": args.repacked}
    models, positions = {}, {}
    for engine in ENGINES:
        models[engine] = load(
            engine,
            folders[engine],
            args.memory_budget,
            args.read_path,
            cuda_misses=args.cuda_misses,
        )
        positions[engine] = install(models[engine], args.routing)
    length = args.prompt_tokens + args.decode_tokens + 2  # positions a prompt's run takes
    kernel_gbps = bus_rate(models["streamer"])

    def run(engine: str, index: int, decode: int) -> dict:
        positions[engine].start(index, length)
        prompt = prompt_ids(args.prompt_tokens, seed=index)
        return run_once(models[engine], prompt, decode, temp=args.temp)

    for engine in ENGINES:  # warm-up: kernels compiled, pools touched, a prompt of its own
        run(engine, 10_000, 4)
    pairs = []
    for index in range(args.pairs):
        runs = {engine: run(engine, index, args.decode_tokens) for engine in pair_order(index)}
        pairs.append(pair(runs, bus_gbps))
        p = pairs[-1]
        print(
            f"pair {index}: mlx-lm {p['mlx_lm_tok_s']:.1f} tok/s, streamer "
            f"{p['streamer_tok_s']:.1f}: {p['ratio']:.2f}x ({p['to_floor']:.2f} of the bus floor"
            f" {p['floor_ratio']:.2f}, {p['bus_mb_per_token']:.0f} MB a token)"
            + ("" if p["same_tokens"] else " (tokens differ)"),
            file=sys.stderr,
            flush=True,
        )
    result = {"routing": args.routing, "memory_budget": args.memory_budget, "setup": args.setup}
    result.update(bus_gbps=bus_gbps, kernel_gbps=kernel_gbps)
    result.update(summary=summary(pairs), pairs=pairs)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
