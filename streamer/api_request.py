"""A Python API generation call's arguments, as mlx-lm takes them: numpy's and MLX's scalars as
Python's numbers, the prompt as token ids that fit the model's context after what a reused
prompt cache holds."""

from __future__ import annotations

from collections.abc import Callable

import mlx.nn as nn
from mlx_lm.tokenizer_utils import TokenizerWrapper

from . import arguments
from .arguments import check_token_ids, tokens_text
from .errors import StreamerError
from .loading.handle import streaming


def plain_number(value: object) -> object:
    """A numpy or MLX scalar (np.float32(0.7), mx.array(5)) as Python's number, as mlx-lm
    computes with it; the checks read Python's int and float only, and refused these as not
    numbers. Anything else as given: a bool stays a bool (np.bool_'s too), refused where a number
    is wanted."""
    if getattr(value, "shape", None) == () and hasattr(value, "item"):
        return value.item()
    return value


def plain_keywords(keywords: dict) -> dict:
    """mlx-lm's keywords with each scalar (and logit_bias's biases) as Python's number."""
    plain = {name: plain_number(value) for name, value in keywords.items()}
    bias = plain.get("logit_bias")
    if isinstance(bias, dict):  # MLX's mx.array refuses a list of numpy's floats
        plain["logit_bias"] = {k: plain_number(v) for k, v in bias.items()}
    return plain


def ids_in_vocabulary(keywords: dict) -> list[Callable]:
    """A logits processor refusing the token ids of logit_bias's keys and of xtc_special_tokens
    past the logits' width (the vocabulary, first known at the first step), placed before
    mlx-lm's processors and sampler, which index the logits with them out of bounds (SIGSEGV)."""
    named = {n: keywords[n] for n in ("logit_bias", "xtc_special_tokens") if keywords.get(n)}
    if not named:
        return []

    def check(tokens, logits):
        for name, ids in named.items():
            check_token_ids(ids, name, logits.shape[-1])
        return logits

    return [check]


def cached_tokens(cache: object) -> int:
    """The tokens a reused prompt cache holds, which the prompt's positions follow: its attention
    layers' offset (a recurrent layer's state counts none). Not a list: none, and refused later
    by name (generate.py's _check_objects)."""
    layers = cache if isinstance(cache, list) else ()
    caches = [part for c in layers for part in getattr(c, "caches", (c,))]  # CacheList's parts
    offsets = [c.offset for c in caches if type(getattr(c, "offset", None)) is int]
    return max(offsets, default=0)


def prompt_tokens(
    model: nn.Module,
    tokenizer: TokenizerWrapper,
    prompt: str | list[int],
    max_tokens: int,
    cache: list | None,
) -> list[int]:
    """Tokenize once here, to refuse a prompt (after what `cache` holds, plus max_tokens) longer
    than the model's context with the numbers; beyond its trained positions a model degrades into
    plausible nonsense."""
    handle = streaming(model)  # mlx_lm.load's model (or None) was an AttributeError
    if handle is None:
        name = type(model).__name__
        raise StreamerError(f"model must be one streamer.load returned (got a {name}).")
    if isinstance(prompt, str):
        # as mlx-lm does: no second BOS when the text already starts with one
        bos = tokenizer.bos_token
        tokens = tokenizer.encode(prompt, add_special_tokens=not (bos and prompt.startswith(bos)))
    else:
        tokens = [int(t) for t in prompt]  # numpy's integers too: mx.array refuses them
        arguments.check_prompt_ids(tokens, tokenizer)
    context, held = handle.context_length, cached_tokens(cache)
    if context and held + len(tokens) + max_tokens > context:
        raise StreamerError(_past_context(held, len(tokens), max_tokens, context))
    return tokens


def _past_context(held: int, prompt: int, max_tokens: int, context: int) -> str:
    """The refusal of a call past the model's context, with its numbers and what to change."""
    said = f"the prompt is {tokens_text(prompt)}"
    if held:
        said = f"the prompt cache holds {tokens_text(held)} and {said}"
    fresh = " or start from a fresh prompt cache" if held else ""
    model = (
        f"the model's context is {tokens_text(context)} (max_position_embeddings in config.json)"
    )
    room = context - held - prompt
    if room < 1:
        return f"{said} but {model}: shorten the prompt{fresh}."
    return (
        f"{said} and max_tokens is {max_tokens}, but {model}: lower max_tokens to at most "
        f"{room}, or shorten the prompt{fresh}."
    )
