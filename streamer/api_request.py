"""A Python API generation call's prompt: token ids checked against the tokenizer, and its
positions (after what a reused prompt cache holds) plus max_tokens against the model's context."""

from __future__ import annotations

import mlx.nn as nn
from mlx_lm.tokenizer_utils import TokenizerWrapper

from . import arguments
from .arguments import tokens_text
from .errors import ArgumentError, refusal
from .families.config import context_field
from .generation_objects import check_tokenizer
from .loading.handle import streaming


def prompt_tokens(model: nn.Module, tokenizer: TokenizerWrapper, prompt: str | list) -> list[int]:
    """The prompt's token ids, tokenized once here for `within_context` to count."""
    handle = streaming(model)  # mlx_lm.load's model (or None) was an AttributeError
    if handle is None:
        name = type(model).__name__
        raise ArgumentError(f"model must be one streamer.load returned (got a {name}).")
    check_tokenizer(tokenizer)
    if isinstance(prompt, str):
        # as mlx-lm does: no second BOS when the text already starts with one
        bos = tokenizer.bos_token
        return tokenizer.encode(prompt, add_special_tokens=not (bos and prompt.startswith(bos)))
    tokens = [int(t) for t in prompt]  # numpy's integers too: mx.array refuses them
    arguments.check_prompt_ids(tokens, tokenizer)
    return tokens


def cached_tokens(cache: object) -> int:
    """The positions a reused prompt cache holds (an earlier turn's), which the new prompt
    follows: its attention layers' offset, a CacheList's parts too (a recurrent layer's state
    counts none). Not a list: none, and refused by name (generation_objects.check_objects)."""
    return max((c.offset for c in _positional(cache)), default=0)


def leveled(cache: object) -> None:
    """A prompt cache after an answer stopped inside the model's forward pass (a Ctrl-C during
    an expert read, a read's error): its earlier layers hold one more step than the later ones,
    and the next answer would run each layer at other positions, silently wrong. Every layer is
    trimmed to the positions all of them hold, as if that step never ran. Where a layer cannot
    be (a recurrent state, which has no positions; a full rotating window) the cache is left as
    mlx-lm leaves it."""
    parts = _positional(cache)
    held = min((c.offset for c in parts), default=0)
    ahead = [c for c in parts if c.offset > held]
    every_layer = len(parts) == len(_parts(cache))
    if ahead and every_layer and all(c.is_trimmable() for c in ahead):
        for c in ahead:
            c.trim(c.offset - held)


def _parts(cache: object) -> list:
    """A prompt cache's layers, a CacheList's parts each; none when it is not a list."""
    layers = cache if isinstance(cache, list) else ()
    return [part for c in layers for part in getattr(c, "caches", (c,))]


def _positional(cache: object) -> list:
    """The parts that count positions: an offset each (a recurrent state has none)."""
    return [c for c in _parts(cache) if type(getattr(c, "offset", None)) is int]


def within_context(model: nn.Module, held: int, positions: int, max_tokens: int) -> int:
    """max_tokens, refused with the numbers where it and the prompt's positions (its tokens, or
    its input_embeddings alone, after the `held` a prompt cache holds) pass the model's context:
    beyond its trained positions a model degrades into plausible nonsense. mlx-lm's "no limit"
    (-1): what the context leaves."""
    handle = streaming(model)
    context = handle.context_length
    said = f"the prompt is {tokens_text(positions)}"
    if held:
        said += f" after the {tokens_text(held)} prompt_cache holds"
    field = context_field(handle.config)
    where = f"the model's context is {tokens_text(context)} ({field} in config.json)"
    shorten = "shorten the prompt" + (" or start a new prompt_cache" if held else "")
    positions += held
    if max_tokens == arguments.NO_LIMIT:
        if not context:
            raise refusal(
                lambda name: (
                    f"{name('max_tokens', -1)} generates until the model's context is full, but "
                    "config.json gives no context (max_position_embeddings): give a number of "
                    "tokens."
                )
            )
        if positions >= context:
            raise ArgumentError(f"{said} but {where}, which leaves no room: {shorten}.")
        return context - positions
    if context and positions > context:
        raise ArgumentError(f"{said} but {where}: {shorten}.")
    if context and positions + max_tokens > context:
        raise refusal(
            lambda name: (
                f"{said} and {name('max_tokens')} is {max_tokens}, but {where}: lower "
                f"{name('max_tokens')} to at most {context - positions} or {shorten}."
            )
        )
    return max_tokens
