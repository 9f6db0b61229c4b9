"""config.json's `quantization_config` methods mlx-lm maps onto MLX's modes (given as
`quantization`) or leaves to a family's sanitize (block-scaled FP8), and the variants of them that
mlx-lm would read wrongly, left in place for the refusals (families/unread_quantization.py)."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Collection

import mlx.nn as nn

from ..config.common_fields import mlx_refuses, with_mode_defaults
from ..mlx_lm_models import package_version

FP8_BLOCKS = (None, [128, 128])  # the blocks mlx-lm's sanitizes dequantize (null: one scale)
# model types whose mlx-lm sanitize reads ModelOpt's NVFP4 scales (`weight_scale_2`: global_scale)
MODELOPT_NVFP4_TYPES = ("muse_spark",)
# where each published method lists the modules it leaves unquantized
LEFT_OUT = ("modules_to_not_convert", "ignore", "exclude_modules")


def quantization_as_mlx(config: dict) -> dict:
    """A quantization_config mlx-lm reads as one of MLX's modes, given as `quantization` (from the
    text_config where only that holds it); the others left as they are, for the checks after."""
    text = config.get("text_config")
    if "quantization_config" not in config and isinstance(text, dict):
        if "quantization_config" in text:  # as mlx-lm's loader looks for it
            config["quantization_config"] = text["quantization_config"]
    if isinstance(config.get("quantization"), dict):  # null group sizes as MLX reads them
        config["quantization"] = with_mode_defaults(config["quantization"])
    quantization_config = config.get("quantization_config")
    if "quantization" in config or not isinstance(quantization_config, dict):
        return config
    if unread_reason(config):
        return config
    method = quantization_config.get("quant_method")
    if method in ("mxfp4", "mxfp8"):  # gpt-oss's mxfp4; mlx-lm reads both as MLX's modes
        config["quantization"] = config["quantization_config"] = {
            "group_size": 32,
            "bits": 4 if method == "mxfp4" else 8,
            "mode": method,
        }
    elif method == "modelopt":
        # NVIDIA ModelOpt's NVFP4 (Muse Spark's): MLX's nvfp4, each expert's tensor scale
        # (`weight_scale_2`) made mlx-lm's `global_scale` by the family's sanitize
        settings = quantization_config.get("quantization", quantization_config)
        config["quantization"] = config["quantization_config"] = {
            "group_size": settings.get("group_size", 16),
            "bits": 4,
            "mode": "nvfp4",
        }
    elif method == "compressed-tensors":  # mlx-lm's reading of the format (int4 or MXFP4 packs)
        from mlx_lm.utils import _compressed_tensors_quantization  # imports transformers

        try:
            packed = _compressed_tensors_quantization(quantization_config)
        except ValueError:
            return config
        config["quantization"] = config["quantization_config"] = packed
    elif method == "fp8" and quantization_config.get("weight_block_size") in FP8_BLOCKS:
        # block-scaled FP8 (DeepSeek-V3, Kimi K2): the model's sanitize dequantizes it, as
        # in mlx-lm (a null block size too: list(None) was a TypeError)
        del config["quantization_config"]
    elif method == "fp8" and quantization_config.get("scale_fmt") == "ue8m0":
        # power-of-two scales over 32x32 tiles (DeepSeek-V4.1) are MXFP8, and its FP4 experts
        # MXFP4: mlx-lm keeps them packed, each module's mode read from its weights
        config["quantization"] = config["quantization_config"] = {
            "group_size": 32,
            "bits": 8,
            "mode": "mxfp8",
        }
    return config


def unread_reason(config: dict) -> str | None:
    """Why the variant of a method mlx-lm names that `config`'s quantization_config gives is not
    read (mlx-lm would misread it, or cannot load it either), or None."""
    quantization_config = config["quantization_config"]
    method = quantization_config.get("quant_method")
    if method == "modelopt":
        return _unread_modelopt(quantization_config, config.get("model_type"))
    fmt = quantization_config.get("format")
    if method == "compressed-tensors" and fmt == "nvfp4-pack-quantized":
        return (
            f"as no sanitize of mlx-lm {package_version()} reads its experts' "
            "`weight_global_scale`, so mlx-lm cannot load it either (nothing to be exact against)"
        )
    if method == "compressed-tensors" and fmt == "pack-quantized":
        unlike = _unlike_int4(quantization_config)
        return unlike and (
            "as mlx-lm reads its packs as symmetric 4-bit integers in groups MLX quantizes with, "
            f"not with {unlike}"
        )
    blocks = quantization_config.get("weight_block_size")
    if method == "fp8" and blocks not in FP8_BLOCKS:
        if blocks == [32, 32] and quantization_config.get("scale_fmt") == "ue8m0":
            return None
        return (
            "as mlx-lm dequantizes FP8 in 128x128 blocks (or reads 32x32 ones with scale_fmt "
            f"ue8m0 as MXFP8), not weight_block_size {blocks}"
        )
    return None


# compressed-tensors' weight settings whose packs mlx-lm's sanitize reads (as codes minus 8 times
# the group's scale): the setting -> the values that read so (absent: its default)
INT4_PACK = {
    "num_bits": (4,),
    "type": ("int", None),
    "symmetric": (True, None),
    "strategy": ("group", None),
    "actorder": (None, False, "static", "weight"),  # "group" saves a `weight_g_idx` order
}


def _unlike_int4(quantization_config: dict) -> str | None:
    """The first weight setting of an int4 pack that mlx-lm's sanitize does not read, as
    `name value`."""
    groups = quantization_config.get("config_groups")
    for group in groups.values() if isinstance(groups, dict) else ():
        weights = group.get("weights") if isinstance(group, dict) else None
        if not isinstance(weights, dict):
            continue
        for name, values in INT4_PACK.items():
            if weights.get(name) not in values:
                return f"{name} {weights.get(name)!r}"
        size = weights.get("group_size")
        if type(size) is not int or size < 1 or mlx_refuses(size, 4, "affine"):
            return f"group_size {size!r}"  # MLX's affine groups: mlx-lm keeps the pack's
    return None


def _unread_modelopt(quantization_config: dict, model_type: str | None) -> str | None:
    """Why mlx-lm cannot load a ModelOpt checkpoint (its settings nested under `quantization` in
    hf_quant_config.json's form): an algorithm other than NVFP4, or a model whose sanitize leaves
    the NVFP4 scales unread (so its loader finds `weight_scale` where the model has none)."""
    settings = quantization_config.get("quantization", quantization_config)
    algorithm = settings.get("quant_algo") if isinstance(settings, dict) else None
    if algorithm != "NVFP4":
        return f"as mlx-lm reads ModelOpt's NVFP4 only, not quant_algo {algorithm!r}"
    if model_type not in MODELOPT_NVFP4_TYPES:
        return (
            f"as no sanitize of mlx-lm {package_version()} but {', '.join(MODELOPT_NVFP4_TYPES)}'s "
            f"reads its `weight_scale` and `weight_scale_2`, so mlx-lm cannot load it either"
        )
    return None


def left_unquantized(
    model: nn.Module, published: dict, experts: Collection[str]
) -> Callable[[str, nn.Module], bool]:
    """Whether a layer is left unquantized where no weights say so (a plan of config.json alone):
    the model's own recipe refuses it, as mlx_lm.convert then leaves it, or the published
    quantization_config lists it among the modules it leaves out (gpt-oss's
    `modules_to_not_convert`, compressed-tensors' `ignore`, ModelOpt's `exclude_modules`: globs,
    `re:` patterns or names, also under a vision-language wrapper's prefix), or, compressed-tensors'
    groups targeting Linear layers, it is none (an embedding). Those lists name Hugging Face's
    modules: never the routed experts (`experts`, mlx-lm's containers), which are what these
    methods quantize, and whose mlx-lm names (`mlp.switch_mlp.gate_proj`) a pattern for a dense
    MLP's (`re:.*mlp\\.gate.*`) would take."""
    recipe = getattr(model, "quant_predicate", None) or (lambda *_: True)
    text = published.get("text_config")
    settings = published.get(
        "quantization_config", text.get("quantization_config") if isinstance(text, dict) else None
    )
    settings = settings.get("quantization", settings) if isinstance(settings, dict) else {}
    lists = [names for key in LEFT_OUT if isinstance(names := settings.get(key), list)]
    patterns = [p for names in lists for p in names if isinstance(p, str)]
    linear_only = "config_groups" in settings

    def left(path: str, module: nn.Module) -> bool:
        if recipe(path, module) is False:
            return True
        if any(path.startswith(f"{container}.") for container in experts):
            return False
        untargeted = linear_only and not isinstance(module, nn.Linear)
        return untargeted or any(_names(p, path) for p in patterns)

    return left


def _names(pattern: str, path: str) -> bool:
    """Whether a left-out entry names the module at `path` or one holding it."""
    if pattern.startswith("re:"):  # compressed-tensors' regular expressions, matched from the start
        return re.match(pattern[3:], path) is not None
    forms = (pattern, f"{pattern}.*", f"*.{pattern}", f"*.{pattern}.*")
    return any(fnmatch.fnmatchcase(path, form) for form in forms)
