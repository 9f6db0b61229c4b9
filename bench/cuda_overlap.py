"""Can a token's gathers move while its layers compute, on MLX's CUDA backend? (issue 35)

    python bench/cuda_overlap.py [--misses 3] [--work 12] [--out OUT.json]   # CUDA only

On an H100 a gathered token's step is a fixed part plus its misses' bytes at ~47 GB/s, one after
the other (bench/findings.md, seventh session): each layer's gather waits for the layer's router
and the layer's experts wait for it. Moving a layer's misses while the layer before it computes
(the next layer's experts guessed from its router on the current hidden state) could hide them,
if the GPU runs the gather beside that compute. Two ways could let it: MLX records a stream's
kernels into CUDA graphs whose edges are its arrays' (kernels nothing orders may run at once:
the sixth session's admission bug was two of them doing so), or a stream of the gathers' own.
Nothing measured either (the fourth session's fill on a stream of its own was no faster, and
why was not found). This times one token's shape of work, 48 layers, in five modes:

    compute     x = work(x); x = work(x)                  each half: attention, then experts
    gathers     the gathers alone, each after the one before
    now         x = work(x); x = depends(x, gather(routed(x, this layer))); x = work(x)
                (today's decode: a layer's experts wait for its own gather)
    early       x = work(x); x = depends(x, earlier); earlier = gather(routed(x, next layer));
                x = work(x)   (the next layer's gather issued before this layer's experts)
    early-side  the same, the gathers on a stream of their own

`hidden`: the share of the gathers' time an early mode takes off `now`'s step, (now - early) /
(now - compute): 1 is all of it. `--work` sets the ops a half layer runs (bf16 [1, dim] x
[dim, dim] matmuls and a tanh) and `--dim` their size: at 4096 each reads 32 MB (~11 us of
HBM), so the GPU's work, not the host's launches, sets the step, as in a gathered token on an
H100 (its step is the GPU's: bench/findings.md). Only the graph's evaluation is timed, not its
building. `--misses` sets the experts a layer reads over the bus (the rest of its 8 from pool
slots); `--blocks` and `--unroll` the gather kernel's loop shape (cuda_gather_variants.py).
The modes run interleaved, token by token. Measured on two H100s (bench/findings.md, eighth
session): `early` hid -0.25 to 0.19 of the gathers' time in eleven shapes, `early-side` cost
0.4-1.8 times it.
"""

from __future__ import annotations

import argparse
import json
import time

import mlx.core as mx
import numpy as np
from cuda_gather_variants import EXPERTS, SHIPPED, gather_kernel, pinned_experts

from streamer.io.cuda_gather import NO_SLOT
from streamer.io.cuda_runtime import CudaRuntime

LAYERS = 48
ROUTED = 8
SLOTS = 64  # pool slots: experts 0..63 are hits, the rest come over the bus
WEIGHTS = 8  # distinct [dim, dim] bf16 matrices (at 4096: 256 MB, more than the GPU's L2)
MODES = ("compute", "gathers", "now", "early", "early-side")


def routed(x: mx.array, misses: int, layer: int) -> mx.array:
    """ROUTED experts computed from x: `misses` of them without a slot, the rest in one. The
    misses are the token's `layer`-th: distinct records in every layer of a token (each layer
    reads its own file), so the GPU's L2 cannot serve one twice; they depend on x in the graph
    as a guess does, whatever x holds."""
    at = mx.argmax(x.reshape(-1)[:SLOTS]).astype(mx.uint32)
    first = layer * misses % (EXPERTS - SLOTS - misses)
    far = SLOTS + first + mx.arange(misses, dtype=mx.uint32) + (at - at)
    near = (at + mx.arange(ROUTED - misses, dtype=mx.uint32)) % SLOTS
    return mx.concatenate([far, near])


def token(x, weights, gather, mode: str, misses: int, work: int, on) -> mx.array:
    """One token's 48 layers of `mode` (the module's table), the gathers on stream `on`."""

    def half(x, layer):
        for i in range(work):
            x = mx.tanh(x @ weights[(layer * work + i) % len(weights)])
        return x

    earlier = None  # early modes: the gather issued a layer before, this layer's experts
    for layer in range(LAYERS):
        if mode != "gathers":
            x = half(x, 2 * layer)
        if mode != "compute":
            if earlier is not None:
                x = mx.depends([x], earlier)[0]
            ahead = mode.startswith("early")
            guess = routed(x, misses, layer + ahead)  # on the compute stream, as a router
            with mx.stream(on):
                earlier = gather(guess)
            if not ahead:  # now, gathers: what follows waits for this layer's own gather
                x, earlier = mx.depends([x], earlier)[0], None
        if mode != "gathers":
            x = half(x, 2 * layer + 1)
    return x if earlier is None else mx.depends([x], earlier)[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--misses", type=int, default=3, help="of a layer's 8 routed experts")
    ap.add_argument("--work", type=int, default=12, help="matmuls a half layer runs")
    ap.add_argument("--dim", type=int, default=4096, help="their size: each reads dim^2 bf16")
    ap.add_argument("--blocks", type=int, default=SHIPPED[0], help="the gather's per tensor")
    ap.add_argument("--unroll", type=int, default=SHIPPED[1], help="its loads in flight a thread")
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--out")
    args = ap.parse_args()
    if not mx.cuda.is_available():
        raise SystemExit("cuda_overlap.py: needs MLX's CUDA backend (mlx-cuda)")
    if not 0 <= args.misses <= ROUTED or args.work < 1 or args.dim < SLOTS:
        raise SystemExit(f"--misses 0..{ROUTED}, --work 1 or more, --dim {SLOTS} or more")
    runtime = CudaRuntime()
    tensors, records, sources, pool = pinned_experts(runtime)
    slot_of = np.where(np.arange(EXPERTS) < SLOTS, np.arange(EXPERTS), NO_SLOT)
    table = mx.array(slot_of.astype(np.uint32))
    kernel = gather_kernel(args.blocks, args.unroll, tensors)

    def gather(guess):
        return kernel(guess, table, sources, pool)

    shape = (args.dim, args.dim)
    weights = [mx.random.normal(shape, dtype=mx.bfloat16) * 0.02 for _ in range(WEIGHTS)]
    side, own = mx.new_stream(mx.gpu), mx.default_stream(mx.gpu)
    mx.eval(table, *weights)
    result = {"misses": args.misses, "work": args.work, "dim": args.dim, "layers": LAYERS}
    result |= {"blocks": args.blocks, "unroll": args.unroll}
    times: dict[str, list[float]] = {mode: [] for mode in MODES}
    for repeat in range(args.repeats + 2):  # two warm-ups: kernels compiled, graphs built
        for mode in MODES:  # interleaved: the GPU's clocks drift alike for every mode
            x = mx.random.normal((1, args.dim), dtype=mx.bfloat16, key=mx.random.key(repeat))
            mx.eval(x)
            on = side if mode == "early-side" else own
            out = token(x, weights, gather, mode, args.misses, args.work, on)  # the graph only
            start = time.perf_counter()  # what is timed: its kernels, encoded and run
            mx.eval(out)
            mx.synchronize()
            if repeat >= 2:
                times[mode].append(time.perf_counter() - start)
    for mode in MODES:
        result[f"{mode}_ms"] = 1e3 * float(np.median(times[mode]))
        print(f"{mode:10s} {result[f'{mode}_ms']:7.2f} ms a token (median of {len(times[mode])})")
    extra = result["now_ms"] - result["compute_ms"]
    for mode in ("early", "early-side"):
        result[f"hidden_{mode}"] = (result["now_ms"] - result[f"{mode}_ms"]) / max(extra, 1e-9)
    result["bus_mb_per_token"] = LAYERS * args.misses * sum(t.nbytes for t in tensors) / 1e6
    print(
        f"hidden: {result['hidden_early']:.2f} issued early, {result['hidden_early-side']:.2f} "
        f"on a stream of their own, of the {extra:.2f} ms the gathers add today "
        f"({result['bus_mb_per_token']:.0f} MB a token)"
    )
    runtime.unregister(records.ctypes.data)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
