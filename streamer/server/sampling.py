"""A request's sampling fields -> mlx-lm's sampler and logits processors.

The logits' width (the model's vocabulary) is first known at the first step, so the values that
depend on it are checked there: a logit_bias key past it is refused (an ApiError out of the
generation, before any token); a top_k at or past it keeps every token (the library's sampler).
"""

from __future__ import annotations

from collections.abc import Callable

from mlx_lm.sample_utils import make_logits_processors

from ..arguments import at_first_step
from ..mlx_lm_keywords import any_top_k_sampler
from .api import Sampling
from .fields import ApiError


def sampler_and_processors(sampling: Sampling) -> tuple[Callable, list[Callable]]:
    sampler = any_top_k_sampler(
        sampling.temperature, sampling.top_p, top_k=sampling.top_k, min_p=sampling.min_p
    )

    def check_width(width: int) -> None:
        past = [k for k in sampling.logit_bias or () if k >= width]
        if past:
            raise ApiError(
                400,
                f"logit_bias: token id {past[0]} is past the model's vocabulary ({width} tokens)",
                param="logit_bias",
            )

    processors = make_logits_processors(
        sampling.logit_bias,
        sampling.repetition_penalty,
        presence_penalty=sampling.presence_penalty,
        frequency_penalty=sampling.frequency_penalty,
    )
    return sampler, [at_first_step(check_width), *processors]
