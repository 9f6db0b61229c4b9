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

import os
from pathlib import Path

from ...errors import StreamerError
from ..durable import write_json_atomic
from ..files import gguf_refusal
from ..json_file import read_json_object
from .contents import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST_FILE,
    RECORD_ALIGN,
    RESIDENT_FILE,
    TENSOR_ALIGN,
    ExpertTensor,
    Manifest,
    MoeLayer,
    Shard,
    layer_to_json,
)
from .parse import guarded, layer_from_json, parse_manifest

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "MANIFEST_FILE",
    "RECORD_ALIGN",
    "RESIDENT_FILE",
    "TENSOR_ALIGN",
    "ExpertTensor",
    "Manifest",
    "MoeLayer",
    "Shard",
    "layer_from_json",
    "layer_to_json",
    "read_manifest",
    "write_manifest",
]


def write_manifest(folder: Path, manifest: Manifest) -> None:
    """Write manifest.json atomically: a crash leaves the old manifest or the new one, never
    half."""
    write_json_atomic(Path(folder) / MANIFEST_FILE, manifest.to_json())


def not_a_model(folder: Path) -> str:
    """Why `folder`, which holds neither manifest.json nor config.json, is not a model: what the
    path is, and what was looked for."""
    gguf = gguf_refusal(folder)
    if gguf:
        return gguf
    looked = (
        f"{MANIFEST_FILE} (a folder `streamer repack` or `streamer pull` wrote) or config.json (a "
        "download, with its safetensors shards)"
    )
    if os.path.isdir(folder):  # Path.is_dir raises OSError for a part over 255 bytes
        kind = "an empty folder" if not any(folder.iterdir()) else "a folder without a model"
        found = f"{folder.absolute()} is {kind}: looked for {looked} in it"
    else:  # a missing path reaches here from streamer.load (--model's lookup says so itself)
        what = "is a file, not a model's folder" if os.path.lexists(folder) else "does not exist"
        found = f"{folder.absolute()} {what}: a model is a folder with {looked}"
    return f"{found}. Pass the model's folder, or its org/name."


def read_manifest(folder: Path | str) -> Manifest:
    """Read and validate a manifest; raise StreamerError naming the defect and what to do."""
    path = Path(folder) / MANIFEST_FILE
    if not path.exists() and not path.is_symlink():
        config = Path(folder) / "config.json"
        if config.is_symlink() and not config.exists():  # a hub snapshot without its blob
            raise StreamerError(
                f"{config} is a symbolic link to {os.readlink(config)}, which is missing: the "
                "download is incomplete (a Hugging Face cache without that blob); download "
                "the model again."
            )
        if config.exists():  # a download: repack writes a new folder
            raise StreamerError(
                f"{folder} is a checkpoint as downloaded, not a repacked model: repack it into a "
                f"new folder with `streamer repack {folder} DST` and pass DST."
            )
        raise StreamerError(not_a_model(Path(folder)))
    data = read_json_object(path, "check the folder, or repack the model.")
    return guarded(lambda: parse_manifest(data, path), path)
