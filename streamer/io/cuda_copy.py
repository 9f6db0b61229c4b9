"""Slot misses on MLX's CUDA backend: read into pinned staging buffers, copied by the copy engine.

A slot pool built from host memory is CUDA managed memory there. The CPU's own stores into its
pages (a preadv straight into the slot) fault every page the GPU last used back to the host one at
a time, and the next kernel faults them back again: 1.4-2.3 GB/s measured on an H200, where
`cudaMemAdvise` and `cudaMemPrefetchAsync` did not help (shared/notes/cuda.md). A copy by the copy
engine (`cudaMemcpyAsync`, the pool's host address is also its device address) writes the pages
on the GPU side and leaves them there; from a pinned source it is a DMA at ~33 GB/s. So a miss
is read into one of a few pinned staging buffers (`cudaHostAlloc`), laid out as the slot's
tensors, then copied tensor by tensor into the slot on that buffer's own stream, and the stream is
synchronised before the buffer is used again. The pool's reuse rule still holds: the copies of a
`place` have finished before it returns, and it writes no slot before the kernels reading it ran.

Only the slot pool loads this module, and only when MLX computes on a CUDA GPU: on Metal the pool
is unified memory and a read straight into the slot stays the design; the CPU needs no copy.
"""

from __future__ import annotations

import ctypes
import mmap
import queue
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from .cuda_runtime import CudaRuntime
from .pinning import PinAllowance
from .reads import ReadFile

STAGING_ALIGN = 16384  # each tensor's view starts on a page (and O_DIRECT) boundary; cudaHostAlloc
# returns page-aligned memory
PAGE = mmap.PAGESIZE


@dataclass
class _Staging:
    views: list[np.ndarray]  # one per slot tensor, in the pool's order, in pinned memory
    stream: int


class StagedCopies:
    """Where slot reads land on CUDA. `into(rows)` lends a staging buffer shaped as `rows` (one
    slot's uint8 rows, one per tensor) to read into; when the block ends without an error its bytes
    are copied into `rows` and the copies have finished. `buffers` reads can be in flight at once;
    a further one waits for a buffer. The pinned memory and streams are released by `close` or,
    failing that, when the object is collected."""

    reads_files = False

    def __init__(self, nbytes: Sequence[int], buffers: int, runtime: CudaRuntime):
        self._runtime = runtime
        self.buffers = buffers
        self._free: queue.SimpleQueue[_Staging] = queue.SimpleQueue()
        starts = np.cumsum([0] + [_up(n) for n in nbytes])
        size = int(starts[-1])
        streams: list[int] = []
        address = runtime.host_alloc(size * buffers)
        self._release = weakref.finalize(self, _release, runtime, address, streams)
        try:
            pinned = (ctypes.c_uint8 * (size * buffers)).from_address(address)
            memory = np.ctypeslib.as_array(pinned)
            for i in range(buffers):
                streams.append(runtime.new_stream())
                base = i * size
                views = [memory[base + s : base + s + n] for s, n in zip(starts, nbytes)]
                self._free.put(_Staging(views, streams[-1]))
        except BaseException:
            self.close()
            raise

    @contextmanager
    def into(self, rows: Sequence[np.ndarray]) -> Iterator[list[np.ndarray]]:
        staging = self._free.get()
        try:
            yield staging.views
            for view, row in zip(staging.views, rows):
                self._runtime.copy(row.ctypes.data, view.ctypes.data, view.nbytes, staging.stream)
            self._runtime.wait(staging.stream)  # then the buffer may take the next read
        finally:
            self._free.put(staging)

    def close(self) -> None:
        self._release()


@dataclass
class MappedSources:
    """One expert's tensors in their files' mappings, and those not locked whole (a copy locks
    their pages for itself)."""

    views: list[np.ndarray]
    unlocked: list[np.ndarray]


class MappedCopies:
    """Where slot misses come from on CUDA when the page cache holds them: the copy engine reads
    each tensor's bytes from its file's read-only mapping into the slot, so no CPU copy touches
    them (a preadv into staging is one; on the H200's VM it ran at about 2 GB/s). `lock` says
    how the mapping is page-locked for that DMA: "copy" locks each expert's pages for its copies
    (about 0.5 ms an expert on an H200), "file" locks each whole file once (0.03 ms a MB; then
    a miss moves at 26-31 GB/s) while the load's `pinnable` allows (shared by its pools; None:
    none) and per copy after that, "none"
    leaves the driver to stage the pageable mapping. `sources(spans)` gives an expert's mapped
    bytes (checksums read them), `copy(moves)` returns when every slot's bytes are in place.
    `gathers`: the slot path may let kernels read the files locked whole (`device_address`:
    io/cuda_gather.py)."""

    reads_files = True
    buffers = 1  # one expert's copies at a time, on one stream

    def __init__(
        self,
        runtime: CudaRuntime,
        lock: str,
        pinnable: PinAllowance | None = None,
        gathers: bool = False,
    ):
        self._runtime, self._lock = runtime, lock
        self._pinnable = pinnable or PinAllowance(0)
        self.gathers = gathers
        self._maps: dict[int, tuple[ReadFile, np.ndarray, bool]] = {}  # id(file): kept alive
        # Closed or collected, whole files are unlocked before their mappings go: a range left
        # registered after its munmap makes CUDA refuse the next mapping at that address.
        stream = runtime.new_stream()
        self._stream = stream
        self._release = weakref.finalize(self, _unlock, runtime, stream, self._maps, self._pinnable)

    def sources(self, spans: Sequence[tuple[ReadFile, int, int]]) -> MappedSources:
        """The mapped bytes of each (file, offset, nbytes): one expert's tensors."""
        mapped = [self._mapped(file) for file, _, _ in spans]
        views = [view[offset : offset + n] for (view, _), (_, offset, n) in zip(mapped, spans)]
        if any(view.nbytes != n for view, (_, _, n) in zip(views, spans)):
            raise OSError("short read: the file ends inside the expert")
        return MappedSources(views, [v for v, (_, locked) in zip(views, mapped) if not locked])

    def copy(self, moves: Sequence[tuple[MappedSources, Sequence[np.ndarray]]]) -> None:
        """Each move's sources (from `sources`) copied into its rows, all queued on the stream
        and waited for once: returns when every slot's bytes are in place."""
        unlocked = [view for sources, _ in moves for view in sources.unlocked]
        registered = []
        try:
            if self._lock != "none":
                for start, nbytes in _pages(
                    [s.ctypes.data for s in unlocked], [s.nbytes for s in unlocked]
                ):
                    self._runtime.register(start, nbytes)
                    registered.append(start)
            stream = self._stream
            for sources, rows in moves:
                for view, row in zip(sources.views, rows):
                    self._runtime.copy(row.ctypes.data, view.ctypes.data, row.nbytes, stream)
            self._runtime.wait(stream)
        finally:
            for start in registered:
                self._runtime.unregister(start)

    def _mapped(self, file: ReadFile) -> tuple[np.ndarray, bool]:
        """The file's read-only mapping, and whether it is locked whole."""
        if id(file) not in self._maps:
            if file.size() == 0:  # mmap refuses an empty file
                raise OSError("short read: the file is empty")
            view = np.frombuffer(mmap.mmap(file.fd, 0, prot=mmap.PROT_READ), np.uint8)
            locked = self._lock == "file" and view.nbytes <= self._pinnable.left
            if locked:
                self._runtime.register(view.ctypes.data, _up(view.nbytes, PAGE), mapped=True)
                self._pinnable.left -= view.nbytes
            self._maps[id(file)] = (file, view, locked)
        return self._maps[id(file)][1:]

    def device_address(self, file: ReadFile) -> int | None:
        """Where a kernel reads `file`'s byte 0 when the file is locked whole, else None."""
        view, locked = self._mapped(file)
        return self._runtime.device_address(view.ctypes.data) if locked else None

    def close(self) -> None:
        self._release()


def _pages(addresses: Sequence[int], sizes: Sequence[int]) -> list[tuple[int, int]]:
    """The page ranges covering [address, address + size) of each span, merged where they touch
    (CUDA refuses to register a page twice)."""
    ranges = sorted((a // PAGE * PAGE, _up(a + n, PAGE)) for a, n in zip(addresses, sizes))
    merged: list[list[int]] = []
    for start, end in ranges:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end - start) for start, end in merged]


def _unlock(runtime: CudaRuntime, stream: int, maps: dict, pinnable: PinAllowance) -> None:
    runtime.destroy_stream(stream)
    for _, view, locked in maps.values():
        if locked:
            runtime.unregister(view.ctypes.data)
            pinnable.left += view.nbytes
    maps.clear()  # each mapping is unmapped once no source view is left


def _release(runtime: CudaRuntime, address: int, streams: list[int]) -> None:
    for stream in streams:
        runtime.destroy_stream(stream)
    runtime.free_host(address)


def _up(nbytes: int, align: int = STAGING_ALIGN) -> int:
    return -(-nbytes // align) * align
