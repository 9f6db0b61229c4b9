"""Which layers a plan from config.json alone quantizes, with no weights to show it: those the
config's quantization covers (for a Hugging Face method mlx-lm reads as an MLX mode, less the
modules its `modules_to_not_convert` names: gpt-oss's MXFP4 quantizes the experts only), then
`--quantize`'s, as `mlx_lm.convert` quantizes the rest: what the download's repack holds."""

from __future__ import annotations

from fnmatch import fnmatchcase

import mlx.nn as nn

from ..families.architectures import quantize_like_mlx_lm, quantize_like_mlx_lm_convert


def quantize_as_config(
    model: nn.Module, config: dict, published: dict, quantize: tuple | None
) -> None:
    """Quantize `model` (built from `config`, the normalized `published` config.json) as its
    download's repack will be, `quantize` (bits, group size[, mode]) being repack's --quantize."""
    if "quantization" in config:
        # as mlx-lm loads it, except that no weights say which layers are: every layer that can
        # be, as mlx_lm.convert left those whose width its group size does not divide
        # (per-module entries still win), less those the published method leaves unconverted
        group_size = config["quantization"]["group_size"]
        unconverted = _not_converted(published.get("quantization_config"))
        quantize_like_mlx_lm(
            model,
            config,
            quantizable=lambda path, m: (
                hasattr(m, "to_quantized")
                and m.weight.shape[-1] % group_size == 0
                and not _named(path, unconverted)
            ),
        )
    if quantize and "quantization" not in published:  # an MLX-quantized one is planned as it is
        bits, group_size, *mode = quantize  # repack's Quantize
        quantize_like_mlx_lm_convert(model, config, group_size, bits, mode[0] if mode else "affine")


def _not_converted(quantization_config) -> list[str]:
    """The module patterns a published quantization_config leaves unquantized (none if it names
    none, or not as text)."""
    if not isinstance(quantization_config, dict):
        return []
    patterns = quantization_config.get("modules_to_not_convert")
    return [p for p in patterns if isinstance(p, str)] if isinstance(patterns, list) else []


def _named(path: str, patterns: list[str]) -> bool:
    """Whether a module is one a pattern of `modules_to_not_convert` names, or lies within one
    (transformers' glob over module names: `model.layers.*.self_attn`)."""
    return any(fnmatchcase(path, p) or fnmatchcase(path, f"{p}.*") for p in patterns)
