"""The expert store: each MoE layer's file mapped once, its experts viewed in place by MLX.

The OS page cache is the cache and nothing is copied: every tensor of a layer is one strided MLX
array over the mapped file (expert e at e * record_bytes), so mlx-lm's gather kernels read just
the routed experts' pages (see mapping.py for how a mapping becomes an MLX array). What the
mapping alone would do badly is a miss: page faults fetch 4-16 KiB at a time, in series. So
before a layer computes, `prefetch` asks mincore which routed records are cold and announces each
with one madvise(WILLNEED), which starts the kernel reading all of them at once in large requests;
the compute then waits only for what is still in flight. Measured on this machine (8 cold
experts of 2.6 MB): page faults alone 0.2 GB/s, WILLNEED first 1.1-1.3 GB/s, the same as
WILLNEED followed by preadv into a buffer, without that buffer's copy.
"""

from __future__ import annotations

import mmap
import os
import time
import zlib
from pathlib import Path

import mlx.core as mx
import numpy as np

from ..cache.residency import Residency
from ..errors import StreamerError
from ..stats import ExpertTraffic
from .manifest import Manifest, MoeLayer
from .mapping import MappedFile
from .safetensors import DTYPES

# A file this much in the page cache counts as cached: the kernel trims rarely used pages even
# without memory pressure (this VM runs DAMON proactive reclaim), and populating reads them back.
FILE_CACHED_SHARE = 0.99


class ExpertStore:
    def __init__(self, folder: Path, manifest: Manifest):
        self.folder = Path(folder)
        self.layers = manifest.layers
        self.verify_reads = False  # load(verify_reads=True): crc32 of each expert on its first use
        self._verified = [np.zeros(layer.num_experts, dtype=bool) for layer in self.layers]
        self._populated = [np.zeros(layer.num_experts, dtype=bool) for layer in self.layers]
        self._recent_misses = [0] * len(self.layers)
        self.expert_bytes = [
            max(t.offset + t.nbytes for t in layer.tensors) for layer in self.layers
        ]  # per layer
        self._whole_files: dict[int, Residency] = {}
        self.evictions = 0  # bumped by evict(): layers then stop assuming their files are cached
        self._files: list[tuple[int, MappedFile, Residency]] = []
        self._views: list[list[mx.array]] = []
        self._limit_raised = 0
        try:
            for index, layer in enumerate(self.layers):
                self._files.append(self._open(layer))
                self._views.append(self._tensor_views(index))
        except BaseException:
            self.close()
            raise
        # MLX counts the mapped files as its active memory. Past its memory limit its scheduler
        # waits for every op to finish before the next, so a model larger than the limit (the
        # point of streaming) would run op by op: the limit is raised by what is mapped.
        self._limit_raised = self.mapped_bytes
        mx.set_memory_limit(mx.get_memory_limit() + self._limit_raised)

    def _open(self, layer: MoeLayer) -> tuple[int, MappedFile, Residency]:
        path = self.folder / layer.file
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as e:
            raise StreamerError(
                f"cannot open expert file {path}: {e.strerror or e}; repack the model."
            ) from e
        try:
            size = os.fstat(fd).st_size
            if size != layer.file_bytes:
                raise StreamerError(
                    f"{path} holds {size} bytes but the manifest expects {layer.file_bytes} for "
                    f"{layer.module}: the file is truncated or was changed; repack the model."
                )
            mapped = MappedFile(fd, size)
        except BaseException:
            os.close(fd)
            raise
        return fd, mapped, Residency(mapped.address, layer.record_bytes)

    def _tensor_views(self, layer_index: int) -> list[mx.array]:
        layer = self.layers[layer_index]
        data = self._files[layer_index][1].array
        views = []
        for t in layer.tensors:
            dtype = DTYPES[t.dtype][1]
            typed = data if dtype == mx.uint8 else data.view(dtype)
            size = dtype.size
            row = [1] * len(t.shape)  # row-major strides of one expert's tensor, in elements
            for axis in range(len(t.shape) - 2, -1, -1):
                row[axis] = row[axis + 1] * t.shape[axis + 1]
            views.append(
                mx.as_strided(
                    typed,
                    (layer.num_experts, *t.shape),
                    (layer.record_bytes // size, *row),
                    t.offset // size,
                )
            )
        mx.eval(views)
        return views

    @property
    def mapped_bytes(self) -> int:
        """Bytes of expert files mapped into MLX arrays: MLX counts them as its memory, though
        they are file pages the OS can reclaim at will."""
        return sum(mapped.size for _, mapped, _ in self._files)

    def experts(self, layer_index: int) -> list[mx.array]:
        """Every expert of a layer, one [num_experts, *shape] array per tensor (manifest order).

        Views of the mapped file: nothing is read until a kernel touches a routed expert's pages.
        """
        return self._views[layer_index]

    def prefetch(self, layer_index: int, experts: list[int], traffic: ExpertTraffic) -> None:
        """Bring the routed experts into memory and into this process's page tables.

        Cold records are announced together (one madvise(WILLNEED) each) so the kernel reads them
        in parallel; then each record not yet mapped here is populated, which waits for its read.
        The compute that follows touches only mapped pages.
        """
        layer = self.layers[layer_index]
        fd, mapped, residency = self._files[layer_index]
        populated = self._populated[layer_index]
        start = time.perf_counter()
        if (
            os.fstat(fd).st_size != layer.file_bytes
        ):  # touching a page past the end would kill us (SIGBUS)
            raise StreamerError(
                f"{self._where(layer_index)}: the file was truncated or overwritten since the model was "
                "loaded; repack the model."
            )
        record = layer.record_bytes
        for expert in experts:
            if not residency.is_resident(expert * record, traffic):
                mapped.advise(mmap.MADV_WILLNEED, expert * record, record)
                traffic.experts_fetched += 1
                populated[expert] = False  # evicted pages were unmapped too
                self._recent_misses[layer_index] += 1
        for expert in experts:
            if not populated[expert]:
                populated[expert] = mapped.populate(expert * record, record)
        if self.verify_reads:
            self._verify(layer_index, experts)
        traffic.experts_read += len(experts)
        traffic.bytes_read += len(experts) * self.expert_bytes[layer_index]
        traffic.read_seconds += time.perf_counter() - start

    def file_in_page_cache(self, layer_index: int) -> bool:
        """Whether a layer's expert file is in the page cache: all of it, or all but a sliver
        (FILE_CACHED_SHARE) that populating it then reads back. Populating also maps the whole
        file into this process's page tables (no I/O for cached pages), so kernels reading any
        expert take no page faults. A layer that missed since the last call is answered without
        asking the OS."""
        if self._recent_misses[layer_index]:
            self._recent_misses[layer_index] = 0
            return False
        _, mapped, _ = self._files[layer_index]
        if layer_index not in self._whole_files:
            self._whole_files[layer_index] = Residency(mapped.address, mapped.size)
        resident = self._whole_files[layer_index].resident_bytes(0)
        if (
            resident is None or resident < FILE_CACHED_SHARE * mapped.size
        ):  # None: the OS cannot tell
            return False
        populated = self._populated[layer_index]
        if resident < mapped.size or not populated.all():
            populated[:] = mapped.populate(0, mapped.size)
        return True

    def _verify(self, layer_index: int, experts: list[int]) -> None:
        """Check the crc32 of each expert's tensors the first time it is used."""
        layer = self.layers[layer_index]
        verified = self._verified[layer_index]
        host = self._files[layer_index][1].host
        for expert in experts:
            if verified[expert]:
                continue
            base = expert * layer.record_bytes
            for tensor, crc in zip(layer.tensors, layer.expert_crc32[expert]):
                if (
                    zlib.crc32(host[base + tensor.offset : base + tensor.offset + tensor.nbytes])
                    != crc
                ):
                    raise StreamerError(
                        f"{self._where(layer_index)}: expert {expert} tensor {tensor.name} does not match its "
                        f"checksum: the file is corrupt. Run `streamer verify {self.folder}` to list every bad "
                        "tensor, then repack."
                    )
            verified[expert] = True

    def _where(self, layer_index: int) -> str:
        layer = self.layers[layer_index]
        return f"{self.folder / layer.file} (MoE layer {layer_index}, {layer.module})"

    def evict(self) -> None:
        """Unmap every expert page from this process (the page cache keeps them): for tools that
        drop the page cache, which skips pages a process still maps."""
        for _, mapped, _ in self._files:
            mapped.advise(mmap.MADV_DONTNEED, 0, mapped.size)
        for populated in self._populated:
            populated[:] = False
        self.evictions += 1

    def close(self) -> None:
        if self._limit_raised:
            mx.set_memory_limit(max(mx.get_memory_limit() - self._limit_raised, 0))
            self._limit_raised = 0
        for fd, mapped, _ in self._files:
            mapped.close()
            os.close(fd)
        self._files.clear()
        self._views.clear()
