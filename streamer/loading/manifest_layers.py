"""A repacked folder's MoE layers against the model mlx-lm builds for its config: each layer's
record holds exactly the tensors the model expects, and is quantized as the manifest says."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from ..errors import StreamerError
from ..families.architectures import projection_tensors
from ..io.manifest import MANIFEST_FILE, MoeLayer
from ..io.safetensors import DTYPES


def quantized(container: nn.Module, projection: str, params: dict, folder: Path) -> nn.Module:
    """The container's projection quantized as the manifest says (mlx-lm's to_quantized)."""
    try:
        return container[projection].to_quantized(**params)
    except (TypeError, ValueError) as e:
        raise StreamerError(
            f"{folder / MANIFEST_FILE}: quantization {params} of {projection} is invalid ({e}); "
            "repack the model."
        ) from e


def check_layer(folder: Path, index: int, layer: MoeLayer, container: nn.Module) -> int:
    """The manifest's expert record must hold exactly the tensors the model expects, in its shapes:
    a hand-edited or mismatched manifest is refused here rather than computing with garbage.
    Returns the model's number of experts in the layer (a shard's file holds some of them)."""
    expected = projection_tensors(container)
    total = next(iter(expected.values())).shape[0]
    ids = layer.expert_ids
    if (layer.num_experts != total) if ids is None else (ids[-1] >= total):
        held = f"{layer.num_experts} experts" if ids is None else f"expert {ids[-1]}"
        raise StreamerError(
            f"{folder / MANIFEST_FILE}: MoE layer {index} ({layer.module}) holds {held} but the "
            f"model expects {total} experts; repack the model."
        )
    for tensor in layer.tensors:
        param = expected.pop(tensor.name, None)
        floating = mx.issubdtype(DTYPES[tensor.dtype][1], mx.floating)
        if (
            param is None
            or tuple(param.shape) != (total, *tensor.shape)
            or floating != mx.issubdtype(param.dtype, mx.floating)
        ):
            want = "no such tensor" if param is None else f"{list(param.shape)} ({param.dtype})"
            raise StreamerError(
                f"{folder / MANIFEST_FILE}: MoE layer {index} ({layer.module}) tensor "
                f"{tensor.name} is {layer.num_experts} x {list(tensor.shape)} {tensor.dtype} but "
                f"the model expects {want}; repack the model."
            )
    if expected:
        raise StreamerError(
            f"{folder / MANIFEST_FILE}: MoE layer {index} ({layer.module}) lacks tensor "
            f"{next(iter(expected))}; repack the model."
        )
    return total
