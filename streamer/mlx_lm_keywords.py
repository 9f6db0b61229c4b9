"""The user's generation keywords made mlx_lm.stream_generate's: numpy's numbers made Python's,
unknown keywords refused by name, a sampler and logits processors built by mlx-lm from its own
sampling keywords."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_logits_processors, make_sampler

from . import arguments
from .errors import ArgumentError
from .speculative import stream as speculative

_SAMPLER_KEYWORDS = set(inspect.signature(make_sampler).parameters) - {"temp", "top_p"}
_PROCESSOR_KEYWORDS = set(inspect.signature(make_logits_processors).parameters)
_STEP_KEYWORDS = (
    set(inspect.signature(generate_step).parameters) - {"prompt", "model", "max_tokens"}
) | speculative.KEYWORDS

_WINDOWS = {"repetition_context_size", "presence_context_size", "frequency_context_size"}
_LONGEST_WINDOW = (1 << 31) - 1


def mlx_lm_keywords(temp: float, top_p: float, kwargs: dict) -> dict:
    """mlx_lm.stream_generate's keywords from the user's: a sampler and logits processors built
    by mlx-lm from its own sampling keywords."""
    unknown = sorted(set(kwargs) - _SAMPLER_KEYWORDS - _PROCESSOR_KEYWORDS - _STEP_KEYWORDS)
    if unknown:
        known = ", ".join(sorted(_SAMPLER_KEYWORDS | _PROCESSOR_KEYWORDS | _STEP_KEYWORDS))
        raise ArgumentError(
            f"unknown keyword argument {unknown[0]!r}; known: temp, top_p, seed, {known}."
        )
    if kwargs.get("sampler", 0) is None:  # as mlx-lm reads it: none given, so temp and top_p hold
        del kwargs["sampler"]
    sampling = {k: kwargs.pop(k) for k in _SAMPLER_KEYWORDS & set(kwargs)}
    processing = {k: kwargs.pop(k) for k in _PROCESSOR_KEYWORDS & set(kwargs)}
    # with a sampler given, temp and top_p were ignored without a word
    asked = ["temp"] * (temp != 0.0) + ["top_p"] * (top_p != 1.0) + sorted(sampling)
    if "sampler" in kwargs and asked:
        raise ArgumentError(
            f"give either sampler= or {asked[0]}=, not both: the sampler alone draws the tokens."
        )
    kwargs.setdefault("sampler", any_top_k_sampler(temp, top_p, **sampling))
    for name in _WINDOWS & set(processing):  # past the tokens generated, a window is all of them
        if processing[name] is not None:  # and past int32, MLX's slice failed (std::bad_cast)
            processing[name] = min(processing[name], _LONGEST_WINDOW)
    if processing:
        kwargs["logits_processors"] = [
            *(kwargs.get("logits_processors") or []),
            *arguments.logit_bias_in_vocabulary(processing.get("logit_bias")),
            *make_logits_processors(**processing),
        ]
    return kwargs


def plain_number(value: object) -> object:
    """A numpy or MLX scalar (np.float32(0.7), mx.array(5), np.True_) as Python's number or bool,
    as mlx-lm computes with it (a float32 temp failed in its compiled sampler); the checks read
    Python's types only. Anything else as given, for the checks to judge."""
    if getattr(value, "shape", None) == () and hasattr(value, "item"):
        return value.item()
    return value


def plain_keywords(kwargs: dict) -> dict:
    """The keywords' numpy scalars as Python's, logit_bias's ids and biases too (MLX's mx.array
    refuses numpy's integers: a ValueError)."""
    kwargs = {name: plain_number(value) for name, value in kwargs.items()}
    bias = kwargs.get("logit_bias")
    if isinstance(bias, dict):
        kwargs["logit_bias"] = {plain_number(k): plain_number(v) for k, v in bias.items()}
    return kwargs


def any_top_k_sampler(temp: float, top_p: float = 1.0, top_k: int = 0, **rest) -> Callable:
    """mlx-lm's make_sampler, but a top_k at or past the logits' width (the vocabulary, known at
    the first step) keeps every token: mlx-lm refuses such a k, and keeping the k likeliest of
    fewer tokens is keeping them all. xtc_special_tokens's ids are checked against that width
    (past it, MLX failed at its first evaluation)."""
    samplers: dict[int, Callable] = {}
    special = rest.get("xtc_special_tokens")  # ints from 0 (arguments.check_keywords)

    def sampler(logprobs: mx.array) -> mx.array:
        width = logprobs.shape[-1]
        if width not in samplers:
            if special:
                arguments.check_token_ids(special, "xtc_special_tokens", width)
            k = top_k if top_k < width else 0
            samplers[width] = make_sampler(temp, top_p=top_p, top_k=k, **rest)
        return samplers[width](logprobs)

    return sampler
