"""Every field a config gives, against the type mlx-lm's ModelArgs for its model_type declares."""

from __future__ import annotations

import dataclasses
import math
import sys
import types
import typing

from .field_error import bad_field
from .ranges import EXPERT_COUNTS, TOP_K, null_computed

# Fields every model reads as a number: a null one reaches the model's arithmetic (a TypeError or
# MLX's ValueError in the first forward pass) where the args class requires it. Other nulls can
# mean "not given" to the model (DeepSeek-V2-Lite's q_lora_rank), so they are left to it.
NEVER_NULL = (*TOP_K, *EXPERT_COUNTS, "rope_theta", "rms_norm_eps")
# Fields whose null replaces the default mlx-lm's args give them and reaches the router's
# arithmetic, where ranges.null_computed says it does
ROUTER_NUMBERS = ("n_group", "topk_group", "routed_scaling_factor")
# Fields a model reads per layer from a list, one entry per layer, though its ModelArgs annotates
# them a number: mlx-lm's hunyuan (`_int_or_list`), for Hunyuan-A13B's published config.json,
# which lists moe_topk and num_shared_expert per layer.
PER_LAYER_LISTS: dict[str, tuple[str, ...]] = {"hunyuan": ("moe_topk", "num_shared_expert")}
UNIONS = (typing.Union, types.UnionType)  # Optional[int], and int | list[int]
# What mlx-lm's vision-language wrappers name the args class their text_config is built with:
# qwen3_5's; llama4's, kimi_vl's, kimi_k3's, minimax_m3_vl's, muse_spark's
TEXT_ARGS_NAMES = ("TextModelArgs", "TextArgs")


def text_args_class(model_class: type):
    """The text model's args class of a vision-language wrapper (qwen3_5_moe's `text_config`)."""
    for cls in model_class.__mro__:
        module = sys.modules.get(cls.__module__)
        args = next((getattr(module, n) for n in TEXT_ARGS_NAMES if hasattr(module, n)), None)
        if args is not None:
            return args
    return None


def check_declared_types(config: dict, args_class: type, where, prefix: str = "") -> None:
    hints = typing.get_type_hints(args_class)
    model_file = args_class.__module__.rsplit(".", 1)[1]
    for name in PER_LAYER_LISTS.get(config.get("model_type"), ()):
        hints[name] = hints[name] | list[hints[name]]
    for f in dataclasses.fields(args_class):
        if config.get(f.name) is None:
            required = f.name in NEVER_NULL and _required(f, hints[f.name])
            routed = f.name in ROUTER_NUMBERS and null_computed(f.name, config, model_file)
            if f.name in config and (required or routed):
                want = _describe(hints[f.name]).removeprefix("null or ").removesuffix(" or null")
                raise bad_field(where, prefix + f.name, None, want)
            continue  # null means "not given" to mlx-lm (DeepSeek-V2-Lite's q_lora_rank)
        if not _matches(config[f.name], hints[f.name]):
            raise bad_field(where, prefix + f.name, config[f.name], _describe(hints[f.name]))


def _required(f: dataclasses.Field, hint) -> bool:
    missing = dataclasses.MISSING
    return f.default is missing and f.default_factory is missing and not _matches(None, hint)


def _matches(value: object, hint) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is typing.Any:
        return True
    if origin in UNIONS:
        return any(_matches(value, a) for a in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:  # mlx-lm annotates some real-valued fields int (gpt-oss's rope_theta)
        # mlx-lm annotates some fractions as int (mimo_v2_flash's partial_rotary_factor: 0.334
        # in the published config) and some switches (Llama 4's attn_temperature_tuning: true in
        # the published config): counts and sizes are checked as integers by their ranges
        return type(value) in (int, float, bool) and math.isfinite(value)
    if hint is float:
        return type(value) in (int, float) and math.isfinite(value)
    if hint is str:
        return isinstance(value, str)
    if hint is dict or origin is dict:
        return isinstance(value, dict)
    if hint is list or origin is list:
        return isinstance(value, list) and (not args or all(_matches(v, args[0]) for v in value))
    return True  # a type mlx-lm adds later: left to the model's own checks


def _describe(hint) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in UNIONS:
        return " or ".join(_describe(a) for a in args)
    if origin is list:
        return f"a list of {_describe(args[0])}" if args else "a list"
    names = {int: "an integer", float: "a finite number", bool: "true or false", str: "a string"}
    if hint is type(None):
        return "null"
    if hint in names:
        return names[hint]
    return "an object" if hint is dict or origin is dict else str(hint)
