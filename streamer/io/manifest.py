"""The streaming layout's manifest: what is where in a repacked folder, and how to check it.

A repacked folder holds:
  manifest.json          this file's content (format version, model config, every tensor's place)
  resident.safetensors   non-expert weights, in mlx-lm's parameter names
  experts/NNN.bin        one file per MoE layer; expert e is one record of `record_bytes` at
                         `experts[e].offset`, starting on a PAGE_SIZE boundary, holding that
                         expert's tensors (weight/scales/biases of each projection) back to back
  tokenizer and config files copied from the source
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import StreamerError
from .safetensors import DTYPES, itemsize

FORMAT = "streamer-moe"
FORMAT_VERSION = 1
PAGE_SIZE = 16384  # Apple silicon's page size; a multiple of Linux's 4 KiB
TENSOR_ALIGN = 64  # each tensor inside an expert record starts on a cache line
MANIFEST_FILE = "manifest.json"
RESIDENT_FILE = "resident.safetensors"


def align(n: int, to: int) -> int:
    return -(-n // to) * to


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
    quantization: dict[str, dict | None]  # projection -> mlx quantization params (None: unquantized)
    tensors: tuple[ExpertTensor, ...]
    expert_offsets: tuple[int, ...]
    expert_crc32: tuple[tuple[int, ...], ...]  # [expert][tensor]

    @property
    def file_bytes(self) -> int:
        return self.num_experts * self.record_bytes


@dataclass(frozen=True)
class Manifest:
    config: dict
    resident_crc32: dict[str, int]
    layers: tuple[MoeLayer, ...]

    @property
    def expert_bytes(self) -> int:
        return sum(layer.file_bytes for layer in self.layers)

    def to_json(self) -> dict:
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "page_size": PAGE_SIZE,
            "config": self.config,
            "resident": {"file": RESIDENT_FILE, "crc32": self.resident_crc32},
            "moe_layers": [
                {
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
                }
                for layer in self.layers
            ],
        }


def write_manifest(folder: Path, manifest: Manifest) -> None:
    with open(folder / MANIFEST_FILE, "w", encoding="utf-8") as f:
        json.dump(manifest.to_json(), f, indent=1)


def read_manifest(folder: Path | str) -> Manifest:
    """Read and validate a manifest; raise StreamerError naming the defect and what to do."""
    path = Path(folder) / MANIFEST_FILE
    if not path.exists():
        raise StreamerError(
            f"{path} is missing: {folder} is not a repacked model. Run `streamer repack SRC {folder}` first."
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise StreamerError(f"{path} is not valid JSON ({e}); repack the model again.") from e
    try:
        return _parse(data, path)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise StreamerError(f"{path} is malformed ({type(e).__name__}: {e}); repack the model again.") from e


def _parse(data: dict, path: Path) -> Manifest:
    if data.get("format") != FORMAT:
        raise StreamerError(f"{path} is not a streamer manifest (format {data.get('format')!r}).")
    version = data["format_version"]
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise StreamerError(
            f"{path} has format version {version}, newer than this streamer reads ({FORMAT_VERSION}): "
            "upgrade streamer, or repack the model with this version."
        )
    if data["page_size"] != PAGE_SIZE:
        raise StreamerError(f"{path}: page size {data['page_size']} differs from {PAGE_SIZE}; repack the model.")
    layers = tuple(_parse_layer(entry, path) for entry in data["moe_layers"])
    resident = data["resident"]
    if resident["file"] != RESIDENT_FILE:
        raise StreamerError(f"{path}: unexpected resident file {resident['file']!r}; repack the model.")
    crc = {str(k): int(v) for k, v in resident["crc32"].items()}
    if not isinstance(data["config"], dict):
        raise StreamerError(f"{path}: config is not an object; repack the model.")
    return Manifest(data["config"], crc, layers)


def _parse_layer(entry: dict, path: Path) -> MoeLayer:
    def bad(why: str) -> StreamerError:
        return StreamerError(f"{path}: MoE layer {entry.get('module')!r}: {why}; repack the model.")

    tensors = []
    for t in entry["tensors"]:
        tensor = ExpertTensor(str(t["name"]), t["dtype"], tuple(int(d) for d in t["shape"]), int(t["offset"]), int(t["nbytes"]))
        if tensor.dtype not in DTYPES or any(d < 0 for d in tensor.shape):
            raise bad(f"tensor {tensor.name!r} has an invalid dtype or shape")
        if tensor.nbytes != math.prod(tensor.shape) * itemsize(tensor.dtype) or tensor.offset < 0:
            raise bad(f"tensor {tensor.name!r} size does not match its shape")
        tensors.append(tensor)
    record = int(entry["record_bytes"])
    if record <= 0 or record % PAGE_SIZE or any(t.offset + t.nbytes > record for t in tensors):
        raise bad(f"record size {record} is not page-aligned or does not hold its tensors")
    experts = entry["experts"]
    num_experts = int(entry["num_experts"])
    if len(experts) != num_experts or num_experts <= 0:
        raise bad(f"lists {len(experts)} experts, expected {num_experts}")
    offsets = tuple(int(e["offset"]) for e in experts)
    if any(off % PAGE_SIZE or not 0 <= off <= (num_experts - 1) * record for off in offsets):
        raise bad("an expert offset is not page-aligned or lies outside the layer file")
    crcs = tuple(tuple(int(c) for c in e["crc32"]) for e in experts)
    if any(len(c) != len(tensors) for c in crcs):
        raise bad("an expert lacks a checksum per tensor")
    file = str(entry["file"])
    if Path(file).is_absolute() or ".." in Path(file).parts:
        raise bad(f"file {file!r} points outside the folder")
    quantization = {str(k): (dict(v) if v else None) for k, v in entry["quantization"].items()}
    return MoeLayer(str(entry["module"]), file, num_experts, record, quantization, tuple(tensors), offsets, crcs)
