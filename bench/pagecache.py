"""Page-cache control for the benchmark: drop, warm and measure files, and measure the disk.

Dropping uses posix_fadvise(POSIX_FADV_DONTNEED), which Linux honours per file without root. It
skips pages that some process still maps, so a process that has mapped a file must unmap (or
madvise(MADV_DONTNEED)) its pages first: see `drop(..., evict=)`. macOS has no fadvise: see
bench/README.md for its equivalents.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import random
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from streamer.io.mapping import advise, populate, resident_bytes

CHUNK = 8 << 20


def drop(paths: Iterable[Path], evict: Callable[[], None] | None = None) -> None:
    """Evict `paths` from the page cache; `evict` first unmaps this process's own maps of them."""
    if not hasattr(os, "posix_fadvise"):
        raise NotImplementedError(
            "dropping the page cache per file needs posix_fadvise (Linux); see bench/README.md"
        )
    if evict is not None:
        evict()
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
        rate = done / max(time.perf_counter() - start, 1e-9) / 1e9
        log(f"[warm] {done / 1e9:.2f}/{total / 1e9:.2f} GB ({rate:.2f} GB/s)")


def resident_fraction(paths: list[Path]) -> float | None:
    """Share of the bytes of `paths` that are in the page cache (mincore); None if unknown."""
    total = resident = 0
    for path in paths:
        size = path.stat().st_size
        if size == 0:
            continue
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            view = np.frombuffer(mm, dtype=np.uint8)
            r = resident_bytes(view.ctypes.data, 0, size)
            del view
        if r is None:
            return None
        total += size
        resident += r
    return resident / total if total else None


def disk_bandwidth(
    paths: list[Path],
    record_bytes: int,
    *,
    group: int = 8,
    concurrency: int = 1,
    budget: int = 256 << 20,
    seed: int = 0,
) -> dict:
    """Cold read bandwidth of expert-sized records at random record offsets of `paths`, three ways.

    `engine`: what the engine does per layer: madvise(WILLNEED) a group of `group` (top-k) records,
    then populate each into the page tables. `pread`: `concurrency` threads of pread into a buffer.
    `mmap copy`: copying out of an mmap, one page fault at a time (what a plain mmap engine does).
    Each method reads its own records, dropped from the page cache first and left dropped.
    """
    rng = random.Random(seed)
    slots = [(p, i * record_bytes) for p in paths for i in range(p.stat().st_size // record_bytes)]
    count = max(3, min(len(slots), budget // record_bytes))
    picked = rng.sample(slots, count)
    third = count // 3
    drop(paths)
    engine_gbps = _willneed_populate(picked[:third], record_bytes, group)
    pread_gbps = _pread(picked[third : 2 * third], record_bytes, concurrency)
    mmap_gbps = _mmap_copy(picked[2 * third : 3 * third], record_bytes)
    drop(paths)
    return {
        "engine_gbps": engine_gbps,
        "pread_gbps": pread_gbps,
        "mmap_copy_gbps": mmap_gbps,
        "record_bytes": record_bytes,
        "group": group,
        "concurrency": concurrency,
        "bytes_per_method": third * record_bytes,
    }


def _willneed_populate(
    picked: list[tuple[Path, int]], record_bytes: int, group: int
) -> float | None:
    with _mapped({p for p, _ in picked}) as addresses:
        start = time.perf_counter()
        for i in range(0, len(picked), group):
            chunk = picked[i : i + group]
            for path, offset in chunk:
                advise(addresses[path], mmap.MADV_WILLNEED, offset, record_bytes)
            for path, offset in chunk:
                if not populate(addresses[path], offset, record_bytes):
                    return (
                        None  # no MADV_POPULATE_READ here: the compute's page faults wait instead
                    )
        return len(picked) * record_bytes / (time.perf_counter() - start) / 1e9


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
    with _mapped({p for p, _ in picked}) as addresses:
        views = {
            p: np.ctypeslib.as_array((ctypes.c_ubyte * p.stat().st_size).from_address(a))
            for p, a in addresses.items()
        }
        start = time.perf_counter()
        for path, offset in picked:
            out[:] = views[path][offset : offset + record_bytes]
        return len(picked) * record_bytes / (time.perf_counter() - start) / 1e9


@contextlib.contextmanager
def _mapped(paths: set[Path]):
    """Read-only maps of `paths` for the duration: {path: address}."""
    maps, addresses = {}, {}
    try:
        for path in paths:
            with open(path, "rb") as f:
                maps[path] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            view = np.frombuffer(maps[path], dtype=np.uint8)
            addresses[path] = view.ctypes.data
            del view  # a map cannot close while a view exports its buffer
        yield addresses
    finally:
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
