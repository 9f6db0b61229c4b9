"""Expert files: the files holding each MoE layer's experts, mapped once and viewed in place by MLX.

Each tensor across experts is one strided MLX array over the mapping of its layout
(expert_layout.py), read by mlx-lm's gather kernels without a copy (mapping.py says how a
mapping becomes an MLX array). Residency, read-ahead and checksums work on the layout's expert
ranges. Nothing here knows a policy or a statistic.
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import mlx.core as mx
import numpy as np

from ..errors import StreamerError
from .expert_layout import ByteRange, LayerLayout, TensorPlacement, repacked_layout
from .file_watch import watch_files
from .files import close_when_collected, open_regular
from .integrity import check_expert_file_size
from .manifest import Manifest
from .mapping import OS_PAGE, MappedFile, Residency, Span, page_span


class LayerFiles:
    """One layer's experts over its mapped files: MLX views, and OS calls on expert ranges."""

    def __init__(self, layout: LayerLayout, fds: list[int], maps: list[MappedFile]):
        self.layout = layout
        self._fds, self._maps = fds, maps
        self.views = [self._view(t) for t in layout.tensors]
        mx.eval(self.views)
        self._residency = Residency()
        self._spans: list[list[Span] | None] = [None] * layout.num_experts  # made on first use
        # bytes of each of an expert's ranges (the unit of residency), in `ranges` order
        self.range_lengths = np.array([r.length for r in layout.expert_ranges], dtype=np.int64)
        self._tiled: dict[int, np.ndarray] = {}  # experts per call -> their ranges' lengths
        self._region_spans = [
            page_span(self.address(r.file, r.offset), r.length) for r in layout.regions
        ]
        self._region_lengths = np.array([r.length for r in layout.regions], dtype=np.int64)
        self.regions_bytes = int(self._region_lengths.sum())  # all of the layer's experts
        self.watches = watch_files(layout.files, fds)

    def _view(self, t: TensorPlacement) -> mx.array:
        mapped = self._maps[t.at.file]
        size = t.dtype.size
        row = [1] * len(t.shape)  # row-major strides of one expert's tensor, in elements
        for axis in range(len(t.shape) - 2, -1, -1):
            row[axis] = row[axis + 1] * t.shape[axis + 1]
        shape = (self.layout.num_experts, *t.shape)
        # A tensor need not start on a multiple of its element size (mlx's safetensors writer
        # does not pad its header): the view starts where its bytes do.
        return mapped.view(t.at.offset - mapped.offset, t.dtype, shape, (t.at.stride // size, *row))

    def ranges(self, expert: int) -> list[ByteRange]:
        return [r.of(expert) for r in self.layout.expert_ranges]

    def address(self, file: int, offset: int) -> int:
        """Where byte `offset` of the layer's file number `file` lies in memory."""
        mapped = self._maps[file]
        return mapped.address + offset - mapped.offset

    def resident_bytes(self, experts: list[int]) -> np.ndarray | None:
        """Bytes of each of `experts`' ranges in the page cache, [expert, range] in `ranges`
        order, asked in one go; None where the OS cannot tell."""
        spans = [span for expert in experts for span in self._spans_of(expert)]
        lengths = self._tiled.get(len(experts))
        if lengths is None:
            lengths = self._tiled[len(experts)] = np.tile(self.range_lengths, len(experts))
        counts = self._residency.resident_bytes(spans, lengths)
        return None if counts is None else counts.reshape(len(experts), len(self.range_lengths))

    def _spans_of(self, expert: int) -> list[Span]:
        spans = self._spans[expert]
        if spans is None:
            spans = self._spans[expert] = [
                page_span(self.address(r.file, r.offset), r.length) for r in self.ranges(expert)
            ]
        return spans

    def regions_resident_bytes(self) -> np.ndarray | None:
        """Bytes of each of the layout's regions in the page cache; None where the OS cannot
        tell."""
        return self._residency.resident_bytes(self._region_spans, self._region_lengths)

    def advise(self, r: ByteRange, advice: int) -> None:
        mapped = self._maps[r.file]
        try:
            mapped.advise(advice, r.offset - mapped.offset, r.length)
        except OSError as e:
            raise self._unreadable(r, e) from e

    def populate(self, r: ByteRange) -> bool:
        """Map `r` into this process's page tables now (see mapping.populate)."""
        mapped = self._maps[r.file]
        try:
            return mapped.populate(r.offset - mapped.offset, r.length)
        except OSError as e:  # the disk's error, or EFAULT: a page past a truncated file's end
            raise self._unreadable(r, e) from e

    def _unreadable(self, r: ByteRange, error: OSError) -> StreamerError:
        return StreamerError(
            f"{self.layout.where(r.file)}: cannot read bytes {r.offset}-{r.offset + r.length} "
            f"({error}); check the disk, or run `streamer verify` on the model folder."
        )

    def tensor_bytes(self, expert: int) -> list[np.ndarray]:
        """An expert's tensors as host bytes over the mapping (for checksums), in layout order."""
        parts = []
        for t in self.layout.tensors:
            mapped, r = self._maps[t.at.file], t.at.of(expert)
            parts.append(
                mapped.host[r.offset - mapped.offset : r.offset - mapped.offset + r.length]
            )
        return parts


class ExpertFiles:
    """Every MoE layer's files, each path opened once, and the span of each of a layout's files
    that holds its regions mapped once (a repacked layer's whole file; in a download, each
    stacked tensor, not the shard's other tensors: no mapping is larger than what it streams)."""

    def __init__(self, layouts: list[LayerLayout]):
        self._fds: dict[Path, int] = {}
        self._close_fds = close_when_collected(self, self._fds)
        self._opened: dict[tuple[Path, int, int], tuple[int, MappedFile]] = {}
        self.layers: list[LayerFiles] = []
        self.evictions = 0  # bumped by evict(): readers then forget what they had mapped
        try:
            for layout in layouts:
                opened = [self._open(layout, i) for i in range(len(layout.files))]
                self.layers.append(LayerFiles(layout, *map(list, zip(*opened))))
        except BaseException:
            self.close()
            raise

    def _open(self, layout: LayerLayout, file: int) -> tuple[int, MappedFile]:
        path, size = layout.files[file], layout.file_bytes[file]
        if path not in self._fds:
            try:
                fd = open_regular(path, f"the expert file of {layout.name}")
            except OSError as e:
                raise StreamerError(
                    f"cannot open expert file {path}: {e.strerror or e}; {layout.remedy}."
                ) from e
            try:
                check_expert_file_size(path, os.fstat(fd).st_size, size, layout.name, layout.remedy)
            except BaseException:
                os.close(fd)
                raise
            self._fds[path] = fd
        regions = [r for r in layout.regions if r.file == file]
        start = min(r.offset for r in regions)
        start -= start % OS_PAGE
        end = max(r.offset + r.length for r in regions)
        key = (path, start, end)
        if key not in self._opened:
            self._opened[key] = self._fds[path], MappedFile(self._fds[path], end - start, start)
        return self._opened[key]

    @property
    def mapped_bytes(self) -> int:
        """Bytes of files mapped into MLX arrays."""
        return sum(mapped.size for _, mapped in self._opened.values())

    @property
    def mlx_bytes(self) -> int:
        """The MLX memory the mappings take (their buffers, mapping.OWN_MAPPING_BYTES at least):
        MLX counts it as its own, though it is file pages the OS can reclaim at will."""
        return sum(mapped.mlx_bytes for _, mapped in self._opened.values())

    def evict(self) -> None:
        """Unmap every expert page from this process (the page cache keeps them): for tools that
        drop the page cache, which skips pages a process still maps."""
        for _, mapped in self._opened.values():
            mapped.advise(mmap.MADV_DONTNEED, 0, mapped.size)
        self.evictions += 1

    def close(self) -> None:
        for _, mapped in self._opened.values():
            mapped.close()
        self._close_fds()
        self._opened.clear()
        self.layers.clear()


def open_repacked(folder: Path, manifest: Manifest) -> ExpertFiles:
    return ExpertFiles(
        [repacked_layout(folder, i, layer) for i, layer in enumerate(manifest.layers)]
    )
