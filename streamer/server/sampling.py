"""A request's sampling fields -> mlx-lm's sampler and logits processors.

A logit_bias key past the tokenizer's vocabulary is refused with the request (`check_logit_bias`),
before its prompt is tokenized or computed. The logits' width, first known at the first step, may be
narrower (a tokenizer's added tokens past the model's embedding), so the keys
are checked against it there too (an ApiError out of the generation, before any token); a top_k at
or past it keeps every token (the library's sampler).
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
from mlx_lm.sample_utils import make_logits_processors

from ..arguments import at_first_step
from ..mlx_lm_keywords import any_top_k_sampler
from .api import Sampling
from .fields import check_ids_below


def sampler_and_processors(
    sampling: Sampling, held: list[int] | None = None
) -> tuple[Callable, list[Callable]]:
    """`held`: the tokens a prompt cache holds before those generation is given, which the
    processors see too (`_seeing`)."""
    sampler = any_top_k_sampler(
        sampling.temperature, sampling.top_p, top_k=sampling.top_k, min_p=sampling.min_p
    )
    processors = make_logits_processors(
        sampling.logit_bias,
        sampling.repetition_penalty,
        presence_penalty=sampling.presence_penalty,
        frequency_penalty=sampling.frequency_penalty,
    )
    if held:
        processors = [_seeing(held, p) for p in processors]
    check_width = at_first_step(lambda width: check_logit_bias(sampling.logit_bias, width))
    return sampler, [check_width, *processors]


def _seeing(held: list[int], processor: Callable) -> Callable:
    """`processor` given the tokens `held` before the ones it is given: mlx-lm's get those of the
    prompt computed now, so after a prompt-cache hit a penalty's window (the last 20 tokens)
    held fewer of the prompt's, and a request asked again was answered otherwise."""
    before = mx.array(held)

    def processor_of_all(tokens: mx.array, logits: mx.array) -> mx.array:
        return processor(mx.concatenate([before, tokens]), logits)

    return processor_of_all


def check_logit_bias(bias: dict[int, float] | None, vocabulary: int) -> None:
    """ApiError 400 for a logit_bias key at or past `vocabulary`: mlx-lm's would add out of bounds.
    Its keys are distinct (duplicate keys are refused), so this bounds the map's size too."""
    check_ids_below(bias or (), "logit_bias", vocabulary)
