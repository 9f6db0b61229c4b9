"""The engine's own cost per MoE layer call, apart from compute, reads and waiting.

    python bench/overhead.py FOLDER [--calls 2000]

Calls one streamed expert layer of a repacked model over and over on inputs that are already
computed, without evaluating its output, so no kernel runs and the routing "sync" finds its
indices ready: what is left is the layer's Python, bookkeeping, residency checks and graph
building. mlx-lm's own container on the same inputs is timed the same way; the difference is
streamer's overhead. Each mode is timed on a warm CPU (the same call back to back), which is the
floor; in a real decode the first Python after each sync also runs on caches the compute has just
flushed, which is why `layer_overhead_ms_per_token` in bench/run.py results is larger (numbers in
bench/findings.md).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import mlx.core as mx
import numpy as np


def per_call(fn, calls: int) -> tuple[float, float]:
    """Seconds per call: wall, and this thread's CPU time (steadier on a loaded machine)."""
    for _ in range(128):  # every routing once: experts populated, caches warm
        fn()
    start, cpu = time.perf_counter(), time.thread_time()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls, (time.thread_time() - cpu) / calls


def main(argv: list[str] | None = None) -> dict:
    import streamer
    from streamer.experts.mapped import InPageCache, PageCacheWatch, Prefetched

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--layer", type=int, default=0, help="which MoE layer")
    args = ap.parse_args(argv)

    model, _ = streamer.load(args.folder, memory_budget=0)
    experts = model.streamer.layers[args.layer]
    num_experts = model.streamer.manifest.layers[args.layer].num_experts
    k = model.args.num_experts_per_tok
    rng = np.random.default_rng(0)
    x = mx.random.normal((1, 1, model.args.hidden_size))
    indices = [
        mx.array(np.sort(rng.choice(num_experts, k, replace=False))[None, None], dtype=mx.uint32)
        for _ in range(64)
    ]
    mx.eval(x, indices)
    calls = iter(range(1 << 62))

    def routed() -> mx.array:
        return indices[next(calls) % len(indices)]

    container = per_call(lambda: experts.container(x, routed()), args.calls)
    experts.compute_mode = Prefetched(experts, None)  # the synced path, as in a squeezed run
    synced = per_call(lambda: experts(x, routed()), args.calls)
    # asking the OS: the file was just read, so it is cached and the layer goes sync-free
    experts.compute_mode = Prefetched(experts, PageCacheWatch(experts))
    sync_free = per_call(lambda: experts(x, routed()), args.calls)
    model.streamer.stats.reset()
    result = {"folder": str(args.folder), "layer": args.layer}
    for clock, at in (("", 0), ("cpu_", 1)):  # wall, then thread CPU time
        result |= {
            f"mlx_lm_container_{clock}us": container[at] * 1e6,
            f"streamer_synced_{clock}us": synced[at] * 1e6,
            f"streamer_sync_free_{clock}us": sync_free[at] * 1e6,
            f"overhead_synced_{clock}us": (synced[at] - container[at]) * 1e6,
            f"overhead_sync_free_{clock}us": (sync_free[at] - container[at]) * 1e6,
        }
    result["file_cached"] = isinstance(experts.compute_mode, InPageCache)
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
