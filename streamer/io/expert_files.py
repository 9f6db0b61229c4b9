"""Expert files: the files holding each MoE layer's experts, mapped once and viewed in place by MLX.

Where an expert's bytes lie is a layout: every tensor of expert e is `length` bytes at
`offset + e * stride` of one of the layer's files, so each tensor across experts is one strided
MLX array over the mapping, read by mlx-lm's gather kernels without a copy (mapping.py says how a
mapping becomes an MLX array). One expert is one or more byte ranges, in one or more files: in a
repacked folder one record of `record_bytes` at e * record_bytes; in a download that stacks each
tensor [E, ...] in its shards, the weight/scales/biases ranges of each projection. Residency,
read-ahead and checksums work on those ranges. Nothing here knows a policy or a statistic.
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import numpy as np

from ..errors import StreamerError
from .integrity import check_expert_file_size
from .manifest import Manifest, MoeLayer
from .mapping import MappedFile
from .safetensors import DTYPES


@dataclass(frozen=True)
class Strided:
    """Bytes repeated once per expert: expert e's `length` bytes lie at `offset + e * stride` of
    the layer's file number `file`."""

    file: int
    offset: int
    stride: int
    length: int

    def of(self, expert: int) -> ByteRange:
        return ByteRange(self.file, self.offset + expert * self.stride, self.length)


@dataclass(frozen=True)
class ByteRange:
    file: int  # index into the layer's files
    offset: int
    length: int


@dataclass(frozen=True)
class TensorPlacement:
    name: str  # mlx-lm's name inside the container, e.g. "gate_proj.weight"
    dtype: mx.Dtype
    shape: tuple[int, ...]  # one expert's shape
    at: Strided


@dataclass(frozen=True)
class LayerLayout:
    """Where one MoE layer's experts lie."""

    folder: Path  # the model folder, for what to do about an error
    index: int  # MoE layer number
    module: str  # mlx-lm module path of the expert container
    files: tuple[Path, ...]
    file_bytes: tuple[int, ...]  # the size each file must have
    num_experts: int
    tensors: tuple[TensorPlacement, ...]  # in the manifest's tensor order
    expert_ranges: tuple[Strided, ...]  # what one expert occupies: the unit of residency and reads
    payload_bytes: int  # bytes of one expert that the compute reads (its statistic)
    regions: tuple[ByteRange, ...]  # bytes holding all of the layer's experts

    @property
    def name(self) -> str:
        return f"MoE layer {self.index} ({self.module})"

    def where(self, file: int) -> str:
        return f"{self.files[file]} (MoE layer {self.index}, {self.module})"


def repacked_layout(folder: Path, index: int, layer: MoeLayer) -> LayerLayout:
    """A repacked folder's layer: one file, expert e one record at e * record_bytes."""
    path = Path(folder) / layer.file
    record = layer.record_bytes
    return LayerLayout(
        folder=Path(folder),
        index=index,
        module=layer.module,
        files=(path,),
        file_bytes=(layer.file_bytes,),
        num_experts=layer.num_experts,
        tensors=tuple(
            TensorPlacement(
                t.name, DTYPES[t.dtype][1], t.shape, Strided(0, t.offset, record, t.nbytes)
            )
            for t in layer.tensors
        ),
        expert_ranges=(Strided(0, 0, record, record),),
        payload_bytes=max(t.offset + t.nbytes for t in layer.tensors),
        regions=(ByteRange(0, 0, layer.file_bytes),),
    )


class LayerFiles:
    """One layer's experts over its mapped files: MLX views, and OS calls on expert ranges."""

    def __init__(self, layout: LayerLayout, fds: list[int], maps: list[MappedFile]):
        self.layout = layout
        self._fds, self._maps = fds, maps
        self.views = [self._view(t) for t in layout.tensors]
        mx.eval(self.views)

    def _view(self, t: TensorPlacement) -> mx.array:
        data = self._maps[t.at.file].array
        typed = data if t.dtype == mx.uint8 else data.view(t.dtype)
        size = t.dtype.size
        row = [1] * len(t.shape)  # row-major strides of one expert's tensor, in elements
        for axis in range(len(t.shape) - 2, -1, -1):
            row[axis] = row[axis + 1] * t.shape[axis + 1]
        shape = (self.layout.num_experts, *t.shape)
        return mx.as_strided(typed, shape, (t.at.stride // size, *row), t.at.offset // size)

    def ranges(self, expert: int) -> list[ByteRange]:
        return [r.of(expert) for r in self.layout.expert_ranges]

    def resident_bytes(self, r: ByteRange) -> int | None:
        """Bytes of `r` in the page cache; None where the OS cannot tell."""
        return self._maps[r.file].resident_bytes(r.offset, r.length)

    def advise(self, r: ByteRange, advice: int) -> None:
        self._maps[r.file].advise(advice, r.offset, r.length)

    def populate(self, r: ByteRange) -> bool:
        """Map `r` into this process's page tables now (see mapping.populate)."""
        return self._maps[r.file].populate(r.offset, r.length)

    def tensor_bytes(self, expert: int) -> list[np.ndarray]:
        """An expert's tensors as host bytes over the mapping (for checksums), in layout order."""
        return [
            self._maps[t.at.file].host[r.offset : r.offset + r.length]
            for t in self.layout.tensors
            for r in (t.at.of(expert),)
        ]

    def check_unchanged(self) -> None:
        """Touching a page past a file's end kills the process (SIGBUS): one fstat per file."""
        for file, (fd, size) in enumerate(zip(self._fds, self.layout.file_bytes)):
            if os.fstat(fd).st_size != size:
                raise StreamerError(
                    f"{self.layout.where(file)}: the file was truncated or overwritten since the "
                    "model was loaded; repack the model."
                )


class ExpertFiles:
    """Every MoE layer's files, each path opened and mapped once (layers may share a file)."""

    def __init__(self, layouts: list[LayerLayout]):
        self._opened: dict[Path, tuple[int, MappedFile]] = {}
        self.layers: list[LayerFiles] = []
        self.evictions = 0  # bumped by evict(): readers then forget what they had mapped
        try:
            for layout in layouts:
                opened = [self._open(p, n, layout) for p, n in zip(layout.files, layout.file_bytes)]
                self.layers.append(LayerFiles(layout, *map(list, zip(*opened))))
        except BaseException:
            self.close()
            raise

    def _open(self, path: Path, size: int, layout: LayerLayout) -> tuple[int, MappedFile]:
        if path not in self._opened:
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError as e:
                raise StreamerError(
                    f"cannot open expert file {path}: {e.strerror or e}; repack the model."
                ) from e
            try:
                check_expert_file_size(path, os.fstat(fd).st_size, size, layout.name)
                self._opened[path] = fd, MappedFile(fd, size)
            except BaseException:
                os.close(fd)
                raise
        return self._opened[path]

    @property
    def mapped_bytes(self) -> int:
        """Bytes of files mapped into MLX arrays: MLX counts them as its memory, though they are
        file pages the OS can reclaim at will."""
        return sum(mapped.size for _, mapped in self._opened.values())

    def evict(self) -> None:
        """Unmap every expert page from this process (the page cache keeps them): for tools that
        drop the page cache, which skips pages a process still maps."""
        for _, mapped in self._opened.values():
            mapped.advise(mmap.MADV_DONTNEED, 0, mapped.size)
        self.evictions += 1

    def close(self) -> None:
        for fd, mapped in self._opened.values():
            mapped.close()
            os.close(fd)
        self._opened.clear()
        self.layers.clear()


def open_repacked(folder: Path, manifest: Manifest) -> ExpertFiles:
    return ExpertFiles(
        [repacked_layout(folder, i, layer) for i, layer in enumerate(manifest.layers)]
    )
