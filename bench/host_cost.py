"""The host's work per MoE layer call on the synced read paths, in pieces and in operations.

    python bench/host_cost.py FOLDER [--read-path slots|mapped] [--budget BYTES] [--calls 400]
                              [--gathered]

Calls one streamed expert layer over and over on inputs already computed, evaluating each output
outside the timed call (so each call starts, as in a real decode, after compute: the pool's fence
finds nothing pending and the routing pull finds its indices ready). What is timed is then the
host's own work, which on a GPU or a Mac is time the GPU idles after each layer's sync: per call,
the total (`time.perf_counter_ns`), the engine's `ExpertTraffic` pieces (`sync`: the routing
pull, `place`: the slot pool's lookup and reads, or the mapped path's residency checks and hints;
`rest`: everything else in the layer), and under cProfile the Python function calls and the MLX
calls (`mlx.core` functions and array methods: each builds graph nodes or syncs) per layer call.
mlx-lm's own container on the same inputs is timed the same way: the difference is the engine's.

FOLDER: a repacked folder or an MLX download (in place). A narrow model makes compute small and
the host's work visible: `bench/generate_checkpoint.py narrow DIR --dtype float32` (128 experts,
top-8, hidden 512; float32 so the CPU computes on the pool itself, as a GPU does).
Routings come from `--routings` fixed draws (default 64, skewed), so after a warm-up a pool that
holds their experts only hits; `--fresh` draws a new routing for every call (misses too).
`--gathered`: the slot path's CUDA calls (no sync; the routing deferred to the pool's settles),
their kernel stood in for by MLX's own gathers from the pool (one graph node per tensor, as the
kernel's one call), so the host's work of a gathered call is timed on any backend.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import re
import tempfile
import time
from collections import Counter
from pathlib import Path

import mlx.core as mx
import numpy as np


def routings(num_experts: int, k: int, count: int, seed: int) -> list[mx.array]:
    """`count` routings of one token, skewed as bench/README.md's generated routers are."""
    rng = np.random.default_rng(seed)
    weights = np.exp(0.8 * rng.standard_normal(num_experts))
    p = weights / weights.sum()
    draws = [rng.choice(num_experts, k, replace=False, p=p) for _ in range(count)]
    out = [mx.array(d[None, None].astype(np.uint32)) for d in draws]
    mx.eval(out)
    return out


def timed(fn, inputs: list[mx.array], calls: int, evaluate: bool) -> np.ndarray:
    """Nanoseconds of each call of `fn(indices)`, wall and this thread's CPU time (steadier on a
    loaded machine), [calls, 2]. `evaluate`: each output is computed outside the timing, so each
    call starts on caches the compute flushed, as after a real decode's sync; else the outputs
    are dropped unevaluated and the calls run back to back on warm caches (the floor)."""
    ns = np.empty((calls, 2), dtype=np.int64)
    for i in range(calls):
        indices = inputs[i % len(inputs)]
        start, cpu = time.perf_counter_ns(), time.thread_time_ns()
        out = fn(indices)
        ns[i] = time.perf_counter_ns() - start, time.thread_time_ns() - cpu
        if evaluate:
            mx.eval(out)
    return ns


def operations(fn, inputs: list[mx.array], calls: int) -> dict:
    """Python function calls and MLX calls per call of `fn`, counted by cProfile."""
    first = fn(inputs[0])
    nodes = graph_nodes(first)  # before it is evaluated: an evaluated array has no graph
    mx.eval(first)
    profile = cProfile.Profile()
    for i in range(calls):
        indices = inputs[i % len(inputs)]
        profile.enable()
        out = fn(indices)
        profile.disable()
        mx.eval(out)
    stats = pstats.Stats(profile).stats
    top = sorted(((c[1], f"{Path(f).name}:{n}") for (f, _, n), c in stats.items()), reverse=True)
    return {
        "python_calls": sum(c[1] for c in stats.values()) / calls,
        "graph_nodes": nodes,
        "most_called": [f"{n / calls:.1f} {what}" for n, what in top[:12]],
    }


def graph_nodes(out: mx.array) -> dict[str, int]:
    """The MLX primitives of `out`'s graph (what the call left for the GPU to run), by name:
    cProfile does not see MLX's functions (nanobind), so they are counted here."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "graph.dot"
        mx.export_to_dot(str(path), out)
        labels = re.findall(r'label ="([^"]+)", shape=rectangle', path.read_text())
    return dict(sorted(Counter(labels).items()))


def stand_in_gather(pool, layer: int) -> tuple:
    """SlotPool.gather_source's (kernel, sources) with the kernel stood in for: each routed
    expert's slot from the table (a slot past the pool for none: clipped, the bytes are not the
    point), every tensor gathered from the pool's arrays."""

    def kernel(indices, table, sources, arrays):
        slots = mx.minimum(mx.take(table, indices.reshape(-1).astype(mx.uint32)), pool.slots - 1)
        return [mx.take(a, slots, axis=0) for a in arrays]

    return kernel, None


def main(argv: list[str] | None = None) -> dict:
    import streamer
    from streamer.experts.mapped import Prefetched

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--read-path", choices=("slots", "mapped"), default="slots")
    ap.add_argument("--budget", type=int, default=None, help="slot pool bytes (default: a quarter)")
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--routings", type=int, default=64)
    ap.add_argument("--fresh", action="store_true", help="a new routing every call")
    ap.add_argument("--gathered", action="store_true", help="CUDA's gathered calls, stood in for")
    ap.add_argument("--layer", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    probe, _ = streamer.load(args.folder, memory_budget=0, read_path=args.read_path)
    experts_bytes = sum(ly.read_bytes * ly.num_experts for ly in probe.streamer.layers)
    probe.streamer.close()
    budget = 0 if args.read_path == "mapped" else args.budget
    if budget is None:
        budget = experts_bytes // 4
    if args.gathered:
        from streamer.cache.slot_pool import SlotPool

        SlotPool.gather_source = stand_in_gather
    model, _ = streamer.load(args.folder, memory_budget=budget, read_path=args.read_path)
    layer = model.streamer.layers[args.layer]
    if args.read_path == "mapped":
        layer.compute_mode = Prefetched(layer, None)  # synced, as where files are not cached
    k = model.args.num_experts_per_tok
    count = args.calls if args.fresh else args.routings
    inputs = routings(layer.num_experts, k, count, args.seed)
    x = mx.random.normal((1, 1, model.args.hidden_size))
    mx.eval(x)

    def engine(indices: mx.array) -> mx.array:
        out = layer(x, indices)
        if layer.pool is not None and not evaluating:  # dropped unevaluated: nothing to fence
            layer.pool._pending.clear()
        return out

    result = {
        "folder": str(args.folder),
        "read_path": args.read_path,
        "budget": budget,
        "routed_per_call": k,
        "gathered": args.gathered,
    }
    evaluating = True
    for indices in inputs:  # warm-up: every routing once, the pool filled, caches warm
        mx.eval(engine(indices), layer.container(x, indices))
    traffic = model.streamer.stats._decode
    for evaluating, mode in ((True, ""), (False, "warm_")):
        container = timed(lambda i: layer.container(x, i), inputs, args.calls, evaluating)
        before = dict(vars(traffic))
        ns = timed(engine, inputs, args.calls, evaluating)
        moved = {key: vars(traffic)[key] - before[key] for key in before}
        for clock, at in (("", 0), ("cpu_", 1)):
            result[f"{mode}engine_{clock}us"] = float(np.median(ns[:, at])) / 1e3
            result[f"{mode}container_{clock}us"] = float(np.median(container[:, at])) / 1e3
            result[f"{mode}overhead_{clock}us"] = (
                result[f"{mode}engine_{clock}us"] - result[f"{mode}container_{clock}us"]
            )
        calls = moved["layer_calls"]
        for key, seconds in (("sync", "sync_seconds"), ("place", "read_seconds")):
            result[f"{mode}{key}_us"] = moved[seconds] / calls * 1e6
        rest = moved["layer_seconds"] - moved["sync_seconds"] - moved["read_seconds"]
        result[f"{mode}rest_us"] = rest / calls * 1e6
        result[f"{mode}hits_per_call"] = moved["cache_hits"] / calls
        result[f"{mode}misses_per_call"] = moved["experts_fetched"] / calls
    evaluating = True
    result["engine_ops"] = operations(engine, inputs, min(args.calls, 200))
    container_ops = operations(lambda i: layer.container(x, i), inputs, min(args.calls, 200))
    result["container_ops"] = {key: container_ops[key] for key in ("python_calls", "graph_nodes")}
    print(json.dumps(result, indent=1))
    model.streamer.close()
    return result


if __name__ == "__main__":
    main()
