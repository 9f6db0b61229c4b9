"""config.json checked before anything is built from it: at repack, and at load (the manifest's).

mlx-lm builds a model from whatever a config says: a count of 0, a string where a size belongs or a
layer count of a billion end in a foreign exception deep inside a layer, in a model with no experts,
or in minutes of building. Every field mlx-lm's ModelArgs for the model_type declares is checked
against its declared type, and the sizes and counts the engine and the model use against their
ranges, so a damaged or foreign config is refused with one line naming the field.
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys
import typing
from pathlib import Path

from .errors import StreamerError

# The largest published MoE models have 61-94 layers, hidden sizes up to 16k and 512 experts;
# these bounds leave room for growth while refusing numbers no model can have.
MAX_LAYERS = 1024
MAX_SIZE = 1 << 20
MAX_CONTEXT = 1 << 40
# Counts and sizes that must be at least 1 where a config gives them.
POSITIVE = (
    "hidden_size",
    "intermediate_size",
    "moe_intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "num_experts",
    "num_local_experts",
    "n_routed_experts",
    "num_experts_per_tok",
    "max_position_embeddings",
    "kv_lora_rank",
    "q_lora_rank",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
    "v_head_dim",
    "n_group",
    "topk_group",
    "decoder_sparse_step",
    "moe_layer_freq",
    "index_head_dim",
    "index_n_heads",
    "index_topk",
    "linear_num_value_heads",
    "linear_num_key_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
    "full_attention_interval",
    "sliding_window",
)
NON_NEGATIVE = (
    "first_k_dense_replace",
    "n_shared_experts",
    "shared_expert_intermediate_size",
    "num_nextn_predict_layers",
)
# How the families name their expert count and routed experts per token (the model's own build
# refuses a config with neither; a model with no expert layers is refused by architectures).
EXPERT_COUNTS = (
    "num_experts",
    "num_local_experts",
    "n_routed_experts",
    "moe_num_experts",
)
TOP_K = (
    "num_experts_per_tok",
    "num_experts_per_token",
    "moe_k",
    "moe_topk",
    "moe_top_k",
    "top_k_experts",
)
QUANT_BITS = range(1, 9)
SCALED_ROPE = ("linear", "dynamic", "yarn", "llama3")  # the RoPE types that need a factor
LAYER_INDEX = re.compile(r"\blayers\.(\d+)\.")


def experts_per_token(config: dict) -> int:
    """Routed experts per token, under whichever name the family gives it (a VLM's in its
    text_config; a per-layer list counts its largest)."""
    for where in (config, config.get("text_config") or {}):
        value = next((where[n] for n in TOP_K if where.get(n) is not None), None)
        if value is not None:
            return int(max(value) if isinstance(value, list) else value)
    return 0


def check_config(config: object, where: Path | str) -> dict:
    """`config` if mlx-lm can build a streaming model from it; else StreamerError naming a field."""
    from mlx_lm.utils import _get_classes  # here: TOP_K and the bounds import without mlx-lm

    from .architectures import architecture

    if not isinstance(config, dict):
        raise StreamerError(f"{where}: the model config is not a JSON object; {_fix(where)}")
    if not isinstance(config.get("model_type"), str):
        raise _bad(where, "model_type", config.get("model_type"), "a string such as 'qwen3_moe'")
    architecture(config, where)
    _check_common(config, where)
    model_class, args_class = _get_classes(config)
    _check_fields(config, args_class, where)
    model_config = config
    text_args = _text_args_class(model_class)
    if text_args is not None and isinstance(config.get("text_config"), dict):
        model_config = config["text_config"]
        _check_fields(model_config, text_args, where, "text_config.")
    _check_ranges(model_config, where, "text_config." if model_config is not config else "")
    return config


def _fix(where) -> str:
    if Path(str(where)).name == "manifest.json":
        return "the manifest was edited or damaged: repack the model."
    return "the file is damaged or belongs to another model: download config.json again."


def check_layer_count(config: dict, tensor_names, where: Path | str) -> None:
    """Refuse a layer count beyond the layers the weights hold, before building that many."""
    text = config.get("text_config")
    layers = (text if isinstance(text, dict) else config).get("num_hidden_layers")
    present = {int(m.group(1)) for name in tensor_names if (m := LAYER_INDEX.search(name))}
    if type(layers) is int and present and layers > max(present) + 1:
        raise StreamerError(
            f"{where}: num_hidden_layers is {layers} but the weights hold layers 0-{max(present)} "
            f"only; {_fix(where)}"
        )


def _bad(where, field: str, value: object, want: str) -> StreamerError:
    shown = repr(value)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return StreamerError(
        f"{where}: config field {field} is {shown}, expected {want}; {_fix(where)}"
    )


def _text_args_class(model_class: type):
    """The text model's args class of a vision-language wrapper (qwen3_5_moe's `text_config`)."""
    for cls in model_class.__mro__:
        args = getattr(sys.modules.get(cls.__module__), "TextModelArgs", None)
        if args is not None:
            return args
    return None


def _check_fields(config: dict, args_class: type, where, prefix: str = "") -> None:
    hints = typing.get_type_hints(args_class)
    for f in dataclasses.fields(args_class):
        if config.get(f.name) is None:
            continue  # null means "not given" to mlx-lm (DeepSeek-V2-Lite's q_lora_rank)
        if not _matches(config[f.name], hints[f.name]):
            raise _bad(where, prefix + f.name, config[f.name], _describe(hints[f.name]))


def _matches(value: object, hint) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is typing.Any:
        return True
    if origin is typing.Union:
        return any(_matches(value, a) for a in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:  # mlx-lm annotates some real-valued fields int (gpt-oss's rope_theta)
        # mlx-lm annotates some fractions as int (mimo_v2_flash's partial_rotary_factor: 0.334
        # in the published config): counts and sizes are checked as integers by their ranges
        return type(value) in (int, float) and math.isfinite(value)
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
    if origin is typing.Union:
        return " or ".join(_describe(a) for a in args)
    if origin is list:
        return f"a list of {_describe(args[0])}" if args else "a list"
    names = {int: "an integer", float: "a finite number", bool: "true or false", str: "a string"}
    if hint is type(None):
        return "null"
    if hint in names:
        return names[hint]
    return "an object" if hint is dict or origin is dict else str(hint)


def _check_ranges(config: dict, where, prefix: str) -> None:
    def integer(name: str, low: int, high: int, want: str) -> None:
        value = config.get(name)
        if value is None or isinstance(value, list):
            return  # per-layer lists (mimo_v2_flash's moe_layer_freq): typed by the model's args
        if type(value) is not int or not low <= value <= high:
            raise _bad(where, prefix + name, value, want)

    for name in POSITIVE:
        if name == "sliding_window" and config.get("use_sliding_window") is False:
            continue  # transformers 5 writes 0 for "no window" (Qwen2-MoE)
        high = {"num_hidden_layers": MAX_LAYERS, "max_position_embeddings": MAX_CONTEXT}
        integer(
            name, 1, high.get(name, MAX_SIZE), f"an integer from 1 to {high.get(name, MAX_SIZE)}"
        )
    for name in NON_NEGATIVE:
        integer(name, 0, MAX_SIZE, f"an integer from 0 to {MAX_SIZE}")
    experts = next((config[n] for n in EXPERT_COUNTS if config.get(n) is not None), None)
    top_k = next((n for n in TOP_K if config.get(n) is not None), None)
    if type(experts) is int and top_k is not None and type(config[top_k]) is int:
        integer(top_k, 1, experts, f"an integer from 1 to the {experts} experts")
    heads, kv_heads = config.get("num_attention_heads"), config.get("num_key_value_heads")
    if heads and kv_heads and heads % kv_heads:
        raise _bad(where, prefix + "num_key_value_heads", kv_heads, f"a divisor of {heads} heads")
    if config.get("n_group") and config.get("topk_group"):
        integer("topk_group", 1, config["n_group"], f"at most n_group ({config['n_group']})")
        if config.get("n_routed_experts") and config["n_routed_experts"] % config["n_group"]:
            raise _bad(where, prefix + "n_group", config["n_group"], "a divisor of the experts")
    for name in ("rms_norm_eps", "rope_theta", "routed_scaling_factor"):
        value = config.get(name)
        if value is not None and not (type(value) in (int, float) and 0 < value < math.inf):
            raise _bad(where, prefix + name, value, "a positive finite number")
    factor = config.get("partial_rotary_factor")
    if factor is not None and not (type(factor) in (int, float) and 0 < factor <= 1):
        raise _bad(where, prefix + "partial_rotary_factor", factor, "a number in (0, 1]")
    layers = config.get("num_hidden_layers")
    for name in ("mlp_only_layers",):
        value = config.get(name)
        if value is not None and not (
            isinstance(value, list)
            and all(type(v) is int and 0 <= v < (layers or 1) for v in value)
        ):
            raise _bad(where, prefix + name, value, f"a list of layer numbers below {layers}")
    types = config.get("layer_types")
    if types is not None and not (
        isinstance(types, list)
        and len(types) >= (layers or 0)
        and all(isinstance(t, str) for t in types)
    ):
        raise _bad(where, prefix + "layer_types", types, f"a list of {layers} layer type names")


def _check_common(config: dict, where) -> None:
    """Fields read outside the model classes: architectures, eos ids, dtypes, quantization."""
    names = config.get("architectures")
    if names is not None and not (
        isinstance(names, str)
        or (isinstance(names, list) and all(isinstance(n, str) for n in names))
    ):
        raise _bad(where, "architectures", names, "a list of class names")
    check_eos_ids(config.get("eos_token_id"), where)
    for name in ("bos_token_id", "pad_token_id"):  # transformers reads them too
        if config.get(name) is not None and not _token_id(config[name]):
            raise _bad(where, name, config[name], "a token id")
    for name in ("torch_dtype", "dtype"):
        if config.get(name) is not None and not isinstance(config[name], str):
            raise _bad(where, name, config[name], "a dtype name such as 'bfloat16'")
    for name in ("rope_scaling", "rope_parameters"):
        if config.get(name) is not None and not isinstance(config[name], dict):
            raise _bad(where, name, config[name], "an object")
    rope = config.get("rope_scaling")
    if isinstance(rope, dict):  # transformers refuses these at tokenizer load, mlx-lm at RoPE
        kind = rope.get("rope_type", rope.get("type", "default"))
        factor = rope.get("factor")
        if not isinstance(kind, str):
            raise _bad(where, "rope_scaling.rope_type", kind, "a RoPE type name")
        if kind in SCALED_ROPE and not (type(factor) in (int, float) and 0 < factor < math.inf):
            raise _bad(where, "rope_scaling.factor", factor, f"a positive number for {kind} RoPE")
    for name in ("quantization_config", "quantization"):  # their presence alone changes the path
        if name in config and not isinstance(config[name], dict):
            raise _bad(where, name, config[name], "an object")
    blocks = (config.get("quantization_config") or {}).get("weight_block_size")
    if blocks is not None and not (
        isinstance(blocks, list) and all(type(b) is int and b > 0 for b in blocks)
    ):
        raise _bad(where, "quantization_config.weight_block_size", blocks, "a list of sizes")
    quantization = config.get("quantization")
    if quantization is not None:
        _check_quantization(quantization, where, "quantization")
        for key, value in quantization.items():
            if key in ("group_size", "bits", "mode"):
                continue
            if isinstance(value, dict):
                _check_quantization(value, where, f"quantization.{key}")
            elif not isinstance(value, bool):
                raise _bad(where, f"quantization.{key}", value, "an object or false")


def _check_quantization(params: dict, where, field: str) -> None:
    bits, group_size, mode = params.get("bits"), params.get("group_size"), params.get("mode")
    if type(bits) is not int or bits not in QUANT_BITS:
        raise _bad(where, f"{field}.bits", bits, "an integer from 1 to 8")
    if type(group_size) is not int or not 1 <= group_size <= MAX_SIZE:
        raise _bad(where, f"{field}.group_size", group_size, "a group size such as 64")
    if mode is not None and not isinstance(mode, str):
        raise _bad(where, f"{field}.mode", mode, "a mode name such as 'affine'")


def check_eos_ids(ids: object, where: Path | str) -> None:
    """eos_token_id as config.json or generation_config.json give it: an id or a list of ids."""
    if ids is not None and not (
        _token_id(ids) or (isinstance(ids, list) and all(map(_token_id, ids)))
    ):
        raise _bad(where, "eos_token_id", ids, "a token id or a list of them")


def _token_id(value: object) -> bool:
    return type(value) is int and 0 <= value < MAX_SIZE * 16
