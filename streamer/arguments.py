"""Values users pass, checked the same way from the command line and from the Python API.

Nothing here imports mlx or mlx-lm at module level, so the CLI refuses a bad value at once, before
the slow imports and before the model is loaded. Every refusal is a StreamerError naming the
argument as the caller spells it (`--top-p` on the command line, `top_p` in Python).
"""

from __future__ import annotations

import math
import re

from .errors import StreamerError

MAX_SEED = (1 << 64) - 1  # mx.random.seed takes an unsigned 64-bit integer
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
# Compute dtypes a model can be loaded in, by the names users write.
DTYPE_NAMES = ("float32", "float16", "bfloat16")
# mlx-lm's quantized KV cache (QuantizedKVCache): the bits and groups mx.quantize takes
KV_BITS = (2, 3, 4, 5, 6, 8)
KV_GROUP_SIZES = (32, 64, 128)


def parse_size(value: object, name: str) -> int:
    """Bytes from an int or a size written as 8G, 8GB, 8GiB, 8 GB or 512M (binary units)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise StreamerError(
            f"{name} must be a number of bytes or a size such as '8G' (got {value!r})."
        )
    if isinstance(value, int):
        number = value
    else:
        match = _SIZE.match(value)
        number = float(match.group(1)) * _UNITS[match.group(2).lower()] if match else math.nan
        if match and match.group(3).lower() == "i":  # "8Gi" without the B
            number = math.nan
    if not math.isfinite(number) or number < 0:
        raise StreamerError(f"{name} {value!r} is not a size such as 8G, 8GB, 8 GiB or 512M.")
    return int(number)


def check_request(
    prompt: str | list[int], max_tokens: int, *, option: str = "max_tokens", how: str = ""
) -> None:
    """Refuse an empty prompt or a max_tokens below 1. The CLI asks before loading the model,
    naming its own option and how to give a prompt (`how`)."""
    if max_tokens <= 0:
        raise StreamerError(f"{option} must be at least 1 (got {max_tokens}).")
    if not prompt:
        raise StreamerError(f"the prompt is empty: give some text to continue{how}.")


def check_sampling(
    temp: object,
    top_p: object,
    seed: object,
    *,
    top_k: object = 0,
    min_p: object = 0.0,
    option: str = "",
    dash: bool = False,
) -> None:
    """temp >= 0 and finite, 0 < top_p <= 1, seed an integer from 0 to 2**64 - 1 (or None),
    top_k an integer from 0 (off), 0 <= min_p <= 1."""

    def name(n: str) -> str:
        return option + (n.replace("_", "-") if dash else n)

    if not _number(temp) or not 0 <= temp < math.inf:
        raise StreamerError(f"{name('temp')} must be 0 (greedy) or more (got {temp!r}).")
    if not _number(top_p) or not 0 < top_p <= 1:
        raise StreamerError(f"{name('top_p')} must be above 0 and at most 1 (got {top_p!r}).")
    if seed is not None and (type(seed) is not int or not 0 <= seed <= MAX_SEED):
        raise StreamerError(
            f"{name('seed')} must be an integer from 0 to {MAX_SEED} (got {seed!r})."
        )
    if type(top_k) is not int or top_k < 0:
        raise StreamerError(f"{name('top_k')} must be an integer, 0 (off) or more (got {top_k!r}).")
    if not _number(min_p) or not 0 <= min_p <= 1:
        raise StreamerError(f"{name('min_p')} must be from 0 (off) to 1 (got {min_p!r}).")


def check_at_least(value: object, name: str, low: int) -> None:
    """An integer count (tokens, caches, a port) of at least `low`."""
    if type(value) is not int:
        raise StreamerError(f"{name} must be an integer (got {value!r}).")
    if value < low:
        raise StreamerError(f"{name} must be at least {low} (got {value}).")


def check_kv_quantization(
    bits: object, group_size: object, start: object, *, option: str = "", dash: bool = False
) -> None:
    """mlx-lm's kv_bits (None: off), kv_group_size and quantized_kv_start."""

    def name(n: str) -> str:
        return option + (n.replace("_", "-") if dash else n)

    if bits is not None and (type(bits) is not int or bits not in KV_BITS):
        choices = ", ".join(map(str, KV_BITS))
        raise StreamerError(f"{name('kv_bits')} must be one of {choices} (got {bits!r}).")
    if type(group_size) is not int or group_size not in KV_GROUP_SIZES:
        choices = ", ".join(map(str, KV_GROUP_SIZES))
        raise StreamerError(
            f"{name('kv_group_size')} must be one of {choices} (got {group_size!r})."
        )
    check_at_least(start, name("quantized_kv_start"), 0)


def check_flag(value: object, name: str) -> None:
    if not isinstance(value, bool):
        raise StreamerError(f"{name} must be True or False (got {value!r}).")


def parse_dtype(value: object):
    """None, an mx floating dtype, or its name ("float32", "bfloat16", "float16")."""
    import mlx.core as mx

    if value is None:
        return None
    if isinstance(value, str) and value in DTYPE_NAMES:
        return getattr(mx, value)
    if isinstance(value, mx.Dtype) and value in tuple(getattr(mx, n) for n in DTYPE_NAMES):
        return value
    raise StreamerError(
        f"dtype must be one of {', '.join(DTYPE_NAMES)} (a name or mlx.core's dtype), or None for "
        f"the default (got {value!r})."
    )


def _number(value: object) -> bool:
    return type(value) in (int, float) and not math.isnan(value)
