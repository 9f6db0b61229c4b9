"""What a manifest holds, as types: a repacked folder's MoE layers, each expert record's
tensors, a shard's rank; and their JSON form."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

FORMAT = "streamer-moe"
FORMAT_VERSION = 1
# Expert records start and end on this boundary: Apple silicon's page size, a multiple of Linux's
# 4 KiB, so a record is whole OS pages on both (the OS page itself is io/mapping.py's OS_PAGE).
RECORD_ALIGN = 16384
TENSOR_ALIGN = 64  # each tensor inside an expert record starts on a cache line
MANIFEST_FILE = "manifest.json"
RESIDENT_FILE = "resident.safetensors"


@dataclass(frozen=True)
class ExpertTensor:
    """One tensor of an expert record: `offset` is relative to the record's start."""

    name: str  # e.g. "gate_proj.weight"
    dtype: str  # safetensors dtype name
    shape: tuple[int, ...]  # one expert's shape (the stacked tensor minus its leading axis)
    offset: int
    nbytes: int


@dataclass(frozen=True)
class MoeLayer:
    module: str  # mlx-lm module path of the expert container
    file: str  # relative to the repacked folder
    num_experts: int
    record_bytes: int
    quantization: dict[
        str, dict | None
    ]  # projection -> mlx quantization params (None: unquantized)
    tensors: tuple[ExpertTensor, ...]
    expert_offsets: tuple[int, ...]
    expert_crc32: tuple[tuple[int, ...], ...]  # [expert][tensor]
    # a shard's records: the model's expert id of each record (None: record e is expert e)
    expert_ids: tuple[int, ...] | None = None

    @property
    def file_bytes(self) -> int:
        return self.num_experts * self.record_bytes


@dataclass(frozen=True)
class Shard:
    """The folder holds rank `rank`'s share (of `ranks`) of the experts of model `model`."""

    rank: int
    ranks: int
    model: str  # model_identity() of the folder it was split from
    assignment: str  # how the experts were shared out ("interleaved" or "trace")


@dataclass(frozen=True)
class Manifest:
    config: dict
    resident_crc32: dict[str, int]
    layers: tuple[MoeLayer, ...]
    # relative path -> {"size", "mtime_ns"} of each data file when repacked: a file changed since
    # (edited, truncated, half-copied) is refused at load. Empty in manifests written before this.
    files: dict[str, dict[str, int]] = field(default_factory=dict)
    shard: Shard | None = None

    @property
    def expert_file_bytes(self) -> int:
        """Bytes of all expert files on disk (records with their padding)."""
        return sum(layer.file_bytes for layer in self.layers)

    @property
    def model_identity(self) -> str:
        """What the full model is, whatever folder holds it: a shard's is that of the folder it
        was split from, so the ranks of a group can check that they run one model."""
        if self.shard is not None:
            return self.shard.model
        content = {
            "config": self.config,
            "resident": self.resident_crc32,
            "moe_layers": [layer_to_json(layer) for layer in self.layers],
        }
        return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:32]

    def to_json(self) -> dict:
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "page_size": RECORD_ALIGN,
            "config": self.config,
            "resident": {"file": RESIDENT_FILE, "crc32": self.resident_crc32},
            "moe_layers": [layer_to_json(layer) for layer in self.layers],
            **({"files": self.files} if self.files else {}),
            **({"shard": asdict(self.shard)} if self.shard else {}),
        }


def layer_to_json(layer: MoeLayer) -> dict:
    return {
        "module": layer.module,
        "file": layer.file,
        "num_experts": layer.num_experts,
        "record_bytes": layer.record_bytes,
        "quantization": layer.quantization,
        "tensors": [asdict(t) for t in layer.tensors],
        "experts": [
            {"offset": off, "crc32": list(crcs)}
            for off, crcs in zip(layer.expert_offsets, layer.expert_crc32)
        ],
        **({"expert_ids": list(layer.expert_ids)} if layer.expert_ids is not None else {}),
    }
