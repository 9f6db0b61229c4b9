"""The `quantization_config`s a source may not carry: those left once its spellings are read
(AWQ, GPTQ, NVFP4 packs, ...), which streamer cannot repack, and block-scaled FP8 or int4 packs
that the family's mlx-lm sanitize leaves as they are (or would misread: exponent-byte scales, or
fails on: per-tensor FP8 scales).
repack and plan refuse them alike, pull before it downloads the weights, and a load of a download
before it says to repack it."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from ..errors import StreamerError
from ..io.checkpoint import Checkpoint
from .transformers.quantization_methods import FP8_BLOCKS, unread_reason

FLOAT_SCALES = ("F32", "BF16", "F16")  # the scale dtypes mlx-lm's FP8 dequantize reads as numbers


def refuse_unread_quantization(config: dict, where: Path | str) -> None:
    """Refuse a normalized `config` whose `quantization_config` streamer does not read."""
    if "quantization" in config or "quantization_config" not in config:
        return
    method = config["quantization_config"].get("quant_method", "?")
    fmt = config["quantization_config"].get("format")
    # mlx-lm's loader reads some that streamer does not (AWQ, GPTQ): no claim about mlx-lm
    why = unread_reason(config)
    raise StreamerError(
        f"{where}: quantization_config ({method}{f' {fmt!r}' if fmt else ''}) is not "
        f"supported{f', {why}' if why else ''}; repack the bf16/fp16 checkpoint (optionally "
        "with --quantize) or an MLX-quantized one."
    )


def refuse_left_to_sanitize(model: nn.Module, published: dict, where: Path | str) -> None:
    """Refuse, from the published config.json alone, a quantization normalize_config leaves to
    the family's sanitize (block-scaled FP8, compressed-tensors' int4 pack) where `model`'s
    sanitize gives a stand-in projection's tensors (never evaluated) back as they are, as repack
    refuses those tensors once they are downloaded."""
    text = published.get("text_config")
    quantization = published.get(
        "quantization_config", text.get("quantization_config") if isinstance(text, dict) else None
    )
    probe = _probe(quantization) if isinstance(quantization, dict) else None
    if probe is None or not hasattr(model, "sanitize"):
        return
    try:
        kept = model.sanitize(probe)
    except Exception:  # noqa: BLE001 - a sanitize that needs the model's own names: repack tells
        return
    family = type(model).__module__.rsplit(".", 1)[1]
    if any(name.endswith("_scale_inv") for name in kept):  # (renamed, as a VLM's are)
        raise fp8_not_dequantized(family, where)
    if (
        quantization.get("quant_method") == "fp8"
        and quantization.get("weight_block_size", 0) is None
    ):
        # null (not absent: 128x128 blocks) is one scale a tensor, as transformers reads it
        refuse_per_tensor_fp8(model, where)
    if any(name.endswith("weight_packed") for name in kept):
        raise StreamerError(
            f"{where}: compressed-tensors int4 packs (`weight_packed`), which mlx-lm's model "
            f"reads for some families (DeepSeek-V3, Kimi K2) but not for {family}; repack a "
            "bf16 or MLX-quantized version."
        )


def refuse_per_tensor_fp8(model: nn.Module, where: Path | str) -> None:
    """Refuse per-tensor FP8 where the family's sanitize dequantizes 128x128 blocks only (DeepSeek's
    indexes the scale as a grid: "Too many indices", which repack took for a damaged download).
    The stand-in's scale is of shape (1,), as transformers saves one; a sanitize that fails on
    block scales too needs the model's own names, and is left to repack."""
    weight = mx.zeros((128, 128), mx.uint8)
    try:
        model.sanitize({"probe.weight": weight, "probe.weight_scale_inv": mx.ones((1, 1))})
    except Exception:  # noqa: BLE001 - as refuse_left_to_sanitize
        return
    try:
        model.sanitize({"probe.weight": weight, "probe.weight_scale_inv": mx.ones((1,))})
    except Exception:  # noqa: BLE001 - whatever the sanitize raises on a scale of one number
        family = type(model).__module__.rsplit(".", 1)[1]
        raise StreamerError(
            f"{where}: per-tensor FP8 (one weight_scale_inv for each tensor), which mlx-lm's "
            f"{family} cannot dequantize (it reads 128x128 block scales); use a bf16 or "
            "block-FP8 release, or an MLX-quantized one."
        ) from None


def refuse_per_tensor_scales(model: nn.Module, ckpt: Checkpoint, where: Path | str) -> None:
    """As refuse_per_tensor_fp8, from the headers: a scale of fewer than 2 dimensions is one
    number for its whole tensor (block scales are a grid), whatever config.json says."""
    if hasattr(model, "sanitize") and any(
        info.name.endswith("_scale_inv") and len(info.shape) < 2 for info in ckpt.tensors.values()
    ):
        refuse_per_tensor_fp8(model, where)


def _probe(quantization: dict) -> dict[str, mx.array] | None:
    """Stand-ins of one projection's tensors in a quantization left to sanitize (None: another)."""
    method = quantization.get("quant_method")
    if method == "fp8" and quantization.get("weight_block_size") in FP8_BLOCKS:
        return {
            "probe.weight": mx.zeros((128, 128), mx.uint8),
            "probe.weight_scale_inv": mx.ones((1, 1)),
        }
    if method == "compressed-tensors" and quantization.get("format") == "pack-quantized":
        return {
            "probe.weight_packed": mx.zeros((128, 16), mx.int32),
            "probe.weight_scale": mx.ones((128, 4), mx.bfloat16),
            "probe.weight_shape": mx.array([128, 128], mx.int32),
        }
    return None


def refuse_fp8_misread(
    ckpt: Checkpoint, config: dict, sanitized: dict[str, mx.array], where: Path
) -> None:
    """Refuse block-scaled FP8 that the family's sanitize leaves as it is, or would multiply by its
    scales' exponent bytes: `weight_scale_inv` in F8_E8M0 (or U8) is 2**(byte - 127) each, as
    transformers reads it, where mlx-lm's dequantize takes the byte for the number. Not where
    config.json's quantization reads them as MLX's modes (MXFP8 keeps the exponent bytes)."""
    if any(name.endswith("_scale_inv") for name in sanitized):
        raise fp8_not_dequantized(config["model_type"], where)
    if "quantization" in config:
        return
    for info in ckpt.tensors.values():
        if info.name.endswith("_scale_inv") and info.dtype not in FLOAT_SCALES:
            raise StreamerError(
                f"{info.path}: tensor '{info.name}' holds FP8 block scales as {info.dtype} "
                f"exponents, which mlx-lm's {config['model_type']} sanitize multiplies as plain "
                "numbers (it would give wrong weights); repack a bf16 or MLX-quantized version."
            )


def fp8_not_dequantized(family: str, where: Path | str) -> StreamerError:
    return StreamerError(
        f"{where}: FP8 weights with block scales, which mlx-lm's model dequantizes for some "
        f"families (DeepSeek-V3, Kimi K2, MiniMax-M2, ...) but not for {family}; repack a bf16 "
        "or MLX-quantized version."
    )
