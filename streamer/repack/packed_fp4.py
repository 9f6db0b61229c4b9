"""compressed-tensors' MXFP4 pack (`mxfp4-pack-quantized`; Kimi K3 publishes its experts so) holds
MLX's own packing under other names: `weight_packed` is the weight's bytes (two FP4 codes a byte,
which mlx-lm reads as uint32 words) and `weight_scale` its E8M0 scales (one per 32 inputs).
mlx-lm's sanitize only renames and stacks them (kimi_k3's), so an expert's tensors are copied as
they are, under mlx-lm's kinds. The int4 pack (`pack-quantized`) is
not one: its zero point comes from sanitize (`biases = -8 * scales`), which converts each expert.
Nor is the NVFP4 pack: its `weight_global_scale`, which mlx-lm's sanitize does not read, leaves the
projection to sanitize, which then refuses it.
"""

from __future__ import annotations

import dataclasses

from ..io.safetensors import TensorInfo

FP4_PACKS = ("mxfp4-pack-quantized",)
KINDS = {"weight_packed": "weight", "weight_scale": "scales"}


def fp4_pack_kinds(source_config: dict) -> dict[str, str]:
    """Source kind -> mlx-lm's kind, for a checkpoint in an FP4 pack (none otherwise)."""
    quantization = source_config.get("quantization_config")
    if not isinstance(quantization, dict) or quantization.get("quant_method") != (
        "compressed-tensors"
    ):
        return {}
    return KINDS if quantization.get("format") in FP4_PACKS else {}


def as_words(info: TensorInfo) -> TensorInfo:
    """A `weight_packed` tensor (U8, [..., n]) as the uint32 words mlx-lm reads ([..., n / 4])."""
    if info.dtype != "U8" or info.shape[-1] % 4:
        return info  # not a pack: the dtype and shape checks name it
    return dataclasses.replace(info, dtype="U32", shape=(*info.shape[:-1], info.shape[-1] // 4))
