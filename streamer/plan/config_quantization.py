"""Which layers a plan from config.json alone quantizes, with no weights to show it: those the
config's quantization covers (for a Hugging Face method mlx-lm reads as an MLX mode, less the
modules the model's recipe or the published method leaves out: gpt-oss's MXFP4 quantizes the
experts only), then `--quantize`'s, as `mlx_lm.convert` quantizes the rest: what the download's
repack holds."""

from __future__ import annotations

import mlx.nn as nn

from ..families.architectures import (
    expert_containers,
    quantize_like_mlx_lm,
    quantize_like_mlx_lm_convert,
)
from ..families.transformers.quantization_methods import left_unquantized


def quantize_as_config(
    model: nn.Module, config: dict, published: dict, quantize: tuple | None
) -> None:
    """Quantize `model` (built from `config`, the normalized `published` config.json) as its
    download's repack will be, `quantize` (bits, group size[, mode]) being repack's --quantize."""
    if "quantization" in config:
        # as mlx-lm loads it, except that no weights say which layers are: every layer that can
        # be, as mlx_lm.convert left those whose width its group size does not divide
        # (per-module entries still win), less those left_unquantized names
        group_size = config["quantization"]["group_size"]
        left = left_unquantized(model, published, expert_containers(model))
        quantize_like_mlx_lm(
            model,
            config,
            quantizable=lambda path, m: (
                hasattr(m, "to_quantized")
                and m.weight.shape[-1] % group_size == 0
                and not left(path, m)
            ),
        )
    if quantize and "quantization" not in published:  # an MLX-quantized one is planned as it is
        bits, group_size, *mode = quantize  # repack's Quantize
        quantize_like_mlx_lm_convert(model, config, group_size, bits, mode[0] if mode else "affine")
