"""Which MoE architectures stream, and how their checkpoints name expert tensors.

Architectures themselves come from mlx-lm (`mlx_lm.models.<model_type>`); this module only knows
how to find their expert containers (and record their routing) and how each download convention
names expert weights.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten
from mlx_lm.models.switch_layers import QuantizedSwitchLinear, SwitchGLU, SwitchLinear, SwitchMLP
from mlx_lm.utils import _get_classes, infer_quant_config

from .config import check_config
from .errors import StreamerError
from .stats import ExpertStats, Routing, RoutingRecorder

EXPERT_CONTAINERS = (SwitchGLU, SwitchMLP)
EXPERT_PROJECTIONS = (SwitchLinear, QuantizedSwitchLinear)


@dataclass(frozen=True)
class Architecture:
    # Hugging Face per-expert projection name -> mlx-lm's stacked projection name
    hf_projections: dict[str, str]
    # Hugging Face tensors that hold all of a layer's experts in another layout
    # (`{parent}.experts.{name}`, e.g. gpt-oss's MXFP4 `gate_up_proj_blocks`): converted expert by
    # expert with the model's sanitize.
    hf_fused: tuple[str, ...] = ()


_GLU = {"gate_proj": "gate_proj", "up_proj": "up_proj", "down_proj": "down_proj"}
SUPPORTED: dict[str, Architecture] = {
    "qwen3_moe": Architecture(_GLU),
    "qwen2_moe": Architecture(_GLU),
    "olmoe": Architecture(_GLU),
    "mixtral": Architecture({"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}),
    "deepseek_v2": Architecture(_GLU),
    "deepseek_v3": Architecture(_GLU),
    "kimi_k2": Architecture(_GLU),  # mlx-lm runs it as deepseek_v3
    "deepseek_v32": Architecture(_GLU),
    "glm4_moe": Architecture(_GLU),
    "glm4_moe_lite": Architecture(_GLU),
    "glm_moe_dsa": Architecture(_GLU),
    "qwen3_next": Architecture(_GLU),
    "qwen3_5_moe": Architecture(_GLU, hf_fused=("gate_up_proj", "down_proj")),
    "gpt_oss": Architecture(
        {},
        hf_fused=tuple(
            f"{p}_{k}" for p in ("gate_up_proj", "down_proj") for k in ("blocks", "scales", "bias")
        ),
    ),
}

# `{parent}.experts.{e}.{projection}.{kind}`: the Hugging Face per-expert convention.
HF_EXPERT_KEY = re.compile(
    r"^(?P<parent>.+)\.experts\.(?P<expert>\d+)\.(?P<proj>[^.]+)\.(?P<kind>[^.]+)$"
)
# `{parent}.experts.{name}`: a Hugging Face tensor holding every expert of a layer
# (see Architecture.hf_fused).
HF_FUSED_KEY = re.compile(r"^(?P<parent>.+)\.experts\.(?P<name>[^.]+)$")


def architecture(config: dict, where: Path | str) -> Architecture:
    model_type = config.get("model_type")
    if model_type not in SUPPORTED:
        raise StreamerError(
            f"{where}: model_type {model_type!r} is not supported for expert streaming. "
            f"Supported: {', '.join(sorted(SUPPORTED))}."
        )
    return SUPPORTED[model_type]


def normalize_config(config: dict) -> dict:
    """Accept newer transformers spellings that mlx-lm's model args do not read yet."""
    config = dict(config)
    rope = config.get("rope_parameters")
    if isinstance(rope, dict):
        if "rope_theta" not in config and "rope_theta" in rope:
            config["rope_theta"] = rope["rope_theta"]
        if "rope_scaling" not in config and rope.get("rope_type", "default") != "default":
            config["rope_scaling"] = rope
    if "torch_dtype" not in config and "dtype" in config:
        config["torch_dtype"] = config["dtype"]
    quantization_config = config.get("quantization_config")
    if "quantization" not in config and isinstance(quantization_config, dict):
        method = quantization_config.get("quant_method")
        if method == "mxfp4":  # gpt-oss: mlx-lm reads it as mxfp4 quantization
            config["quantization"] = config["quantization_config"] = {
                "group_size": 32,
                "bits": 4,
                "mode": "mxfp4",
            }
        elif method == "fp8" and list(quantization_config.get("weight_block_size", ())) != [32, 32]:
            # block-scaled FP8 (DeepSeek-V3, Kimi K2): the model's sanitize dequantizes it, as in
            # mlx-lm
            del config["quantization_config"]
    return config


def build_model(config: dict, where: Path | str) -> nn.Module:
    """An mlx-lm model for `config` with lazily initialised (never evaluated) weights."""
    check_config(config, where)
    model_class, args_class = _get_classes(config)
    try:
        return model_class(args_class.from_dict(config))
    except Exception as e:
        # what check_config cannot see (a combination of fields the model's asserts refuse):
        # mlx-lm's constructors raise no common error type
        raise StreamerError(
            f"{where}: the config does not describe a {config['model_type']} model mlx-lm can "
            f"build ({type(e).__name__}: {e}); download config.json again."
        ) from e


def expert_containers(model: nn.Module) -> dict[str, nn.Module]:
    """Module path -> expert container (SwitchGLU / SwitchMLP), in layer order."""
    found = [(path, m) for path, m in model.named_modules() if isinstance(m, EXPERT_CONTAINERS)]
    found.sort(key=lambda item: [int(t) if t.isdigit() else t for t in item[0].split(".")])
    if not found:
        raise StreamerError("the model has no MoE layers: nothing to stream.")
    return dict(found)


def container_projections(container: nn.Module) -> list[str]:
    return [
        name
        for name, child in container.children().items()
        if isinstance(child, EXPERT_PROJECTIONS)
    ]


def replace_modules(model: nn.Module, replacements: dict[str, nn.Module]) -> None:
    model.update_modules(tree_unflatten(list(replacements.items())))


def quantize_like_mlx_lm(model: nn.Module, config: dict, weights: dict[str, mx.array]) -> None:
    """Quantize `model`'s layers exactly as `mlx_lm.utils.load_model` would for these weights."""
    quantization = config.get("quantization")
    if quantization is None:
        return

    def predicate(path: str, module: nn.Module):
        if path in quantization:
            return quantization[path]
        if not hasattr(module, "to_quantized") or f"{path}.scales" not in weights:
            return False
        return infer_quant_config(path, module, weights)

    nn.quantize(
        model,
        group_size=quantization["group_size"],
        bits=quantization["bits"],
        mode=quantization.get("mode", "affine"),
        class_predicate=predicate,
    )


@contextmanager
def recording_routing(model: nn.Module, prefill: bool = False) -> Iterator[list[Routing]]:
    """The routing of every MoE layer of `model` (decode steps; with `prefill`, prompt tokens too)
    while the context lasts: a streamer model's own trace, or for any other mlx-lm model, its
    expert containers wrapped in RoutingRecorders for the duration."""
    handle = getattr(model, "streamer", None)
    if handle is not None:
        stats, containers = handle.stats, None
    else:
        containers = expert_containers(model)
        stats = ExpertStats(moe_layers=len(containers))
        recorders = {p: RoutingRecorder(c, stats, i) for i, (p, c) in enumerate(containers.items())}
        replace_modules(model, recorders)
    stats.trace, stats.trace_prefill = [], prefill
    try:
        yield stats.trace
    finally:
        stats.trace, stats.trace_prefill = None, False
        if containers is not None:
            replace_modules(model, containers)
