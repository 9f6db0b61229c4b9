"""How fast a slot miss can reach a CUDA slot pool (issue 22): ways to move an expert's bytes
from a page-cached file into a managed-memory slot, timed side by side on one machine.

    python bench/cuda_miss_paths.py DIR [--file-gib 2] [--out OUT.json]

Each "token" moves K experts (2.65 MB Qwen3-30B-A3B 4-bit records, nine tensors each) from
random places of a file in DIR (written and read once first, so the page cache holds it) into
random slots of a managed pool, then runs one kernel over those slots, as decode would. Ways:
- staged-T: preadv in 512 KiB pieces by T threads into pinned staging (cudaHostAlloc), then one
  cudaMemcpyAsync per tensor and a stream sync (the slot path's CUDA landing today);
- register: the file's read-only mapping, each expert's page range cudaHostRegister'ed for its
  copies and unregistered after (the copy engine reads the page cache itself: no CPU copy);
- pinned-file: the same with the whole mapping registered once (its cost reported apart;
  load's cuda_misses="pinned");
- pageable: cudaMemcpyAsync straight from the unregistered mapping (the driver's own staging);
- gather-miss / gather-hit: no copy at all: the slot path's gather kernel (io/cuda_gather.py)
  reads the K experts over the bus from the whole file's mapping (registered mapped), or from
  K pool slots (the cost a hit adds to a decode layer), into a stack the expert kernel reads.
Needs MLX's CUDA backend (it loads the libcudart this uses). Prints a table; --out keeps JSON.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import mlx.core as mx
import numpy as np

from streamer.io.cuda_runtime import CudaRuntime

TENSORS = [786_432, 98_304, 98_304] * 3  # gate, up, down: weight, scales, biases
EXPERT = sum(TENSORS)
PIECE = 1 << 19
PAGE = mmap.PAGESIZE
READ_ONLY = 8  # cudaHostRegisterReadOnly
MAPPED = 2  # cudaHostRegisterMapped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--file-gib", type=float, default=2.0)
    parser.add_argument("--slots", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    assert mx.cuda.is_available(), "needs MLX's CUDA backend"
    path = expert_file(args.dir, int(args.file_gib * (1 << 30)) // EXPERT)
    experts = path.stat().st_size // EXPERT
    pool = mx.array(np.zeros((args.slots, EXPERT), np.uint8))  # managed memory, as the slot pool
    mx.eval(pool)
    rows = np.asarray(memoryview(pool))
    cuda = CudaRuntime()
    lib = cuda._lib
    lib.cudaHostRegister.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint]
    lib.cudaHostUnregister.argtypes = [ctypes.c_void_p]
    fd = os.open(path, os.O_RDONLY)
    mapping = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
    base = np.frombuffer(mapping, np.uint8).ctypes.data
    stream = cuda.new_stream()
    staging = [pinned(cuda, EXPERT) for _ in range(8)]
    streams = [cuda.new_stream() for _ in staging]
    results = []

    def copies(dst: int, src: int, s: int) -> None:
        at = 0
        for n in TENSORS:
            cuda.copy(dst + at, src + at, n, s)
            at += n

    def staged(threads: int):
        pool_threads = ThreadPoolExecutor(threads)

        def move(moves):
            for lo in range(0, len(moves), len(staging)):
                wave = list(enumerate(moves[lo : lo + len(staging)]))
                pieces = [
                    (staging[i][o : o + min(PIECE, EXPERT - o)], e * EXPERT + o)
                    for i, (e, _) in wave
                    for o in range(0, EXPERT, PIECE)
                ]
                list(pool_threads.map(lambda p: os.preadv(fd, [p[0]], p[1]), pieces))
                for i, (_, slot) in wave:
                    copies(rows[slot].ctypes.data, staging[i].ctypes.data, streams[i])
                for i, _ in wave:
                    cuda.wait(streams[i])

        return move

    def register(moves):
        for e, slot in moves:
            start = e * EXPERT // PAGE * PAGE
            end = -(-(e + 1) * EXPERT // PAGE) * PAGE
            cuda._check(lib.cudaHostRegister(base + start, end - start, READ_ONLY), "register")
            copies(rows[slot].ctypes.data, base + e * EXPERT, stream)
            cuda.wait(stream)
            cuda._check(lib.cudaHostUnregister(base + start), "unregister")

    def straight(moves):
        for e, slot in moves:
            copies(rows[slot].ctypes.data, base + e * EXPERT, stream)
        cuda.wait(stream)

    ways = [("staged-1", staged(1)), ("staged-8", staged(8)), ("register", register)]
    ways.append(("pageable", straight))
    rng = np.random.default_rng(0)
    for k in (1, 4, 16):
        for name, move in ways:
            results.append(timed(name, k, move, pool, rows, mapping, experts, args, rng))
            print(row(results[-1]), flush=True)
    t = time.perf_counter()
    flags = READ_ONLY | MAPPED
    cuda._check(lib.cudaHostRegister(base, len(mapping), flags), "register whole file")
    whole = time.perf_counter() - t
    print(f"registering the whole {len(mapping) / 2**30:.2f} GiB mapping: {whole:.3f} s")
    for k in (1, 4, 16):
        results.append(timed("pinned-file", k, straight, pool, rows, mapping, experts, args, rng))
        print(row(results[-1]), flush=True)
    for name, hits in (("gather-miss", False), ("gather-hit", True)):
        gather = gathered(cuda.device_address(base), pool, hits, mapping)
        for k in (1, 4, 8, 16):
            results.append(timed(name, k, gather, pool, rows, mapping, experts, args, rng))
            print(row(results[-1]), flush=True)
    cuda._check(lib.cudaHostUnregister(base), "unregister whole file")
    if args.out:
        args.out.write_text(json.dumps({"register_whole_s": whole, "rows": results}, indent=1))


def gathered(device_base: int, pool: mx.array, hits: bool, mapping: mmap.mmap):
    """A move that is the gather kernel: each (expert, slot) read from the file, or from its slot
    (`hits`: the slot's bytes stand for the expert's), into a fresh stack. It returns the stack's
    first tensor (the kernel that follows reads it) and a check of its last row's bytes."""
    from streamer.cache.slot_memory import SlotTensor
    from streamer.io.cuda_gather import NO_SLOT, ExpertGather

    tensors = [SlotTensor(f"t{i}", mx.uint8, (n,)) for i, n in enumerate(TENSORS)]
    kernel = ExpertGather(tensors, EXPERT)
    starts = np.cumsum([0] + TENSORS[:-1])
    sources = mx.array(np.array([[device_base + s, EXPERT] for s in starts], np.uint64))
    # per tensor its slots [slots, n], as a pool holds them
    views = [mx.contiguous(pool[:, s : s + n]) for s, n in zip(starts, TENSORS)]
    mx.eval(views)
    file = np.frombuffer(mapping, np.uint8)

    def move(moves):
        table = np.full(max(e for e, _ in moves) + 1, NO_SLOT, np.uint32)
        if hits:
            for e, s in moves:
                table[e] = s
        routed = mx.array(np.array([e for e, _ in moves], np.uint32))
        stack = kernel(routed, mx.array(table), sources, views)[0]
        e, s = moves[-1]
        want = np.array(views[0][s]) if hits else file[e * EXPERT : e * EXPERT + TENSORS[0]]
        return stack, lambda: np.array_equal(np.array(stack[-1]), want)

    return move


def timed(name, k, move, pool, rows, mapping, experts, args, rng) -> dict:
    host, token = [], []
    for i in range(args.tokens + 2):
        picks = zip(rng.choice(experts, k, replace=False), rng.choice(args.slots, k, False))
        moves = [(int(e), int(s)) for e, s in picks]
        t0 = time.perf_counter()
        moved = move(moves)
        t1 = time.perf_counter()
        if moved is None:  # the moves wrote the slots: the kernel reads them there
            stack, check = mx.take(pool, mx.array([s for _, s in moves]), axis=0), None
        else:  # the move was the gather kernel itself
            stack, check = moved
        mx.eval(stack.astype(mx.uint32).sum())
        t2 = time.perf_counter()
        if i >= 2:  # the first two warm the threads, streams and kernels
            host.append(t1 - t0)
            token.append(t2 - t0)
    e, s = moves[-1]
    if check is None:
        exact = bool(np.array_equal(rows[s], np.frombuffer(mapping, np.uint8, EXPERT, e * EXPERT)))
    else:
        exact = bool(check())
    ms = float(np.median(token if check else host)) * 1e3  # a gather's work is all on the GPU
    return {
        "way": name,
        "misses": k,
        "host_ms": ms,
        "token_ms": float(np.median(token)) * 1e3,
        "gb_s": k * EXPERT / ms / 1e6,
        "exact": exact,
    }


def row(r: dict) -> str:
    return (
        f"{r['way']:>12} K={r['misses']:>2}: {r['host_ms']:7.2f} ms host, {r['token_ms']:7.2f} ms "
        f"with the kernel, {r['gb_s']:5.1f} GB/s{'' if r['exact'] else '  WRONG BYTES'}"
    )


def pinned(cuda: CudaRuntime, nbytes: int) -> np.ndarray:
    address = cuda.host_alloc(nbytes)
    return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address))


def expert_file(folder: Path, experts: int) -> Path:
    """A file of `experts` records with distinct bytes, read once so the page cache holds it."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"miss-paths-{experts}.bin"
    if not path.exists() or path.stat().st_size != experts * EXPERT:
        rng = np.random.default_rng(1)
        with open(path, "wb") as f:
            for i in range(0, experts, 16):
                f.write(rng.bytes(min(16, experts - i) * EXPERT))
    with open(path, "rb") as f:
        while f.read(1 << 26):
            pass
    return path


if __name__ == "__main__":
    main()
