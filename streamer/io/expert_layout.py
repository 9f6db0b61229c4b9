"""Where each MoE layer's experts lie in its files: a layout, the same for a repacked folder and a
download streamed in place, read by expert_files.py (the mappings over it).

Every tensor of expert e is `length` bytes at `offset + e * stride` of one of the layer's files.
One expert is one or more byte ranges, in one or more files: in a repacked folder one record of
`record_bytes` at e * record_bytes; in a download that stacks each tensor [E, ...] in its shards,
the weight/scales/biases ranges of each projection.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import mlx.core as mx

from .manifest import MoeLayer
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


class ByteRange(NamedTuple):  # a tuple: one is made per routed expert range per call
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
    remedy: str = "repack the model"  # what to do about a damaged or changed file

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
