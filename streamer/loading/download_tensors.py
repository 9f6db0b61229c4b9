"""One MoE layer's expert tensors where an MLX download keeps them: found in the shards as mlx-lm
would compute with them, checked against the container mlx-lm builds for config.json."""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn

from ..errors import StreamerError
from ..families.architectures import (
    container_projections,
    expert_container_of,
    projection_tensors,
    quantization_of,
)
from ..io.checkpoint import Checkpoint
from ..io.safetensors import DTYPES, TensorInfo, itemsize

KINDS = ("weight", "scales", "biases", "global_scale", "bias")  # as repack.sources.KIND_ORDER


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
        Metal kernel binding may not (see docs/design.md, A download in place)."""
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


def in_place_layer(
    ckpt: Checkpoint,
    module: str,
    container: nn.Module,
    weights: dict[str, mx.array],
    source_of: dict[int, str],
) -> InPlaceLayer:
    expected = projection_tensors(container)
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
    placed = {t.name for t in tensors}
    extra = sorted(
        n
        for n in weights
        if n.startswith(f"{module}.")  # first: a cheap test over every layer's tensors
        and expert_container_of(n, {module: container})
        and n[len(module) + 1 :] not in placed
    )
    if expected or extra:
        what = f"lacks '{module}.{next(iter(expected))}'" if expected else f"holds '{extra[0]}'"
        raise StreamerError(
            f"{ckpt.folder}: the checkpoint {what}, which a {ckpt.config.get('model_type')} model "
            "with this config.json does not have: the download is incomplete or config.json "
            "belongs to another model."
        )
    return InPlaceLayer(module, num_experts, quantization_of(container), tuple(tensors))


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
