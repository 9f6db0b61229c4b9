"""Which source dtypes stand for a model parameter's dtype, and the refusal of one that cannot (or
of two source tensors for the same expert weights, or of one that sanitize leaves unread)."""

from __future__ import annotations

import mlx.core as mx

from ..errors import StreamerError
from ..io.safetensors import DTYPES, MLX_TO_SAFETENSORS, TensorInfo

MODEL_FLOATS = (mx.float32, mx.float16, mx.bfloat16)


def compatible(got: mx.Dtype, expected: mx.Dtype) -> bool:
    """A float parameter takes any float width MLX computes with (it is cast; float64 is not one:
    MLX runs it on no GPU); integer data must match."""
    if mx.issubdtype(expected, mx.floating):
        return got in MODEL_FLOATS
    return got == expected


def describe(dtype: mx.Dtype) -> str:
    return (
        "a floating-point tensor (F32, F16 or BF16)"
        if mx.issubdtype(dtype, mx.floating)
        else MLX_TO_SAFETENSORS.get(dtype, str(dtype))
    )


def check_dtype(info: TensorInfo, expected: mx.Dtype) -> None:
    if not compatible(DTYPES[info.dtype][1], expected):
        raise StreamerError(
            f"{info.path}: tensor '{info.name}' is {info.dtype} but config.json implies "
            f"{describe(expected)}: the checkpoint is corrupt or config.json belongs to another "
            "model."
        )


def check_once(first: TensorInfo | None, second: TensorInfo, what: str) -> None:
    """Refuse two source tensors for the same expert weights (mlx-lm would keep one silently)."""
    if first is not None:
        raise StreamerError(
            f"{second.path.parent}: tensors '{first.name}' and '{second.name}' both hold {what} "
            "weights: the checkpoint is damaged or mixes two conversions; download it again."
        )


def check_read(sources: dict[str, TensorInfo], kinds: set[str], read: tuple[str, ...]) -> None:
    """Refuse an expert's source tensor (by its kind) that sanitize gives back as it is, under a
    kind no expert parameter has (`read`): zero points, an order (`weight_g_idx`), activation
    scales. mlx-lm's loader refuses them too; copying the rest would give wrong weights."""
    for kind in sorted(kinds & sources.keys() - set(read)):
        raise StreamerError(
            f"{sources[kind].path}: tensor '{sources[kind].name}' is left unread by mlx-lm's "
            "sanitize, so mlx-lm cannot load this checkpoint either; repack a bf16 or "
            "MLX-quantized version."
        )
