"""The streaming layout's manifest: what is where in a repacked folder, and how to check it.

A repacked folder holds:
  manifest.json          this file's content (format version, model config, every tensor's place)
  resident.safetensors   non-expert weights, in mlx-lm's parameter names
  experts/NNN.bin        one file per MoE layer; expert e is one record of `record_bytes` at
                         `experts[e].offset` = e * record_bytes (a RECORD_ALIGN multiple), holding
                         that expert's tensors (weight/scales/biases of each projection) back to
                         back, so each tensor across experts is one strided array of the file
  tokenizer and config files copied from the source

A shard (written by `streamer split`, for expert-parallel runs over several machines) is the same
layout holding only one rank's experts: its manifest says which rank of how many ("shard") and,
per layer, which of the model's experts its records hold ("expert_ids", record i = expert
expert_ids[i]); `num_experts` counts the records in the file.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import StreamerError
from .json_file import read_json_object
from .safetensors import DTYPES, itemsize

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


def write_manifest(folder: Path, manifest: Manifest) -> None:
    """Write manifest.json atomically: a crash leaves the old manifest or the new one, never
    half."""
    write_json_atomic(Path(folder) / MANIFEST_FILE, manifest.to_json())


def write_json_atomic(path: Path, data: dict) -> None:
    """Write `path` whole or not at all: a failure (a full disk, Ctrl-C) removes the temporary."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def read_manifest(folder: Path | str) -> Manifest:
    """Read and validate a manifest; raise StreamerError naming the defect and what to do."""
    path = Path(folder) / MANIFEST_FILE
    if not path.exists() and not path.is_symlink():
        if (Path(folder) / "config.json").exists():  # a download: repack writes a new folder
            raise StreamerError(
                f"{folder} is a checkpoint as downloaded, not a repacked model: repack it into a "
                f"new folder with `streamer repack {folder} DST` and pass DST."
            )
        raise StreamerError(
            f"{path} is missing: {folder} is not a repacked model. Run "
            f"`streamer repack SRC {folder}` first."
        )
    data = read_json_object(path, "check the folder, or repack the model.")
    return _guarded(lambda: _parse(data, path), path)


def _guarded(parse, path: Path):
    """Run a parser over untrusted JSON: any structural surprise becomes a StreamerError naming
    `path`."""
    try:
        return parse()
    except (
        KeyError,
        TypeError,
        ValueError,
        AttributeError,
        IndexError,
        OverflowError,
        RecursionError,
    ) as e:
        raise StreamerError(
            f"{path} is malformed ({type(e).__name__}: {e}); repack the model again."
        ) from e


def layer_from_json(entry: dict, path: Path) -> MoeLayer:
    """One layer entry as written by `layer_to_json`, validated (StreamerError naming `path`)."""
    return _guarded(lambda: _parse_layer(entry, path), path)


def _parse(data: dict, path: Path) -> Manifest:
    if data.get("format") != FORMAT:
        raise StreamerError(
            f"{path} is not a streamer manifest (format {data.get('format')!r}): point at a "
            "folder written by `streamer repack`, or repack the model."
        )
    version = data["format_version"]
    if type(version) is int and version > FORMAT_VERSION:
        raise StreamerError(
            f"{path} has format version {version}, newer than this streamer reads "
            f"({FORMAT_VERSION}): upgrade streamer, or repack the model with this version."
        )
    if version != FORMAT_VERSION or type(version) is not int:
        raise StreamerError(
            f"{path} has format version {version!r}; this streamer reads version {FORMAT_VERSION}: "
            "repack the model with this version."
        )
    if data["page_size"] != RECORD_ALIGN:
        raise StreamerError(
            f"{path}: page size {data['page_size']} differs from {RECORD_ALIGN}; repack the model."
        )
    layers = tuple(_parse_layer(entry, path) for entry in data["moe_layers"])
    resident = data["resident"]
    if resident["file"] != RESIDENT_FILE:
        raise StreamerError(
            f"{path}: unexpected resident file {resident['file']!r}; repack the model."
        )
    crc = {str(k): int(v) for k, v in resident["crc32"].items()}
    if not isinstance(data["config"], dict):
        raise StreamerError(f"{path}: config is not an object; repack the model.")
    if any(not 0 <= c < 1 << 32 for c in crc.values()):
        raise StreamerError(f"{path}: a resident checksum is not a crc32; repack the model.")
    shard = _parse_shard(data["shard"], layers, path) if "shard" in data else None
    if shard is None and any(layer.expert_ids is not None for layer in layers):
        raise StreamerError(f"{path}: expert_ids without a shard entry; repack the model.")
    return Manifest(data["config"], crc, layers, _parse_files(data.get("files", {}), path), shard)


def _parse_shard(entry: dict, layers: tuple[MoeLayer, ...], path: Path) -> Shard:
    shard = Shard(entry["rank"], entry["ranks"], entry["model"], entry["assignment"])
    if not (
        type(shard.rank) is int
        and type(shard.ranks) is int
        and 0 <= shard.rank < shard.ranks
        and isinstance(shard.model, str)
        and isinstance(shard.assignment, str)
    ):
        raise StreamerError(f"{path}: invalid shard entry {entry!r}; split the model again.")
    if any(layer.expert_ids is None for layer in layers):
        raise StreamerError(
            f"{path}: a shard's MoE layer lacks its expert_ids; split the model again."
        )
    return shard


def _parse_files(files: dict, path: Path) -> dict[str, dict[str, int]]:
    parsed = {}
    for name, stat in files.items():
        size, mtime = stat["size"], stat["mtime_ns"]
        if (
            not isinstance(name, str)
            or _escapes(name)
            or type(size) is not int
            or type(mtime) is not int
            or size < 0
        ):
            raise StreamerError(
                f"{path}: the record of file {name!r} is invalid; repack the model."
            )
        parsed[name] = {"size": size, "mtime_ns": mtime}
    return parsed


def _escapes(file: str) -> bool:
    """True if a manifest's relative file name could reach outside the model folder."""
    return not file or "\0" in file or Path(file).is_absolute() or ".." in Path(file).parts


def _parse_layer(entry: dict, path: Path) -> MoeLayer:
    def bad(why: str) -> StreamerError:
        return StreamerError(f"{path}: MoE layer {entry.get('module')!r}: {why}; repack the model.")

    tensors = []
    for t in entry["tensors"]:
        tensor = ExpertTensor(
            str(t["name"]),
            t["dtype"],
            tuple(int(d) for d in t["shape"]),
            int(t["offset"]),
            int(t["nbytes"]),
        )
        if tensor.dtype not in DTYPES or any(d < 0 for d in tensor.shape):
            raise bad(f"tensor {tensor.name!r} has an invalid dtype or shape")
        if tensor.nbytes != math.prod(tensor.shape) * itemsize(tensor.dtype) or tensor.offset < 0:
            raise bad(f"tensor {tensor.name!r} size does not match its shape")
        if tensor.offset % itemsize(tensor.dtype):
            raise bad(f"tensor {tensor.name!r} is not aligned to its element size")
        tensors.append(tensor)
    if not tensors or len({t.name for t in tensors}) != len(tensors):
        raise bad("the record's tensor list is empty or names a tensor twice")
    spans = sorted((t.offset, t.offset + t.nbytes) for t in tensors)
    if any(b_start < a_end for (_, a_end), (b_start, _) in zip(spans, spans[1:])):
        raise bad("two tensors of the record overlap")
    record = int(entry["record_bytes"])
    if record <= 0 or record % RECORD_ALIGN or any(t.offset + t.nbytes > record for t in tensors):
        raise bad(f"record size {record} is not page-aligned or does not hold its tensors")
    experts = entry["experts"]
    num_experts = int(entry["num_experts"])
    if len(experts) != num_experts or num_experts <= 0:
        raise bad(f"lists {len(experts)} experts, expected {num_experts}")
    offsets = tuple(int(e["offset"]) for e in experts)
    if offsets != tuple(range(0, num_experts * record, record)):
        raise bad("expert records are not stored in expert order, one every record_bytes")
    crcs = tuple(tuple(int(c) for c in e["crc32"]) for e in experts)
    if any(len(c) != len(tensors) for c in crcs) or any(
        not 0 <= v < 1 << 32 for c in crcs for v in c
    ):
        raise bad("an expert lacks a valid crc32 per tensor")
    file = entry["file"]
    if not isinstance(file, str) or _escapes(file):
        raise bad(f"file {file!r} points outside the folder")
    quantization = {str(k): _quantization(v, bad) for k, v in entry["quantization"].items()}
    ids = entry.get("expert_ids")
    if ids is not None:
        ids = tuple(ids)
        if (
            len(ids) != num_experts
            or any(type(i) is not int or i < 0 for i in ids)
            or list(ids) != sorted(set(ids))
        ):
            raise bad("expert_ids must name each record's expert once, in increasing order")
    return MoeLayer(
        str(entry["module"]),
        file,
        num_experts,
        record,
        quantization,
        tuple(tensors),
        offsets,
        crcs,
        ids,
    )


def _quantization(params: dict | None, bad) -> dict | None:
    """Quantization parameters of one projection: None, or group_size/bits ints and a mode name."""
    if params is None:
        return None
    group_size, bits, mode = params["group_size"], params["bits"], params.get("mode", "affine")
    if set(params) - {"group_size", "bits", "mode"} or not (
        type(group_size) is int
        and type(bits) is int
        and 0 < bits <= 8
        and group_size > 0
        and isinstance(mode, str)
    ):
        raise bad(f"invalid quantization parameters {params!r}")
    return dict(params)
