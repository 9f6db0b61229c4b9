"""Whether mlx-lm can quantize a model's KV cache as asked (kv_bits, kv_group_size), known before
anything is computed: a rotating cache (max_kv_size, sliding windows) mlx-lm cannot quantize, and
key and value widths the group size does not divide, measured on a lazy twin of the model (mlx-lm's
model built again from its args and called on one token, never evaluated: the shapes are known,
nothing is read or computed). mlx-lm fails on both only once the cache is first quantized."""

from __future__ import annotations

import weakref
from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn

from .arguments import KV_GROUP_SIZE, KV_GROUP_SIZES
from .errors import ArgumentError, one_line, refusal


def check_kv_cache_quantizes(model: nn.Module, kwargs: dict) -> None:
    """mlx-lm's kv_bits keywords, their values checked (arguments.check_kv_quantization), checked
    against `model` (refusals spelled for the API and the command line alike: errors.refusal)."""
    from mlx_lm.models.cache import RotatingKVCache, make_prompt_cache

    group, bits = kwargs.get("kv_group_size", KV_GROUP_SIZE), kwargs["kv_bits"]
    rotating = kwargs.get("max_kv_size")
    for cache in make_prompt_cache(model, rotating):
        try:
            if _quantizes(cache):
                cache.to_quantized(group_size=group, bits=bits)
        except NotImplementedError:
            made = None if rotating is None else "max_kv_size"
            raise cannot_quantize(type(cache).__name__, made) from None
    given = kwargs.get("prompt_cache")  # one made with max_kv_size: mlx-lm's NotImplementedError
    if isinstance(given, list) and any(isinstance(c, RotatingKVCache) for c in given):
        raise cannot_quantize("RotatingKVCache", "prompt_cache")
    widths = kv_widths(model)
    if any(width % group for width in widths):
        fits = [g for g in KV_GROUP_SIZES if not any(width % g for width in widths)]
        listed = ", ".join(map(str, sorted(widths)))
        raise refusal(
            lambda name: (
                f"{name('kv_group_size')} {group} does not divide this model's key and "
                f"value widths ({listed}), which mlx-lm quantizes in groups: "
                + (
                    f"use {name('kv_group_size', max(fits))}."
                    if fits
                    else f"drop {name('kv_bits')}."
                )
            )
        )
    failure = _quantized_step_fails(model, group, bits)
    if failure:
        kind = getattr(getattr(model, "args", None), "model_type", type(model).__name__)
        raise refusal(
            lambda name: (
                f"{name('kv_bits')}: this model's attention ({kind} in mlx-lm) cannot read a "
                f"quantized KV cache ({failure} at the first step after it is quantized): "
                f"drop {name('kv_bits')}."
            )
        )


def _quantized_step_fails(model: nn.Module, group: int, bits: int) -> str | None:
    """Why a step of the lazy twin fails on its quantized cache (MLA's attention, which mlx-lm
    0.32.2 gives the packed keys as a list: an AttributeError mid-answer), or None."""
    return _kept(model, (group, bits), lambda: _step_failure(model, group, bits))


def _step_failure(model: nn.Module, group: int, bits: int) -> str | None:
    twin = _twin(model)
    if twin is None:
        return None
    twin, cache = twin
    try:  # as mlx-lm's maybe_quantize_kv_cache quantizes it
        cache = [c.to_quantized(group_size=group, bits=bits) if _quantizes(c) else c for c in cache]
        twin(mx.zeros((1, 1), dtype=mx.int32), cache=cache)
    except Exception as e:
        return f"{type(e).__name__}: {one_line(e, 120)}"
    return None


def cannot_quantize(kind: str, made: str | None) -> Exception:
    """mlx-lm quantizes no rotating cache: one made for max_kv_size (or given as prompt_cache),
    or for sliding windows (`made` None)."""
    return refusal(
        lambda name: (
            f"{name('kv_bits')}: mlx-lm cannot quantize a {kind} (what "
            + (name(made) if made else "the model's sliding windows")
            + (" makes" if made else " make")
            + f"): drop {name('kv_bits')}"
            + (f" or {name(made)}." if made else ".")
        )
    )


def _quantizes(cache) -> bool:
    return hasattr(cache, "to_quantized")


def kv_widths(model: nn.Module) -> set[int]:
    """The last-axis widths of the keys and values in `model`'s caches after one token, from a
    lazy twin; empty where no twin can be built (the cache's own error then says it)."""
    return {width for shape in kv_shapes(model) or [] if shape for width in shape[1:]}


def kv_shapes(model: nn.Module) -> list[tuple[int, int, int] | None] | None:
    """Each layer's (heads, key width, value width) after one token (None: a layer keeping no
    keys), from a lazy twin; None where no twin can be built."""

    def measured() -> list[tuple[int, int, int] | None] | None:
        twin = _twin(model)
        return None if twin is None else [_shape(entry) for entry in twin[1]]

    return _kept(model, "shapes", measured)


def _kept(model: nn.Module, key: object, compute: Callable[[], object]):
    """compute()'s value, kept under `key` per model while it lives: a lazy twin of a published
    shape takes 20-50 ms, and prompt caches and kv_bits are checked on every call."""
    held = _KEPT.get(id(model))
    if held is None or held[0]() is not model:
        number = id(model)
        held = _KEPT[number] = (weakref.ref(model, lambda _: _KEPT.pop(number, None)), {})
    if key not in held[1]:
        held[1][key] = compute()
    return held[1][key]


# id(model) -> (a weak reference to it, what _kept keeps for it)
_KEPT: dict[int, tuple[weakref.ref, dict]] = {}


def _twin(model: nn.Module) -> tuple[nn.Module, list] | None:
    """mlx-lm's model built again from `model`'s args and its cache after one token, all lazy
    (nothing read or computed); None where none can be built."""
    from mlx_lm.models.cache import make_prompt_cache

    try:
        twin = type(model)(getattr(model, "args", None))
        cache = make_prompt_cache(twin)
        twin(mx.zeros((1, 1), dtype=mx.int32), cache=cache)
    except Exception:  # a model that takes more than its args, or more than tokens
        return None
    return twin, cache


def _shape(entry) -> tuple[int, int, int] | None:
    """(heads, key width, value width) of a cache's keys and values (unpacked where quantized)."""
    keys, values = getattr(entry, "keys", None), getattr(entry, "values", None)
    if isinstance(keys, (tuple, list)) and isinstance(values, (tuple, list)):
        bits = entry.bits  # mlx-lm's QuantizedKVCache: packed in uint32 words
        return keys[0].shape[1], keys[0].shape[-1] * 32 // bits, values[0].shape[-1] * 32 // bits
    if isinstance(keys, mx.array) and isinstance(values, mx.array):
        return keys.shape[1], keys.shape[-1], values.shape[-1]
    return None


def check_prompt_cache(model: nn.Module, cache: object) -> None:
    """A prompt_cache: one cache a layer, as make_prompt_cache(model) makes, and any keys it
    holds as many heads and as wide as `model`'s (another model's were MLX's broadcast
    ValueError inside a layer)."""
    from mlx_lm.models.cache import make_prompt_cache

    layers = len(make_prompt_cache(model))
    if not (
        isinstance(cache, list)
        and len(cache) == layers
        and all(hasattr(c, "state") for c in cache)  # every mlx-lm cache has one
    ):
        raise ArgumentError(
            f"prompt_cache must be a list of {layers} caches, one a layer, as "
            f"mlx_lm.models.cache.make_prompt_cache(model) makes (got {cache!r:.60})."
        )
    held = [_shape(c) for c in cache]
    if not any(held):
        return
    for layer, (ours, theirs) in enumerate(zip(held, kv_shapes(model) or held)):
        if ours and ours != theirs:
            said = "no keys" if theirs is None else f"{theirs}"
            raise ArgumentError(
                f"prompt_cache layer {layer} holds keys of (heads, key width, value width) "
                f"{ours}, but this model's layer keeps {said}: a prompt cache belongs to the "
                "model that made it (make_prompt_cache(model), or the model mlx-lm's "
                "cache_prompt ran)."
            )
