"""manifest.json's untrusted JSON into its types (contents.py), every defect a one-line
StreamerError naming the file and what to do."""

from __future__ import annotations

import math
from pathlib import Path

from ...errors import StreamerError
from ..safetensors import DTYPES, itemsize
from .contents import (
    FORMAT,
    FORMAT_VERSION,
    RECORD_ALIGN,
    RESIDENT_FILE,
    ExpertTensor,
    Manifest,
    MoeLayer,
    Shard,
)


def guarded(parse, path: Path):
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
    return guarded(lambda: _parse_layer(entry, path), path)


def parse_manifest(data: dict, path: Path) -> Manifest:
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
    if not isinstance(data["moe_layers"], list) or not data["moe_layers"]:  # plan: a traceback
        raise StreamerError(f"{path}: moe_layers lists no MoE layer; repack the model.")
    layers = tuple(_parse_layer(entry, path) for entry in data["moe_layers"])
    _check_own_files(layers, path)
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


def _check_own_files(layers: tuple[MoeLayer, ...], path: Path) -> None:
    """Each MoE layer has its own expert file: two naming one (a hand edit; sizes and times
    match) computed the second with the first's experts, without a word."""
    first: dict[str, int] = {}
    for index, layer in enumerate(layers):
        other = first.setdefault(layer.file, index)
        if other != index:
            raise StreamerError(
                f"{path}: MoE layers {other} and {index} both name {layer.file} as their expert "
                "file; repack the model."
            )


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

    tensors = _parse_tensors(entry["tensors"], bad)
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


def _parse_tensors(entries: list, bad) -> list[ExpertTensor]:
    """An expert record's tensors: valid dtypes and shapes, sizes that match them, aligned, named
    once each, and not overlapping (`bad`: the layer's error for a reason)."""
    tensors = []
    for t in entries:
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
    return tensors


def _quantization(params: dict | None, bad) -> dict | None:
    """Quantization parameters of one projection: None, or group_size/bits ints, a mode name and
    whether each expert has an NVFP4 tensor scale (`global_scale`, true if there)."""
    if params is None:
        return None
    group_size, bits, mode = params["group_size"], params["bits"], params.get("mode", "affine")
    if set(params) - {"group_size", "bits", "mode", "global_scale"} or not (
        type(group_size) is int
        and type(bits) is int
        and 0 < bits <= 8
        and group_size > 0
        and isinstance(mode, str)
        and params.get("global_scale", True) is True
    ):
        raise bad(f"invalid quantization parameters {params!r}")
    return dict(params)
