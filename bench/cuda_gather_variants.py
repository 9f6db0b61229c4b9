"""Does the gather kernel's copy loop limit how fast misses cross the bus? (issue 35)

    python bench/cuda_gather_variants.py [--out OUT.json]      # MLX's CUDA backend only

The slot path's gather kernel (io/cuda_gather.py) reads a miss's bytes from the pinned, mapped
expert files over the bus in 16-byte words, GATHER_SHAPE's blocks of 256 threads per routed
expert and tensor, each thread loading that many words before it stores any. This builds the
kernel with other loop shapes (more or fewer blocks, more or fewer loads in flight)
over one page-locked buffer of 768 Qwen3-30B-A3B 4-bit expert records (2.65 MB, nine tensors),
and times 48 calls queued as a token's layers, then one eval (as decode queues them), for three
call shapes: a decode layer with 3 misses of 8 routed (the rest from pool slots), one with 8
misses, and 64 misses (a prompt's layer). Every call routes experts drawn afresh, so no read is
served twice from the GPU's L2. GB/s counts the misses' bytes only. Each variant's output is
checked bit for bit against the kernel as it ships.
"""

from __future__ import annotations

import argparse
import json
import time
from types import SimpleNamespace

import mlx.core as mx
import numpy as np

from streamer.io import cuda_gather
from streamer.io.cuda_runtime import CudaRuntime

EXPERTS = 768  # records in the buffer: 2 GB, larger than any cache between it and the GPU
CALLS = 48  # a token's MoE layers
ALIGNMENT = 16384  # of every record and tensor in the buffer, as in a repacked file
SHAPES = [((768, 256), mx.uint32), ((768, 32), mx.bfloat16), ((768, 32), mx.bfloat16)] * 2 + [
    ((2048, 96), mx.uint32),
    ((2048, 12), mx.bfloat16),
    ((2048, 12), mx.bfloat16),
]  # gate, up, down: weight, scales, biases
CALL_SHAPES = ((8, 3), (8, 8), (64, 64))  # (routed, misses)
SHIPPED = cuda_gather.GATHER_SHAPE


def gather_kernel(blocks: int, unroll: int, tensors: list) -> cuda_gather.ExpertGather:
    """The shipped kernel built with `blocks` per tensor and `unroll` loads in flight a thread."""
    return cuda_gather.ExpertGather(tensors, alignment=ALIGNMENT, shape=(blocks, unroll))


def use_shape(blocks: int, unroll: int, fill: bool = True) -> None:
    """For a whole engine run (`paired.py --setup "from cuda_gather_variants import use_shape;
    use_shape(64, 1)"`): every gather kernel built from now on takes the loop shape, and with
    `fill` every fill kernel too (without, the fill stays as shipped)."""
    cuda_gather.GATHER_SHAPE = (blocks, unroll)
    if fill:
        cuda_gather.FILL_SHAPE = (blocks, unroll)


def pinned_records(runtime: CudaRuntime, record: int) -> tuple[np.ndarray, int]:
    """EXPERTS records of distinct words, page-aligned, registered mapped; their device address."""
    buffer = np.empty(EXPERTS * record + ALIGNMENT, np.uint8)
    skip = (-buffer.ctypes.data) % ALIGNMENT
    view = buffer[skip : skip + EXPERTS * record]
    view.view(np.uint32)[:] = np.arange(view.size // 4, dtype=np.uint32)
    runtime.register(view.ctypes.data, view.size, mapped=True)
    return view, runtime.device_address(view.ctypes.data)


def pinned_experts(runtime: CudaRuntime) -> tuple[list, np.ndarray, mx.array, list[mx.array]]:
    """The gather kernel's inputs over pinned records: the tensors (SlotTensor's shape, dtype and
    nbytes), the records, `sources` (each tensor's device address in expert 0 and the stride)
    and a pool of 64 slots."""
    tensors = [
        SimpleNamespace(shape=s, dtype=d, nbytes=int(np.prod(s)) * d.size) for s, d in SHAPES
    ]
    offsets = np.cumsum([0] + [t.nbytes for t in tensors])
    record = int(offsets[-1])
    records, device = pinned_records(runtime, record)
    sources = mx.array(np.array([[device + int(o), record] for o in offsets[:-1]], np.uint64))
    pool = [mx.zeros((64, *t.shape), t.dtype) for t in tensors]
    mx.eval(sources, *pool)
    return tensors, records, sources, pool


def timed(kernel, sources, pool, rows: int, misses: int, rng, repeats: int) -> list[float]:
    """Seconds for CALLS queued calls, `repeats` times after one warm-up."""
    times = []
    for repeat in range(repeats + 1):
        calls = []
        for _ in range(CALLS):
            experts = rng.choice(EXPERTS, rows, replace=False).astype(np.uint32)
            table = np.full(EXPERTS, cuda_gather.NO_SLOT, np.uint32)
            table[experts[misses:]] = np.arange(rows - misses, dtype=np.uint32)
            calls.append((mx.array(experts), mx.array(table)))
        mx.eval(calls)
        start = time.perf_counter()
        mx.eval([kernel(experts, table, sources, pool) for experts, table in calls])
        if repeat:
            times.append(time.perf_counter() - start)
    return times


def same_bits(a: list[mx.array], b: list[mx.array]) -> bool:
    return all(mx.array_equal(x.view(mx.uint8), y.view(mx.uint8)).item() for x, y in zip(a, b))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--blocks", default="2,16,64,256", help="blocks per expert and tensor")
    ap.add_argument("--unroll", default="1,4,8", help="loads in flight per thread")
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--out")
    args = ap.parse_args()
    if not mx.cuda.is_available():
        raise SystemExit("cuda_gather_variants.py: needs MLX's CUDA backend (mlx-cuda)")
    runtime = CudaRuntime()
    tensors, records, sources, pool = pinned_experts(runtime)
    record = sum(t.nbytes for t in tensors)
    probe = (mx.arange(8, dtype=mx.uint32), mx.full((EXPERTS,), cuda_gather.NO_SLOT, mx.uint32))
    shipped = gather_kernel(*SHIPPED, tensors)(*probe, sources, pool)
    rng, results = np.random.default_rng(0), []
    for blocks in map(int, args.blocks.split(",")):
        for unroll in map(int, args.unroll.split(",")):
            kernel = gather_kernel(blocks, unroll, tensors)
            same = same_bits(kernel(*probe, sources, pool), shipped)
            for rows, misses in CALL_SHAPES:
                times = timed(kernel, sources, pool, rows, misses, rng, args.repeats)
                gb = CALLS * misses * record / 1e9
                row = {
                    "blocks": blocks,
                    "unroll": unroll,
                    "rows": rows,
                    "misses": misses,
                    "same_bits": same,
                    "median_ms": 1e3 * float(np.median(times)),
                    "gbps_median": gb / float(np.median(times)),
                    "gbps_best": gb / min(times),
                }
                results.append(row)
                print(
                    f"blocks {blocks:4d} unroll {unroll}  {misses:2d} of {rows:2d} missed: "
                    f"{row['gbps_median']:5.1f} GB/s median, {row['gbps_best']:5.1f} best"
                    f"{'' if same else '  (OUTPUT DIFFERS)'}",
                    flush=True,
                )
    runtime.unregister(records.ctypes.data)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"shipped": SHIPPED, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
