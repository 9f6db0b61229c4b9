"""The fields read outside the model classes: architectures, token ids, dtypes, RoPE scaling,
quantization."""

from __future__ import annotations

import functools
import math
from pathlib import Path

from ...errors import one_line
from .field_error import bad_field
from .ranges import MAX_SIZE

QUANT_BITS = range(1, 9)
MAX_GROUP = 4096  # past any group size MLX quantizes with: not asked of it
SCALED_ROPE = ("linear", "dynamic", "yarn", "llama3")  # the RoPE types that need a factor
# MLX's quantization modes and their (group size, bits): the only ones the MX modes allow, affine's
# defaults (it takes others). Also what a quantization entry's null means: `mlx_lm.convert
# --quant-predicate mixed_3_6` without --q-group-size writes each layer's group_size so
MODE_DEFAULTS = {"affine": (64, 4), "nvfp4": (16, 4), "mxfp4": (32, 4), "mxfp8": (32, 8)}


def check_common_fields(config: dict, where) -> None:
    """Fields read outside the model classes: architectures, eos ids, dtypes, quantization."""
    names = config.get("architectures")
    if names is not None and not (
        isinstance(names, str)
        or (isinstance(names, list) and all(isinstance(n, str) for n in names))
    ):
        raise bad_field(where, "architectures", names, "a list of class names")
    check_eos_ids(config.get("eos_token_id"), where)
    for name in ("bos_token_id", "pad_token_id"):  # transformers reads them too
        if config.get(name) is not None and not _token_id(config[name]):
            raise bad_field(where, name, config[name], "a token id")
    for name in ("torch_dtype", "dtype"):
        if config.get(name) is not None and not isinstance(config[name], str):
            raise bad_field(where, name, config[name], "a dtype name such as 'bfloat16'")
    for name in ("rope_scaling", "rope_parameters"):
        if config.get(name) is not None and not isinstance(config[name], dict):
            raise bad_field(where, name, config[name], "an object")
    rope = config.get("rope_scaling")
    if isinstance(rope, dict):  # transformers refuses these at tokenizer load, mlx-lm at RoPE
        kind = rope.get("rope_type", rope.get("type", "default"))
        factor = rope.get("factor")
        if not isinstance(kind, str):
            raise bad_field(where, "rope_scaling.rope_type", kind, "a RoPE type name")
        if kind in SCALED_ROPE and not (type(factor) in (int, float) and 0 < factor < math.inf):
            raise bad_field(
                where, "rope_scaling.factor", factor, f"a positive number for {kind} RoPE"
            )
    for name in ("quantization_config", "quantization"):  # their presence alone changes the path
        if name in config and not isinstance(config[name], dict):
            raise bad_field(where, name, config[name], "an object")
    blocks = (config.get("quantization_config") or {}).get("weight_block_size")
    if blocks is not None and not (
        isinstance(blocks, list) and all(type(b) is int and b > 0 for b in blocks)
    ):
        raise bad_field(where, "quantization_config.weight_block_size", blocks, "a list of sizes")
    quantization = config.get("quantization")
    if quantization is not None:
        _check_quantization(quantization, where, "quantization")
        for key, value in quantization.items():
            if key in ("group_size", "bits", "mode"):
                continue
            if isinstance(value, dict):
                _check_quantization(value, where, f"quantization.{key}")
            elif not isinstance(value, bool):
                raise bad_field(where, f"quantization.{key}", value, "an object or false")


def with_mode_defaults(quantization: dict) -> dict:
    """config.json's quantization with each null group_size or bits of an entry (of a known mode)
    as MLX's default for its mode, which mlx-lm's layers quantize and compute with."""

    def filled(params: dict) -> dict:
        mode = params.get("mode", "affine")
        defaults = MODE_DEFAULTS.get(mode) if isinstance(mode, str) else None
        if defaults is None:
            return params
        nulls = {k: v for k, v in zip(("group_size", "bits"), defaults) if k in params}
        return {**params, **{k: v for k, v in nulls.items() if params[k] is None}}

    return {k: filled(v) if isinstance(v, dict) else v for k, v in filled(quantization).items()}


def _check_quantization(params: dict, where, field: str) -> None:
    params = with_mode_defaults(params)
    bits, group_size, mode = params.get("bits"), params.get("group_size"), params.get("mode")
    if type(bits) is not int or bits not in QUANT_BITS:
        raise bad_field(where, f"{field}.bits", bits, "an integer from 1 to 8")
    if type(group_size) is not int or not 1 <= group_size <= MAX_SIZE:
        raise bad_field(where, f"{field}.group_size", group_size, "a group size such as 64")
    if mode is not None and not isinstance(mode, str):
        raise bad_field(where, f"{field}.mode", mode, "a mode name such as 'affine'")
    refused = mlx_refuses(group_size, bits, mode or "affine")
    if refused:  # else nn.quantize raises it as MLX's ValueError, once the model is built
        name = next((n for n in ("mode", "bits") if n in refused), "group_size")
        value = {"mode": mode, "bits": bits, "group_size": group_size}[name]
        raise bad_field(where, f"{field}.{name}", value, f"what MLX quantizes with ({refused})")


@functools.cache
def mlx_refuses(group_size: int, bits: int, mode: str) -> str | None:
    """MLX's own word on quantizing with these settings (None: it does), from a tiny matrix: the
    group sizes and bits each mode takes are MLX's to say (affine: 32, 64, 128; nvfp4: 16)."""
    if group_size > MAX_GROUP:
        return f"group size {group_size} is larger than any MLX takes"
    import mlx.core as mx

    try:
        mx.eval(mx.quantize(mx.zeros((1, 32 * group_size)), group_size, bits, mode=mode))
    except (ValueError, RuntimeError) as e:
        return one_line(e)
    return None


def check_eos_ids(ids: object, where: Path | str) -> None:
    """eos_token_id as config.json or generation_config.json give it: an id or a list of ids."""
    if ids is not None and not (
        _token_id(ids) or (isinstance(ids, list) and all(map(_token_id, ids)))
    ):
        raise bad_field(where, "eos_token_id", ids, "a token id or a list of them")


def _token_id(value: object) -> bool:
    return type(value) is int and 0 <= value < MAX_SIZE * 16
