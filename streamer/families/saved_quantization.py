"""How a layer of an MLX-quantized checkpoint was quantized, decided as mlx-lm's loader decides it,
without importing mlx_lm.utils (and so transformers) for the layers quantized as config.json says.

`mlx_lm.utils.load_model` asks `infer_quant_config` about every layer that has scales in the
weights and is not named in config.json's `quantization`: it reads the group size and bits back
from the saved shapes, and the mode from whether the scales are uint8. Where a layer's saved
tensors have exactly the shapes and dtypes that `mx.quantize` gives its weight with config.json's
default (computed lazily: nothing is evaluated, nothing read), that default is what it would
answer, so the layer is quantized with it and mlx-lm is not asked. Any other layer, and any with an
NVFP4 global scale, is mlx-lm's to decide. tests/test_saved_quantization.py checks the two agree
over every mode, bits and group size MLX quantizes with and every family's MLX test checkpoint.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

SAVED = ("weight", "scales", "biases")  # in mx.quantize's order


def saved_quantization(
    path: str, module: nn.Module, weights: dict[str, mx.array], default: dict
) -> bool | dict:
    """What mlx-lm's load_model quantizes `module` at `path` with, for these weights (True:
    config.json's `default`; False: not quantized; else `to_quantized`'s parameters)."""
    if not hasattr(module, "to_quantized") or f"{path}.scales" not in weights:
        return False
    if f"{path}.global_scale" not in weights and _saved_as(path, module, weights, default):
        return True
    from mlx_lm.utils import _takes_global_scale, infer_quant_config  # imports transformers

    params = infer_quant_config(path, module, weights)
    # NVFP4 experts with one tensor scale each (mlx-lm's `global_scale`: Muse Spark's)
    if f"{path}.global_scale" in weights and _takes_global_scale(module):
        params["global_scale"] = True
    return params


def _saved_as(path: str, module: nn.Module, weights: dict[str, mx.array], default: dict) -> bool:
    """Whether the tensors saved for `path` are, in shape and dtype, what mx.quantize makes of
    `module`'s weight with `default`'s group size, bits and mode."""
    weight = module.get("weight")
    scales = weights[f"{path}.scales"]
    if not isinstance(weight, mx.array):
        return False
    # a float dtype the scales could have been computed from: their own where they are floats
    # (affine's), else the module's
    dtype = scales.dtype if mx.issubdtype(scales.dtype, mx.floating) else weight.dtype
    try:
        expected = mx.quantize(
            mx.zeros(weight.shape, dtype),
            group_size=default["group_size"],
            bits=default["bits"],
            mode=default.get("mode", "affine"),
        )
    except ValueError:  # a default MLX does not quantize this weight with: mlx-lm's to decide
        return False
    # exactly mx.quantize's tensors: no biases where it gives none
    saved = {name: weights[f"{path}.{name}"] for name in SAVED if f"{path}.{name}" in weights}
    return len(saved) == len(expected) and all(
        name in saved and saved[name].shape == array.shape and saved[name].dtype == array.dtype
        for name, array in zip(SAVED, expected)
    )
