"""An MLX-quantized download streamed in place: where each expert's bytes lie in its shards.

mlx-community checkpoints (what `mlx_lm.convert` writes) keep each MoE layer's experts as stacked
tensors `{container}.{projection}.{weight,scales,biases}` of shape [E, ...], each contiguous in one
shard (mlx-lm never splits a tensor across shards). Expert e of such a tensor is the byte range
`start + e * nbytes` of length `nbytes`, so one expert is a handful of ranges (9 for a quantized
GLU) instead of one record. This module reads the index and the headers, never the data, checks
every expert tensor against the model mlx-lm builds for config.json, and describes each layer for
the read path. The non-expert weights are loaded as mlx-lm loads them (mx.load, sanitize,
quantize); only the expert tensors are left to the read path.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from .architectures import (
    build_model,
    container_projections,
    expert_containers,
    normalize_config,
    quantize_like_mlx_lm,
)
from .config import check_config, check_layer_count
from .errors import StreamerError
from .io.checkpoint import Checkpoint
from .io.expert_files import ByteRange, LayerLayout, Strided, TensorPlacement
from .io.manifest import MANIFEST_FILE
from .io.safetensors import DTYPES, TensorInfo, itemsize

REMEDY = "download that file again"

KINDS = ("weight", "scales", "biases", "bias")


@dataclass(frozen=True)
class PlacedTensor:
    """One expert tensor where the download keeps it: expert e's bytes are `span(e)` of `file`."""

    name: str  # "gate_proj.weight", as in a repacked record
    dtype: str  # safetensors dtype name
    shape: tuple[int, ...]  # one expert's shape
    file: str  # the shard, relative to the download folder
    start: int  # byte offset of expert 0 in the shard
    nbytes: int  # one expert's bytes: the stacked tensor holds num_experts of them back to back

    def span(self, expert: int) -> tuple[int, int]:
        """(offset, length) of one expert's bytes in `file`."""
        return self.start + expert * self.nbytes, self.nbytes

    @property
    def aligned(self) -> bool:
        """Whether the data starts on a multiple of its element size. mlx's safetensors writer
        does not pad its header, so often it does not: the CPU reads such a view as it is, a
        Metal kernel binding may not (see README, In place)."""
        return self.start % itemsize(self.dtype) == 0


@dataclass(frozen=True)
class InPlaceLayer:
    module: str  # mlx-lm module path of the expert container
    num_experts: int
    quantization: dict[str, dict | None]  # projection -> mlx quantization params (None: plain)
    tensors: tuple[PlacedTensor, ...]

    @property
    def payload_bytes(self) -> int:
        """Bytes of one expert: its ranges of every stacked tensor."""
        return sum(t.nbytes for t in self.tensors)

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(sorted({t.file for t in self.tensors}))


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
            _layer(ckpt, module, container, weights, source_of)
            for module, container in containers.items()
        )
        resident = {
            name: arr
            for name, arr in weights.items()
            if not any(name.startswith(module + ".") for module in containers)
        }
        shards = {info.path for info in ckpt.tensors.values()}
        file_bytes = {path.name: path.stat().st_size for path in sorted(shards)}
        experts = {f"{layer.module}.{t.name}" for layer in layers for t in layer.tensors}
        experts = {source_of[id(weights[name])] for name in experts}
        others = tuple(name for name in ckpt.tensors if name not in experts)
    return Download(folder, config, layers, others, file_bytes), model, resident


def _layer(
    ckpt: Checkpoint,
    module: str,
    container: nn.Module,
    weights: dict[str, mx.array],
    source_of: dict[int, str],
) -> InPlaceLayer:
    expected = dict(tree_flatten(container.parameters()))
    num_experts = None
    tensors = []
    for proj in container_projections(container):
        for kind in KINDS:
            param = expected.pop(f"{proj}.{kind}", None)
            if param is None:
                continue
            name = f"{module}.{proj}.{kind}"
            info = _stored(ckpt, name, weights, source_of)
            _check(info, param)
            num_experts = param.shape[0]
            tensors.append(
                PlacedTensor(
                    f"{proj}.{kind}",
                    info.dtype,
                    tuple(info.shape[1:]),
                    info.path.name,
                    info.start,
                    info.nbytes // num_experts,
                )
            )
    extra = sorted(
        n
        for n in weights
        if n.startswith(module + ".") and n[len(module) + 1 :] not in {t.name for t in tensors}
    )
    if expected or extra:
        what = f"lacks '{module}.{next(iter(expected))}'" if expected else f"holds '{extra[0]}'"
        raise StreamerError(
            f"{ckpt.folder}: the checkpoint {what}, which a {ckpt.config.get('model_type')} model "
            "with this config.json does not have: the download is incomplete or config.json "
            "belongs to another model."
        )
    quantization = {
        proj: (
            {"group_size": m.group_size, "bits": m.bits, "mode": m.mode}
            if hasattr(m := container[proj], "group_size")
            else None
        )
        for proj in container_projections(container)
    }
    return InPlaceLayer(module, num_experts, quantization, tuple(tensors))


def _stored(
    ckpt: Checkpoint, name: str, weights: dict[str, mx.array], source_of: dict[int, str]
) -> TensorInfo:
    """The source tensor mlx-lm would use for `name`: one stored as it is, or a refusal."""
    arr = weights.get(name)
    if arr is None:
        raise StreamerError(
            f"{ckpt.folder}: tensor '{name}' is missing: the download is incomplete, or its "
            "experts are not stacked as mlx-lm stores them; repack it with `streamer repack`."
        )
    source = source_of.get(id(arr))
    if source is None:  # sanitize built it (stacked per-expert tensors, split a fused one)
        raise StreamerError(
            f"{ckpt.folder}: tensor '{name}' is not stored as mlx-lm computes with it (its "
            "sanitize converts it), so it cannot be streamed in place; repack it with "
            "`streamer repack`."
        )
    return ckpt.tensors[source]


def _check(info: TensorInfo, param: mx.array) -> None:
    stored = DTYPES[info.dtype][1]
    floating = mx.issubdtype(param.dtype, mx.floating)
    if info.shape != tuple(param.shape) or (
        mx.issubdtype(stored, mx.floating) != floating or (not floating and stored != param.dtype)
    ):
        raise StreamerError(
            f"{info.path}: tensor '{info.name}' is {info.dtype} {list(info.shape)} but config.json "
            f"implies {list(param.shape)} ({param.dtype}): the checkpoint is corrupt or "
            "config.json belongs to another model."
        )


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
