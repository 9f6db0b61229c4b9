"""Page-cache control for the benchmark: drop, warm and measure files, and measure the disk.

Dropping uses posix_fadvise(POSIX_FADV_DONTNEED), which Linux honours per file without root. It
skips pages that some process still maps, so a process that has mapped a file must unmap (or
madvise(MADV_DONTNEED)) its pages first: see `drop(..., mappings=)`. macOS has no fadvise: see
bench/README.md for its equivalents.
"""

from __future__ import annotations

import mmap
import os
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from streamer.cache.residency import Residency

CHUNK = 8 << 20


def drop(paths: Iterable[Path], mappings: Iterable[mmap.mmap] = ()) -> None:
    """Evict `paths` from the page cache (pages in `mappings` are unmapped from this process first)."""
    if not hasattr(os, "posix_fadvise"):
        raise NotImplementedError("dropping the page cache per file needs posix_fadvise (Linux); see bench/README.md")
    for mm in mappings:
        mm.madvise(mmap.MADV_DONTNEED)
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def warm(paths: list[Path], log: Callable[[str], None] = lambda _: None) -> None:
    """Read every byte of `paths` once so the page cache holds them (if memory allows)."""
    buf = bytearray(CHUNK)
    total = sum(p.stat().st_size for p in paths)
    done, start = 0, time.perf_counter()
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while n := f.readinto(buf):
                done += n
        log(f"[warm] {done / 1e9:.2f}/{total / 1e9:.2f} GB ({done / max(time.perf_counter() - start, 1e-9) / 1e9:.2f} GB/s)")


def resident_fraction(paths: list[Path]) -> float | None:
    """Share of the bytes of `paths` that are in the page cache (mincore); None if unknown."""
    total = resident = 0
    for path in paths:
        size = path.stat().st_size
        if size == 0:
            continue
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            residency = Residency(mm, size)  # the whole file as one record
            r = residency.resident_bytes(0)
            del residency
        if r is None:
            return None
        total += size
        resident += r
    return resident / total if total else None


def disk_bandwidth(paths: list[Path], record_bytes: int, *, concurrency: int = 1, budget: int = 256 << 20,
                   seed: int = 0) -> dict:
    """Cold read bandwidth of expert-sized records at random record offsets of `paths`.

    The records are dropped from the page cache first, then read with `concurrency` threads, by
    pread (what a pread engine does) and, single-threaded, by copying out of an mmap (what a
    page-faulting engine does). The records read are left dropped.
    """
    rng = random.Random(seed)
    slots = [(p, i * record_bytes) for p in paths for i in range(p.stat().st_size // record_bytes)]
    count = max(2, min(len(slots), budget // record_bytes))
    picked = rng.sample(slots, count)
    half = count // 2
    drop(paths)
    pread_gbps = _pread(picked[:half], record_bytes, concurrency)
    mmap_gbps = _mmap_copy(picked[half:], record_bytes)
    drop(paths)
    return {
        "pread_gbps": pread_gbps,
        "mmap_copy_gbps": mmap_gbps,
        "record_bytes": record_bytes,
        "concurrency": concurrency,
        "bytes_per_method": half * record_bytes,
    }


def _pread(picked: list[tuple[Path, int]], record_bytes: int, concurrency: int) -> float:
    fds = {p: os.open(p, os.O_RDONLY) for p in {p for p, _ in picked}}
    buffers = [bytearray(record_bytes) for _ in range(concurrency)]

    def read(job: tuple[int, tuple[Path, int]]) -> int:
        i, (path, offset) = job
        return os.preadv(fds[path], [buffers[i % concurrency]], offset)

    try:
        start = time.perf_counter()
        if concurrency == 1:
            n = sum(map(read, enumerate(picked)))
        else:  # buffer i % concurrency is only ever used by one in-flight read at a time
            with ThreadPoolExecutor(concurrency) as pool:
                n = sum(pool.map(read, enumerate(picked), chunksize=1))
        return n / (time.perf_counter() - start) / 1e9
    finally:
        for fd in fds.values():
            os.close(fd)


def _mmap_copy(picked: list[tuple[Path, int]], record_bytes: int) -> float:
    out = np.empty(record_bytes, dtype=np.uint8)
    maps, views = {}, {}
    try:
        for path in {p for p, _ in picked}:
            with open(path, "rb") as f:
                maps[path] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            views[path] = np.frombuffer(maps[path], dtype=np.uint8)
        start = time.perf_counter()
        for path, offset in picked:
            out[:] = views[path][offset : offset + record_bytes]
        return len(picked) * record_bytes / (time.perf_counter() - start) / 1e9
    finally:
        views.clear()  # a map cannot close while a view exports its buffer
        for m in maps.values():
            m.close()


def main() -> None:
    """python bench/pagecache.py drop|warm|status FILE... (a manual tool)."""
    command, paths = sys.argv[1], [Path(p) for p in sys.argv[2:]]
    if command == "drop":
        drop(paths)
    elif command == "warm":
        warm(paths, log=lambda m: print(m, file=sys.stderr))
    print(f"resident: {resident_fraction(paths):.1%}")


if __name__ == "__main__":
    main()
