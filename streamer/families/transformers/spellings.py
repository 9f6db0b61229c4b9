"""config.json as transformers 5 writes it, read as mlx-lm's model args expect: renamed fields,
RoPE settings inside `rope_parameters`, quantization_config methods mlx-lm maps onto MLX modes."""

from __future__ import annotations

import dataclasses
import sys
import types
from collections.abc import Callable

from ...errors import StreamerError
from ...io.json_file import decode_tagged_floats
from ..mlx_lm_models import models_without_package_init
from ..model_types import mlx_lm_classes
from .defaults import fill_defaults
from .longcat_mimo import LONGCAT_FLASH, MIMO_V2_FLASH, WRITTEN_BY_TRANSFORMERS
from .quantization_methods import quantization_as_mlx
from .renamed_models import as_published

with models_without_package_init():
    from mlx_lm.models.base import BaseModelArgs

# Fields transformers 5 writes under another name than mlx-lm's model args read (its configs'
# `attribute_map`): mlx-lm's name -> transformers 5's.
TRANSFORMERS_ALIASES = {"num_experts": "num_local_experts"}
# Fields transformers 5 keeps inside `rope_parameters`, which mlx-lm reads at the top level.
ROPE_FIELDS = ("rope_theta", "partial_rotary_factor")
# Layer kinds transformers 5 names otherwise in `layer_types`: model_type -> its name -> mlx-lm's.
LAYER_TYPES = {"granitemoehybrid": {"linear_attention": "mamba", "full_attention": "attention"}}
# Fields transformers 5 writes as null where mlx-lm spells the meaning: model_type -> field -> it.
NULL_MEANS = {"granitemoehybrid": {"position_embedding_type": "nope"}}  # no RoPE, as Granite 4.0 H
# Fields mlx-lm's model args require that transformers 5 does not write for a family because its
# model fixes them: model_type -> field -> the value it computes with, from the config.
TRANSFORMERS_FIXED: dict[str, dict[str, Callable[[dict], object]]] = {
    # rope_parameters' default; every layer MoE, so the dense layers' size is never used
    "solar_open": {
        "partial_rotary_factor": lambda _: 1.0,
        "first_k_dense_replace": lambda _: 0,
        "intermediate_size": lambda config: config.get("moe_intermediate_size"),
    },
    # MiniMax-M2: rotary_dim from rope_parameters' share of head_dim; no shared expert
    "minimax_m2": {
        "rotary_dim": lambda config: int(
            config.get("head_dim", config["hidden_size"] // config["num_attention_heads"])
            * config.get("rope_parameters", {}).get("partial_rotary_factor", 1.0)
        ),
        "shared_intermediate_size": lambda _: 0,
    },
    "qwen3_vl_moe": {"norm_topk_prob": lambda _: True},  # its text model renormalizes the top-k
    "kimi_linear": {"rope_theta": lambda _: 10000.0},  # never used: its MLA has no RoPE
    "glm_moe_dsa": {
        "topk_method": lambda _: "noaux_tc",
        "scoring_func": lambda _: "sigmoid",
        "moe_layer_freq": lambda _: 1,
    },
    "longcat_flash": LONGCAT_FLASH,
    "mimo_v2_flash": MIMO_V2_FLASH,
}


# Values published checkpoints write as integers where transformers 5's strict config classes
# declare a float, so that loading the tokenizer (which builds the config class) fails:
# model_type -> (section of config.json, field). DBRX's config.json has
# "moe_normalize_expert_weights": 1.
INTEGERS_AS_FLOATS = {"dbrx": (("ffn_config", "moe_normalize_expert_weights"),)}

# Fields mlx-lm reads at the top level of a vision-language config that transformers 5 keeps only
# in its text_config: model_type -> fields.
TEXT_FIELDS_ON_TOP = {"gemma4": ("vocab_size",)}


def normalize_config(config: dict) -> dict:
    """Accept newer transformers spellings that mlx-lm's model args do not read yet (checkpoints
    that transformers 5 itself writes), in config.json and in a vision-language model's
    text_config."""
    config = fill_defaults(as_published(decode_tagged_floats(config)))
    model_type = config.get("model_type")
    config = _spell_fields(config, _args_fields(config), model_type)
    if isinstance(config.get("text_config"), dict):
        config["text_config"] = _spell_fields(
            config["text_config"], _text_args_fields(config), model_type
        )
        for name in TEXT_FIELDS_ON_TOP.get(model_type, ()):
            if name not in config and name in config["text_config"]:
                config[name] = config["text_config"][name]
    for section, name in INTEGERS_AS_FLOATS.get(model_type, ()):
        values = config.get(section)
        if isinstance(values, dict) and type(values.get(name)) is int:
            config[section] = {**values, name: float(values[name])}
    if "torch_dtype" not in config and "dtype" in config:
        config["torch_dtype"] = config["dtype"]
    return quantization_as_mlx(config)


def _args_fields(config: dict) -> dict[str, dataclasses.Field]:
    """The fields of mlx-lm's model args for `config` (none for a config it cannot run: the
    checks that follow say why)."""
    try:
        _, args_class = mlx_lm_classes(config)
    except StreamerError:
        return {}
    return {f.name: f for f in dataclasses.fields(args_class)}


def _spell_fields(
    config: dict, fields: dict[str, dataclasses.Field], model_type: str | None
) -> dict:
    """`config`'s fields in mlx-lm's spelling, where `fields` are what its model args read."""
    config = dict(config)
    for name, alias in TRANSFORMERS_ALIASES.items():
        if name in fields and name not in config and alias in config:
            config[name] = config[alias]
    layer_kinds = config.get("mlp_layer_types")  # transformers 5: "dense" or "sparse" per layer
    if "is_moe_layer" in fields and "is_moe_layer" not in config and isinstance(layer_kinds, list):
        config["is_moe_layer"] = [kind == "sparse" for kind in layer_kinds]
    for name, meaning in NULL_MEANS.get(model_type, {}).items():
        if name in config and config[name] is None:
            config[name] = meaning
    per_layer = config.get("per_layer_config")  # transformers 5: {"layer": {field: value}}
    if "global_head_dim" in fields and "global_head_dim" not in config and per_layer:
        # Gemma 4: the full-attention layers' head_dim, which mlx-lm reads as global_head_dim
        full = [
            str(i)
            for i, kind in enumerate(config.get("layer_types", ()))
            if kind == "full_attention"
        ]
        dims = {per_layer[i]["head_dim"] for i in full if "head_dim" in per_layer.get(i, {})}
        if len(dims) == 1:
            config["global_head_dim"] = dims.pop()
    if "linear_attn_config" in fields and "linear_attn_config" not in config:
        config.update(_linear_attn_config(config))
    if "first_k_dense_replace" in fields and "first_k_dense_replace" not in config and layer_kinds:
        dense = next((i for i, kind in enumerate(layer_kinds) if kind != "dense"), len(layer_kinds))
        if all(kind == "sparse" for kind in layer_kinds[dense:]):
            config["first_k_dense_replace"] = dense
    kinds = LAYER_TYPES.get(model_type, {})
    if kinds and isinstance(config.get("layer_types"), list):
        config["layer_types"] = [kinds.get(kind, kind) for kind in config["layer_types"]]
    rope = config.get("rope_parameters")
    if isinstance(rope, dict):
        for name in ROPE_FIELDS:
            if name not in config and name in rope:
                config[name] = rope[name]
        if "rope_scaling" not in config and rope.get("rope_type", "default") != "default":
            config["rope_scaling"] = rope
    own = WRITTEN_BY_TRANSFORMERS.get(model_type, ())
    written = bool(own) and all(name in config for name in own)  # then its values decide
    for name, value in TRANSFORMERS_FIXED.get(model_type, {}).items():
        if written or name not in config:
            config[name] = value(config)
    scaling = fields.get("rope_scaling")
    if scaling and "rope_scaling" not in config and scaling.default is dataclasses.MISSING:
        config["rope_scaling"] = None  # a field some models' args require: None is "no scaling"
    return config


def _linear_attn_config(config: dict) -> dict:
    """Kimi Linear's `linear_attn_config` (1-based layer numbers) from transformers 5's
    `layer_types` and `linear_*` fields; nothing where they are not all there."""
    kinds = config.get("layer_types")
    sizes = ("linear_head_dim", "linear_num_heads", "linear_conv_kernel_dim")
    if not isinstance(kinds, list) or not all(name in config for name in sizes):
        return {}
    return {
        "linear_attn_config": {
            "full_attn_layers": [i + 1 for i, kind in enumerate(kinds) if kind == "full_attention"],
            "kda_layers": [i + 1 for i, kind in enumerate(kinds) if kind == "linear_attention"],
            "head_dim": config["linear_head_dim"],
            "num_heads": config["linear_num_heads"],
            "short_conv_kernel_size": config["linear_conv_kernel_dim"],
        }
    }


def _text_args_fields(config: dict) -> dict[str, dataclasses.Field]:
    """What a vision-language model's text args may read: the fields of the model args classes in
    mlx-lm's module for it and in the model modules it imports (qwen3_vl_moe's text model is
    qwen3_moe's)."""
    try:
        _, args_class = mlx_lm_classes(config)
    except StreamerError:
        return {}
    module = sys.modules[args_class.__module__]
    spaces = [vars(module)] + [
        vars(m) for m in vars(module).values() if isinstance(m, types.ModuleType)
    ]
    fields = {}
    for space in spaces:
        for value in space.values():
            if (
                isinstance(value, type)
                and issubclass(value, BaseModelArgs)
                and value is not args_class
                and dataclasses.is_dataclass(value)
            ):
                fields.update({f.name: f for f in dataclasses.fields(value)})
    return fields
