"""Values users pass, checked the same way from the command line and from the Python API.

Nothing here imports mlx or mlx-lm at module level, so the CLI refuses a bad value at once, before
the slow imports and before the model is loaded. Every refusal is an ArgumentError (a ValueError,
as mlx-lm's are) naming the argument as the caller spells it (`--top-p` or `top_p`).
"""

from __future__ import annotations

import math
import numbers
import weakref
from collections.abc import Callable

from .errors import ArgumentError, refusal

NO_LIMIT = -1  # mlx-lm's max_tokens for "no limit": here, until the model's context is full
MAX_SEED = (1 << 64) - 1  # mx.random.seed takes an unsigned 64-bit integer
# The smallest temperature above 0 (greedy): mlx-lm scales the logits by 1 / temp in float32,
# and far below this (1e-300) every logit overflows to inf and the tokens come out at random
MIN_TEMPERATURE = 1e-5
# Compute dtypes a model can be loaded in, by the names users write.
DTYPE_NAMES = ("float32", "float16", "bfloat16")
# mlx-lm's quantized KV cache (QuantizedKVCache): the bits and groups mx.quantize takes
KV_BITS = (2, 3, 4, 5, 6, 8)
KV_GROUP_SIZES = (32, 64, 128)
KV_GROUP_SIZE = 64  # mlx-lm's default kv_group_size (generate_step's and mlx_lm.generate's)
# mlx-lm's DEFAULT_QUANTIZED_KV_START, generate_step's default (tests/test_dtype_and_kv.py checks
# it), written here so that the CLI's --help needs no mlx-lm import
QUANTIZED_KV_START = 5000
# mlx-lm's rotating KV cache (max_kv_size) always keeps the first 4 tokens: one no larger failed
# (MLX's broadcast_shapes error) once a prompt took more than one prefill step
MIN_KV_SIZE = 5
# Tokens drafted per pass at most (--num-draft-tokens, num_draft_tokens, a request's): a pass is
# computed whole, not in prefill steps, so a count of thousands is a prefill of thousands at once
MAX_DRAFT_TOKENS = 64


def check_request(
    prompt: object,
    max_tokens: object,
    *,
    option: str = "max_tokens",
    how: str = "",
    embedded: bool = False,
) -> None:
    """Refuse a prompt that is not text or token ids, an empty one (but beside input_embeddings,
    `embedded`, as mlx-lm takes it), and a max_tokens that is not an integer of at least 1 or
    NO_LIMIT. The CLI asks before loading the model, naming its own option and how to give a
    prompt (`how`); its --max-tokens is at least 1."""
    if type(max_tokens) is not int or max_tokens != NO_LIMIT:
        check_at_least(max_tokens, option, 1)
    if isinstance(prompt, str):
        check_text(prompt, "the prompt")
    elif isinstance(prompt, (list, tuple)):
        bad = next((t for t in prompt if not _integer(t) or t < 0), None)
        if bad is not None:
            raise ArgumentError(
                f"a prompt of token ids holds {bad!r}: each must be an integer from 0."
            )
    else:
        raise ArgumentError(
            f"the prompt must be text (a str) or a list of token ids (got {type(prompt).__name__})."
        )
    if not prompt and not embedded:
        raise ArgumentError(f"the prompt is empty: give some text to continue{how}.")


def check_text(text: str, what: str) -> None:
    """Refuse a str that is not Unicode text (a lone surrogate: no encoding writes it)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ArgumentError(
            f"{what} holds a lone surrogate ({text[e.start]!r} at character {e.start}), which is "
            "not text: decode the bytes it came from with errors='replace'."
        ) from None


def check_token_ids(ids: object, name: str, vocabulary: int) -> None:
    """Token ids (a prompt's, logit_bias's keys) that the model has: integers below
    `vocabulary`; past it the embedding is read out of bounds."""
    past = next((t for t in ids if not _integer(t) or not 0 <= t < vocabulary), None)
    if past is not None:
        raise ArgumentError(
            f"{name}: token id {past!r} is not one of the model's ({vocabulary} tokens, ids 0 to "
            f"{vocabulary - 1})."
        )


def check_prompt_ids(tokens: list, tokenizer) -> None:
    """A prompt of token ids checked against the tokenizer's vocabulary, as serve checks one."""
    check_token_ids(tokens, "prompt", vocabulary(tokenizer))


_vocabularies: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def vocabulary(tokenizer) -> int:
    """How many tokens the tokenizer has (as serve counts them), counted once per tokenizer:
    get_vocab builds a dict of every token, milliseconds for a large vocabulary."""
    size = _vocabularies.get(tokenizer)
    if size is None:
        size = _vocabularies[tokenizer] = len(tokenizer.get_vocab())
    return size


def logit_bias_in_vocabulary(logit_bias: dict | None) -> list[Callable]:
    """Refuses logit_bias keys past the logits' width: mlx-lm's would add out of bounds."""
    if not logit_bias:
        return []
    return [at_first_step(lambda width: check_token_ids(logit_bias, "logit_bias", width))]


def at_first_step(check: Callable[[int], None]) -> Callable:
    """A logits processor calling `check` with the logits' width (the vocabulary, first known at
    the first step) at the first step only: the width holds (150,000 logit_bias keys checked at
    every step cost 5 ms a token)."""
    checked = False

    def processor(tokens, logits):  # mx.arrays: this module imports no mlx
        nonlocal checked
        if not checked:
            check(logits.shape[-1])
            checked = True
        return logits

    return processor


def check_keywords(keywords: dict) -> None:
    """mlx-lm's generation, logits-processor and sampler keywords, refused as the CLI refuses its
    options: mlx-lm takes a NaN penalty (every logit NaN: an empty answer), any logit_bias key.
    xtc_special_tokens are made ints in `keywords`."""
    for name, low in (("max_kv_size", MIN_KV_SIZE), ("prefill_step_size", 1)):
        if keywords.get(name) is not None:  # a step of 0: MLX's reshape error
            check_at_least(keywords[name], name, low)
    check_kv_quantization(  # with kv_bits or not, as the CLI checks its flags
        keywords.get("kv_bits"),
        keywords.get("kv_group_size", KV_GROUP_SIZE),
        keywords.get("quantized_kv_start", QUANTIZED_KV_START),
    )
    bias = keywords.get("logit_bias")
    if bias is not None and (
        not isinstance(bias, dict)
        or not all(_integer(k) and k >= 0 and _finite(v) for k, v in bias.items())
    ):
        raise ArgumentError(
            f"logit_bias must map token ids (integers from 0) to finite numbers (got {bias!r:.60})."
        )
    special = keywords.get("xtc_special_tokens")  # MLX's ValueError for a str or numpy's int
    if special is not None:
        if not isinstance(special, (list, tuple)) or not all(
            _integer(t) and t >= 0 for t in special
        ):
            want = "a list of token ids (integers from 0)"
            raise ArgumentError(f"xtc_special_tokens must be {want} (got {special!r:.60}).")
        keywords["xtc_special_tokens"] = [int(t) for t in special]
    for name in ("repetition_penalty", "presence_penalty", "frequency_penalty"):
        value = keywords.get(name)
        if value is not None and (not _finite(value) or name == "repetition_penalty" and value < 0):
            low = "0 or more" if name == "repetition_penalty" else "a finite number"
            raise ArgumentError(f"{name} must be {low} (got {value!r}).")
    for name in ("repetition_context_size", "presence_context_size", "frequency_context_size"):
        if keywords.get(name) is not None:
            check_at_least(keywords[name], name, 1)
    for name, high in (("xtc_probability", 1.0), ("xtc_threshold", 0.5)):
        value = keywords.get(name, 0.0)
        if not _finite(value) or not 0 <= value <= high:
            raise ArgumentError(f"{name} must be from 0 to {high} (got {value!r}).")
    if "min_tokens_to_keep" in keywords:
        check_at_least(keywords["min_tokens_to_keep"], "min_tokens_to_keep", 1)


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
        raise ArgumentError(f"{name('temp')} must be 0 (greedy) or more (got {temp!r}).")
    if 0 < temp < MIN_TEMPERATURE:
        raise ArgumentError(
            f"{name('temp')} must be 0 (greedy) or at least {MIN_TEMPERATURE}: below that the "
            f"scaled logits overflow float32 and the tokens are random (got {temp!r})."
        )
    if not _number(top_p) or not 0 < top_p <= 1:
        raise ArgumentError(f"{name('top_p')} must be above 0 and at most 1 (got {top_p!r}).")
    if seed is not None and (type(seed) is not int or not 0 <= seed <= MAX_SEED):
        raise ArgumentError(
            f"{name('seed')} must be an integer from 0 to {MAX_SEED} (got {seed!r})."
        )
    if type(top_k) is not int or top_k < 0:
        raise ArgumentError(f"{name('top_k')} must be an integer, 0 (off) or more (got {top_k!r}).")
    if not _number(min_p) or not 0 <= min_p <= 1:
        raise ArgumentError(f"{name('min_p')} must be from 0 (off) to 1 (got {min_p!r}).")


def check_at_least(value: object, name: str, low: int) -> None:
    """An integer count (tokens, caches, a port) of at least `low`."""
    if type(value) is not int:
        raise ArgumentError(f"{name} must be an integer (got {value!r}).")
    if value < low:
        raise ArgumentError(f"{name} must be at least {low} (got {value}).")


def check_draft_tokens(value: object, name: str, low: int) -> None:
    """Tokens drafted per pass: from `low` (the API's 0: none) to MAX_DRAFT_TOKENS."""
    check_at_least(value, name, low)
    if value > MAX_DRAFT_TOKENS:
        raise ArgumentError(
            f"{name} must be at most {MAX_DRAFT_TOKENS}: a pass computes its drafts at once "
            f"(got {value})."
        )


def check_kv_quantization(bits: object, group_size: object, start: object) -> None:
    """mlx-lm's kv_bits (None: off), kv_group_size and quantized_kv_start."""
    if bits is not None and (type(bits) is not int or bits not in KV_BITS):
        choices = ", ".join(map(str, KV_BITS))
        raise refusal(lambda name: f"{name('kv_bits')} must be one of {choices} (got {bits!r}).")
    if type(group_size) is not int or group_size not in KV_GROUP_SIZES:
        choices = ", ".join(map(str, KV_GROUP_SIZES))
        raise refusal(
            lambda name: f"{name('kv_group_size')} must be one of {choices} (got {group_size!r})."
        )
    if type(start) is not int or start < 0:
        need = "an integer" if type(start) is not int else "at least 0"
        raise refusal(lambda name: f"{name('quantized_kv_start')} must be {need} (got {start!r}).")


def _number(value: object) -> bool:
    return type(value) in (int, float) and not math.isnan(value)


def _finite(value: object) -> bool:
    return _number(value) and math.isfinite(value)


def _integer(value: object) -> bool:
    """An int, or an integer of numpy's (a prompt from an array); never a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def tokens_text(n: int) -> str:
    """`n` tokens in words: "1 token", "5 tokens"."""
    return f"{n} token" if n == 1 else f"{n} tokens"
