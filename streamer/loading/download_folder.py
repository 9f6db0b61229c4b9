"""An MLX-quantized download streamed in place: where each expert's bytes lie in its shards.

mlx-community checkpoints (what `mlx_lm.convert` writes) keep each MoE layer's experts as stacked
tensors `{container}.{projection}.{weight,scales,biases}` of shape [E, ...], each contiguous in one
shard (mlx-lm never splits a tensor across shards). Expert e of such a tensor is the byte range
`start + e * nbytes` of length `nbytes`, so one expert is a handful of ranges (9 for a quantized
GLU) instead of one record. This module reads the index and the headers, never the data, checks
every expert tensor against the model mlx-lm builds for config.json (download_tensors.py), and
describes each layer for the read path. The non-expert weights are loaded as mlx-lm loads them
(mx.load, sanitize, quantize); only the expert tensors are left to the read path.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from ..errors import StreamerError
from ..families.architectures import (
    build_model,
    check_streams,
    expert_container_of,
    expert_containers,
    quantize_like_mlx_lm,
)
from ..families.config import check_config, check_layer_count
from ..families.transformers.spellings import normalize_config
from ..io.checkpoint import Checkpoint
from ..io.expert_layout import ByteRange, LayerLayout, Strided, TensorPlacement
from ..io.manifest import MANIFEST_FILE
from ..io.safetensors import DTYPES
from .download_tensors import InPlaceLayer, in_place_layer

REMEDY = "download that file again"


@dataclass(frozen=True)
class Download:
    """A download folder described for streaming: its MoE layers' expert tensors in place, and
    the size of every shard as read (a shard whose size changes while loaded is refused)."""

    folder: Path
    config: dict
    layers: tuple[InPlaceLayer, ...]
    resident: tuple[str, ...]  # every other tensor of the checkpoint (what checksums cover)
    file_bytes: dict[str, int]  # shard -> size in bytes

    @property
    def expert_file_bytes(self) -> int:
        """Bytes of every expert tensor in the shards."""
        return sum(layer.payload_bytes * layer.num_experts for layer in self.layers)


def is_download(folder: Path | str) -> bool:
    """A checkpoint folder (config.json and safetensors) rather than a repacked one."""
    folder = Path(folder)
    return not (folder / MANIFEST_FILE).exists() and (folder / "config.json").exists()


def open_download(folder: Path | str) -> tuple[Download, nn.Module, dict[str, mx.array]]:
    """Describe an MLX-quantized download and build its mlx-lm model, quantized as mlx-lm would.

    Returns the description, the model (expert weights not loaded) and the non-expert weights in
    mlx-lm's names, lazily loaded (nothing is read until evaluated).
    """
    folder = Path(folder)
    with Checkpoint(folder) as ckpt:
        config = normalize_config(ckpt.config)
        where = folder / "config.json"
        if "quantization" not in ckpt.config:
            check_streams(ckpt.config, where)  # a dense model is told so, not to repack
            raise StreamerError(
                f"{where}: this checkpoint is not MLX-quantized (no quantization in config.json), "
                "so it cannot stream in place: run "
                f"`streamer repack {folder} DST --quantize 4` and use DST."
            )
        check_config(config, where)
        check_layer_count(config, ckpt.tensors, where)
        model = build_model(config, where)
        containers = expert_containers(model)
        sources = {name: ckpt.lazy(name) for name in ckpt.tensors}
        weights = model.sanitize(dict(sources)) if hasattr(model, "sanitize") else dict(sources)
        quantize_like_mlx_lm(model, config, weights)
        source_of = {id(arr): name for name, arr in sources.items()}
        layers = tuple(
            in_place_layer(ckpt, module, container, weights, source_of)
            for module, container in containers.items()
        )
        resident = {
            name: arr
            for name, arr in weights.items()
            if expert_container_of(name, containers) is None
        }
        shards = {info.path for info in ckpt.tensors.values()}
        file_bytes = {path.name: path.stat().st_size for path in sorted(shards)}
        experts = {f"{layer.module}.{t.name}" for layer in layers for t in layer.tensors}
        experts = {source_of[id(weights[name])] for name in experts}
        others = tuple(name for name in ckpt.tensors if name not in experts)
    return Download(folder, config, layers, others, file_bytes), model, resident


def layouts(download: Download) -> list[LayerLayout]:
    """Where each MoE layer's experts lie, for the read path: expert e is one range per stacked
    tensor (`start + e * nbytes`). Each stacked tensor counts as a file of its own, so it is
    mapped on its own: mlx writes a shard's tensors in no particular order, so a layer's span
    of a shard would take in other layers and the non-expert weights."""
    out = []
    for index, layer in enumerate(download.layers):
        placed = [(t, Strided(i, t.start, t.nbytes, t.nbytes)) for i, t in enumerate(layer.tensors)]
        out.append(
            LayerLayout(
                folder=download.folder,
                index=index,
                module=layer.module,
                files=tuple(download.folder / t.file for t in layer.tensors),
                file_bytes=tuple(download.file_bytes[t.file] for t in layer.tensors),
                num_experts=layer.num_experts,
                tensors=tuple(
                    TensorPlacement(t.name, DTYPES[t.dtype][1], t.shape, at) for t, at in placed
                ),
                expert_ranges=tuple(at for _, at in placed),
                payload_bytes=layer.payload_bytes,
                regions=tuple(
                    ByteRange(at.file, at.offset, at.stride * layer.num_experts) for _, at in placed
                ),
                remedy=REMEDY,
            )
        )
    return out
