"""streamer decides how each saved layer of an MLX-quantized checkpoint is quantized as mlx-lm's
load_model does (`infer_quant_config`, plus the NVFP4 global scale), asking mlx-lm only where the
saved tensors are not what config.json's default gives (streamer/families/saved_quantization.py)."""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest
from conftest import ARCHS
from mlx.utils import tree_flatten
from mlx_lm.models.switch_layers import SwitchLinear
from mlx_lm.utils import _takes_global_scale, infer_quant_config

from streamer.families.architectures import build_model
from streamer.families.saved_quantization import saved_quantization
from streamer.families.transformers.spellings import normalize_config

# every (mode, bits, group size) MLX quantizes with, and two it refuses (only as a default)
QUANTIZED = [
    *(
        {"mode": "affine", "bits": b, "group_size": g}
        for b in (1, 2, 3, 4, 5, 6, 8)
        for g in (32, 64, 128)
    ),
    {"mode": "mxfp4", "bits": 4, "group_size": 32},
    {"mode": "nvfp4", "bits": 4, "group_size": 16},
    {"mode": "mxfp8", "bits": 8, "group_size": 32},
]
SAVED_AS = ("group_size", "bits", "mode")  # what config.json says a layer was saved with
REFUSED = [
    {"mode": "mxfp4", "bits": 4, "group_size": 64},
    {"mode": "affine", "bits": 4, "group_size": 16},
]
MODULES = {
    "linear": lambda: nn.Linear(256, 64, bias=False),
    "switch": lambda: SwitchLinear(256, 64, num_experts=4, bias=False),
    "embedding": lambda: nn.Embedding(64, 256),
}


def mlx_lm_decides(path: str, module: nn.Module, weights: dict) -> dict:
    """load_model's class_predicate for a layer with scales that config.json does not name."""
    params = infer_quant_config(path, module, weights)
    if f"{path}.global_scale" in weights and _takes_global_scale(module):
        params["global_scale"] = True
    return params


def as_parameters(decision: bool | dict, default: dict) -> dict:
    """What nn.quantize passes to_quantized for the decision (True: the default's)."""
    return dict(default) if decision is True else decision


def saved(module: nn.Module, path: str, **params) -> dict[str, mx.array]:
    return {f"{path}.{k}": v for k, v in tree_flatten(module.to_quantized(**params).parameters())}


@pytest.mark.parametrize("kind", MODULES)
@pytest.mark.parametrize("dtype", [mx.bfloat16, mx.float16, mx.float32])
def test_every_mode_bits_and_group_size_against_every_default(kind, dtype):
    """A layer saved with each quantization MLX has, read with each as config.json's default."""
    for params in QUANTIZED:
        module = MODULES[kind]()
        module.set_dtype(dtype)  # the source's dtype: affine scales keep it
        weights = saved(module, "layer", **params)
        for default in QUANTIZED + REFUSED:
            fresh = MODULES[kind]()  # float32, as streamer builds mlx-lm's model
            decision = saved_quantization("layer", fresh, weights, default)
            want = mlx_lm_decides("layer", fresh, weights)
            assert as_parameters(decision, default) == want, (params, default)
            # the shortcut is taken exactly where the default is how the layer was saved
            assert (decision is True) == (params == default), (params, default)


def test_a_global_scale_is_mlx_lm_s_to_decide():
    nvfp4 = {"group_size": 16, "bits": 4, "mode": "nvfp4"}
    weights = saved(MODULES["switch"](), "experts", **nvfp4, global_scale=True)
    assert "experts.global_scale" in weights
    decision = saved_quantization("experts", MODULES["switch"](), weights, nvfp4)
    assert decision == {**nvfp4, "global_scale": True}
    assert decision == mlx_lm_decides("experts", MODULES["switch"](), weights)


def test_layers_without_scales_or_to_quantized_stay_unquantized():
    weights = {"norm.weight": mx.zeros((256,)), "layer.weight": mx.zeros((64, 256))}
    default = QUANTIZED[0]
    assert saved_quantization("norm", nn.RMSNorm(256), weights, default) is False
    assert saved_quantization("layer", MODULES["linear"](), weights, default) is False


def compare_checkpoint(folder: Path) -> tuple[int, int]:
    """Every layer with scales that config.json's quantization does not name, decided by streamer
    and by mlx-lm on the weights load_model quantizes from: with config.json as written, then
    with each default it holds (its own and each of its per-module entries) and no per-module
    entries, as a checkpoint that records none would be read. Returns (shortcuts, decisions)."""
    config = normalize_config(json.loads((folder / "config.json").read_text()))
    model = build_model(config, folder)
    weights = {}
    for shard in sorted(folder.glob("*.safetensors")):
        weights.update(mx.load(str(shard)))  # lazily: nothing is read
    if hasattr(model, "sanitize"):
        weights = model.sanitize(weights)
    quantization = config["quantization"]
    defaults = []
    for entry in [quantization, *(v for v in quantization.values() if isinstance(v, dict))]:
        default = {"mode": "affine", **{k: entry[k] for k in SAVED_AS if k in entry}}
        defaults += [default] if default not in defaults else []
    shortcuts = decisions = 0
    leaves = tree_flatten(model.leaf_modules(), is_leaf=nn.Module.is_module)
    for named, default in [(quantization, defaults[0]), *(({}, d) for d in defaults)]:
        for path, module in leaves:
            if path in named or f"{path}.scales" not in weights:
                continue
            decision = saved_quantization(path, module, weights, default)
            want = mlx_lm_decides(path, module, weights)
            assert as_parameters(decision, default) == want, (path, default)
            shortcuts, decisions = shortcuts + (decision is True), decisions + 1
    return shortcuts, decisions


@pytest.mark.parametrize("arch", ARCHS)
def test_every_family_s_mlx_checkpoint(checkpoints, arch):
    shortcuts, _ = compare_checkpoint(checkpoints.mlx(arch))
    assert shortcuts > 0


@pytest.mark.parametrize(
    "arch, kwargs",
    [
        ("deepseek_v3", {"recipe": "mixed_3_6"}),
        ("qwen3_moe", {"recipe": "mixed_2_6"}),
        ("mixtral", {"bits": 8, "group_size": 32}),
        ("qwen3_moe", {"dtype": "float32"}),
        ("qwen3_moe", {"bits": 4, "group_size": 16, "mode": "nvfp4"}),
        ("qwen3_moe", {"bits": 4, "group_size": 32, "mode": "mxfp4"}),
        ("qwen3_moe", {"bits": 8, "group_size": 32, "mode": "mxfp8"}),
        ("gpt_oss", {"bits": 4, "group_size": 16, "mode": "nvfp4"}),
    ],
)
def test_mixed_recipes_modes_and_dtypes(checkpoints, arch, kwargs):
    shortcuts, _ = compare_checkpoint(checkpoints.mlx(arch, **kwargs))
    assert shortcuts > 0


def test_nvfp4_global_scales(checkpoints):
    """Its experts, each with its global scale, are mlx-lm's to decide; its other layers not."""
    shortcuts, decisions = compare_checkpoint(checkpoints.mlx_nvfp4_global_scales())
    assert 0 < shortcuts < decisions
