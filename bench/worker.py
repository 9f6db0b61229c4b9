"""One engine in one process: load a model, time generate_step runs, print one JSON object.

    python bench/worker.py streamer DIR   --prompt-tokens 32 --decode-tokens 32 --repeats 3
    python bench/worker.py mlx_lm   DIR   ...
    python bench/worker.py streamer DIR   --routing medium --decode-tokens 500 --repeats 2

`--routing PROFILE` replaces every MoE layer's router by the routing model's (profile_routing.py:
the same experts at the same (layer, position) in both engines); each run is a prompt of its own
(a new working set), and its first COLD_TOKENS decode tokens are reported apart ("cold": rate
and, for streamer, traffic) from the rest ("steady").

`streamer` loads a repacked folder with streamer.load (experts streamed); `mlx_lm` loads the MLX
checkpoint fully resident with mlx_lm.utils.load_model. Both compute in float32 on CPU and decode
greedily with mlx_lm.generate_step on the same token ids. Each engine runs in its own process so
peak RSS and peak MLX memory are its own. Progress goes to stderr, the JSON to stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from memory_sampler import MemorySampler
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_sampler
from pagecache import drop
from profile_routing import install
from routing_model import COLD_TOKENS, PROFILES
from routing_profile import routing_profile

from streamer.cache.landing import CUDA_MISSES
from streamer.loading.handle import streaming
from streamer.run_stats import peak_rss_bytes

ENGINES = ("streamer", "mlx_lm")


def load(
    engine: str,
    folder: Path,
    memory_budget: int,
    read_path: str | None,
    bypass: bool = False,
    cuda_misses: str | None = None,
    threads: int | None = None,
) -> nn.Module:
    from streamer.loading.backend import default_dtype

    if engine == "streamer":
        import streamer

        # float32 activations on CPU by default; budget 0 streams every expert through the page
        # cache (mapped) or a pool of one token's experts (slots)
        model, _ = streamer.load(
            folder,
            memory_budget=memory_budget,
            read_path=read_path,
            bypass_page_cache=bypass,
            cuda_misses=cuda_misses,
            threads=threads,
        )
        print(f"[streamer] {model.streamer.residency}", file=sys.stderr, flush=True)
        return model
    from mlx_lm.utils import load_model

    model, _ = load_model(folder)
    if default_dtype() is not None:  # as streamer computes: float32 on the CPU, stored on a GPU
        model.set_dtype(default_dtype())
    mx.eval(model.parameters())
    return model


def prompt_ids(n: int, seed: int = 0, vocab: int = 512) -> mx.array:
    """Token ids below the synthetic tokenizer's size, the same for both engines."""
    return mx.array(np.random.default_rng(seed).integers(4, vocab, n), dtype=mx.uint32)


def engine_stats(model: nn.Module):
    """streamer's ExpertStats; None for mlx-lm's model."""
    handle = streaming(model)
    return handle.stats if handle is not None else None


def traffic(model: nn.Module) -> dict | None:
    """streamer's counters (None for mlx-lm's model); decode's `settled_bytes` are the bytes the
    slot pools' settles wrote into slots since the load, in every phase (over the bus on CUDA;
    the stats are reset each run, this is not: take differences, as `steady` does)."""
    handle = streaming(model)
    if handle is None:
        return None
    stats = handle.stats
    settled = sum(pool.settled * pool.slot_bytes for pool in handle.pools)  # distinct pools
    return {
        "moe_layers": stats.moe_layers,
        "prefill": dataclasses.asdict(stats.prefill),
        "decode": {**dataclasses.asdict(stats.decode), "settled_bytes": settled},
    }


def tokens(model: nn.Module, prompt: mx.array, max_tokens: int, temp: float, seed: int = 0):
    """generate_step with a seeded sampler. Greedy decoding of a random model falls into short
    loops (the same few tokens, hence the same experts, over and over); temperature 1 does not."""
    mx.random.seed(seed)
    return generate_step(prompt, model, max_tokens=max_tokens, sampler=make_sampler(temp=temp))


def run_once(
    model: nn.Module,
    prompt: mx.array,
    decode_tokens: int,
    *,
    temp: float = 1.0,
    cold_decode: list | None = None,
) -> dict:
    """Time one generation: TTFT, then the decode rate over the remaining tokens, and over the
    first COLD_TOKENS of them ("cold") and the rest ("steady") apart."""
    stats = engine_stats(model)
    if stats is not None:
        stats.reset()
    times, cold, ids = [], None, []
    start = time.perf_counter()
    for token, _ in tokens(model, prompt, decode_tokens, temp):
        times.append(time.perf_counter())
        ids.append(int(token))
        if len(times) == 1:
            ttft = times[0] - start
        if len(times) == COLD_TOKENS + 1:
            cold = traffic(model)
        if len(times) == 1 and cold_decode is not None:
            drop(
                *cold_decode
            )  # decode starts cold too (the step after the first token is already read)
            if stats is not None:
                stats.reset()  # per-token figures then cover the decode steps after the drop
            times[0] = time.perf_counter()  # and the decode clock starts after the drop
    result = {
        "prompt_tokens": int(prompt.size),
        "ttft_s": ttft,
        "decode_tokens": len(times) - 1,
        "decode_s": times[-1] - times[0],
        "decode_tok_s": (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else None,
        # the tokens made: engines under the same routing and sampling must agree to the bit
        "tokens_sha1": hashlib.sha1(np.array(ids, dtype=np.int64).tobytes()).hexdigest(),
    }
    result["traffic"] = counts = traffic(model)
    if len(times) > COLD_TOKENS + 1:
        steady = counts and {k: v - cold["decode"][k] for k, v in counts["decode"].items()}
        result["cold"] = phase(times[: COLD_TOKENS + 1], cold and cold["decode"])
        result["steady"] = phase(times[COLD_TOKENS:], steady)
    return result


def phase(times: list[float], decode: dict | None) -> dict:
    """The decode rate over `times` (a step's end each), streamer's decode traffic and slot hits."""
    out = {
        "decode_tokens": len(times) - 1,
        "decode_tok_s": (len(times) - 1) / (times[-1] - times[0]),
        "median_step_s": float(np.median(np.diff(times))),  # robust to a loaded machine's spikes
    }
    if decode is not None:
        routed = decode["cache_hits"] + decode["experts_read"]
        out.update(decode=decode, hits=decode["cache_hits"] / routed if routed else None)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("engine", choices=ENGINES)
    ap.add_argument("model", type=Path)
    ap.add_argument(
        "--prompt-tokens",
        default="32",
        help="comma-separated prompt lengths, each run --repeats times",
    )
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--warmup", action="store_true", help="one untimed short run first")
    ap.add_argument(
        "--cold-decode", action="store_true", help="drop the expert files after the first token"
    )
    ap.add_argument(
        "--routing", choices=PROFILES, help="the routing model's profile in place of the routers"
    )
    ap.add_argument("--routing-seed", type=int, default=0, help="the routing model's seed")
    ap.add_argument(
        "--routing-steps",
        type=int,
        default=0,
        help="then profile routing over this many decode steps",
    )
    ap.add_argument(
        "--temp", type=float, default=1.0, help="sampling temperature (seeded; 0: greedy)"
    )
    ap.add_argument(
        "--keep-trace", action="store_true", help="put the routing run's trace in the result"
    )
    ap.add_argument(
        "--memory-budget", type=int, default=0, help="streamer: bytes of experts kept in memory"
    )
    ap.add_argument("--read-path", choices=["slots", "mapped"], help="streamer: default by backend")
    ap.add_argument("--bypass-page-cache", action="store_true", help="streamer slots: O_DIRECT")
    ap.add_argument("--pool-policy", choices=["lfu", "lru"], help="streamer slots: SlotLRU for lru")
    ap.add_argument(
        "--cuda-misses",
        choices=CUDA_MISSES,
        help="streamer slots on CUDA: where a miss's bytes come from (load's cuda_misses; "
        "default gathered, cache/landing.py)",
    )
    ap.add_argument(
        "--threads", type=int, help="streamer: the CPU cores its matmuls are cut across (all)"
    )
    ap.add_argument(
        "--profile", action="store_true", help="streamer: time each layer's expert compute (a sync)"
    )
    args = ap.parse_args(argv)

    sampler = MemorySampler()
    start = time.perf_counter()
    model = load(
        args.engine,
        args.model,
        args.memory_budget,
        args.read_path,
        args.bypass_page_cache,
        args.cuda_misses,
        args.threads,
    )
    load_s = time.perf_counter() - start
    if args.profile:
        engine_stats(model).profile = True
    positions = install(model, args.routing, args.routing_seed) if args.routing else None
    if args.pool_policy == "lru":  # before any call: the pools are empty
        from streamer.cache.policies import SlotLRU

        for pool in streaming(model).pools:
            pool.policy = SlotLRU(pool.slots, len(pool.policy.slot_of))

    def prompt(n: int, index: int) -> mx.array:
        """Prompt `index` of n tokens; with --routing, its routing starts (enough positions for
        every forward pass of the run)."""
        if positions is not None:
            positions.start(index, n + args.decode_tokens + 2)
        return prompt_ids(n, seed=index if positions is not None else 0)

    print(f"[{args.engine}] loaded in {load_s:.1f} s", file=sys.stderr, flush=True)
    cold = None
    if args.cold_decode:
        handle = streaming(model)
        # the files the experts are read from: a repack's expert files, or a download's shards
        cold = [handle.expert_paths, handle.evict]
    if args.warmup:
        run_once(model, prompt(8, 10_000), 4, temp=args.temp)  # a prompt of its own
    runs = []
    for n in [int(x) for x in args.prompt_tokens.split(",")]:
        for _ in range(args.repeats):
            run = run_once(
                model, prompt(n, len(runs)), args.decode_tokens, temp=args.temp, cold_decode=cold
            )
            runs.append(run)
            rate = run["decode_tok_s"] or 0.0
            print(
                f"[{args.engine}] prompt {n}: ttft {run['ttft_s']:.2f} s, decode {rate:.2f} tok/s",
                file=sys.stderr,
                flush=True,
            )
    result = {"engine": args.engine, "load_s": load_s, "runs": runs, "routing_model": args.routing}
    if streaming(model) is not None:  # the cores its matmuls ran on, as the load decided them
        result["threads"] = streaming(model).threads
    if args.routing_steps:
        config = json.loads((args.model / "config.json").read_text())
        num_experts = config.get("num_experts") or config["num_local_experts"]
        if positions is not None:
            positions.start(20_000, 32 + args.routing_steps + 2)
        steps = tokens(model, prompt_ids(32, seed=7), args.routing_steps, args.temp, seed=1)
        result["routing"] = routing_profile(model, steps, num_experts, args.keep_trace)
    sampler.stop()
    result.update(
        peak_rss_bytes=peak_rss_bytes(),
        peak_rss_anon_bytes=sampler.peak_anon or None,
        peak_rss_file_bytes=sampler.peak_file or None,
        # the mapped expert files count as MLX memory but are page cache: not the engine's own
        peak_mlx_bytes=mx.get_peak_memory()
        - (handle.mapped_mlx_bytes if (handle := streaming(model)) else 0),
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
