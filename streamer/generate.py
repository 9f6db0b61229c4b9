"""Text generation in the style of mlx-lm, with expert-streaming statistics on every response."""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import generate_step, generation_stream
from mlx_lm.sample_utils import make_logits_processors, make_sampler
from mlx_lm.tokenizer_utils import TokenizerWrapper

from . import arguments
from .api_request import ids_in_vocabulary, plain_keywords, plain_number, prompt_tokens
from .arguments import check_request, check_sampling
from .errors import StreamerError, one_line
from .input_embeddings import check_input_embeddings
from .kv_quantization import check_kv_cache_quantizes, check_prompt_cache
from .run_stats import RunStats, reset_peak_rss, run_stats
from .speculative import stream as speculative


@dataclass(frozen=True)
class Response:
    """One streamed piece of text; `stats` covers the run so far (its expert counters leave out
    the calls not yet settled, but in the last piece: `settled` completes them), `logprobs`
    (log-softmax over the vocabulary) is the distribution `token` was sampled from."""

    text: str
    token: int
    finish_reason: str | None
    stats: RunStats
    logprobs: mx.array | None = None


def stream_generate(
    model: nn.Module,
    tokenizer: TokenizerWrapper,
    prompt: str | list[int] | mx.array,
    max_tokens: int = 256,
    *,
    temp: float = 0.0,
    top_p: float = 1.0,
    seed: int | None = None,
    **kwargs,
) -> Iterator[Response]:
    """Yield text as it is generated. mlx-lm's sampling keywords (top_k, min_p, xtc_...) go to
    its make_sampler, its logits-processor keywords (repetition_penalty, logit_bias, ...) to
    make_logits_processors, the rest to mlx_lm.stream_generate (max_kv_size, prompt_cache, ...);
    an unknown keyword is refused by name."""
    if not isinstance(prompt, (str, list, tuple)) and hasattr(prompt, "tolist"):
        prompt = prompt.tolist()  # token ids in an mx.array (or numpy's), as mlx-lm takes them
    temp, top_p, seed, max_tokens = map(plain_number, (temp, top_p, seed, max_tokens))
    kwargs = plain_keywords(kwargs)
    check_request(prompt, max_tokens)
    check_sampling(temp, top_p, seed, top_k=kwargs.get("top_k", 0), min_p=kwargs.get("min_p", 0.0))
    arguments.check_keywords(kwargs)
    prompt = prompt_tokens(model, tokenizer, prompt, max_tokens, kwargs.get("prompt_cache"))
    kv_bits = kwargs.get("kv_bits")
    if kv_bits is not None:
        check_kv_cache_quantizes(model, kwargs)
    _check_objects(model, kwargs, len(prompt))
    kwargs = _mlx_lm_keywords(temp, top_p, kwargs)
    with _claimed(model.streamer):
        if seed is not None:  # claimed first: another thread's answer draws from the same seed
            mx.random.seed(seed)
        model.streamer.stats.reset()
        mx.reset_peak_memory()
        reset_peak_rss()
        try:  # mlx_lm.stream_generate's responses, or with drafts the speculative loop's
            for r in speculative.stream_generate(model, tokenizer, prompt, max_tokens, kwargs):
                stats = run_stats(
                    model,
                    r.prompt_tokens,
                    r.prompt_tps,
                    r.generation_tokens,
                    r.generation_tps,
                    settle=r.finish_reason is not None,
                )
                yield Response(r.text, r.token, r.finish_reason, stats, r.logprobs)
        except ValueError as e:  # mx.quantize's: the keys' width is not a multiple of the group
            if kv_bits is None or not str(e).startswith("[quantize]"):
                raise
            raise StreamerError(
                f"kv_group_size {kwargs.get('kv_group_size', 64)} does not divide this model's "
                f"key and value widths ({one_line(e)}): choose a smaller kv_group_size."
            ) from None
        # mlx-lm leaves one step in flight on its stream; under expert parallelism its all_sums
        # must finish before any later collective, or the ranks' messages interleave
        mx.synchronize(kwargs.get("stream", generation_stream))


_CLAIMS = threading.Lock()  # a model's check and claim, one thread at a time


@contextmanager
def _claimed(handle) -> Iterator[None]:
    """The model for this thread while it generates. MLX's streams belong to the thread that
    made them, so a second thread generating on one model at once failed inside the slot pool
    (RuntimeError: There is no Stream(cpu, 5) in current thread), and both answers share the
    expert caches and stats. Generators interleaved in one thread still take turns."""
    me = threading.get_ident()
    with _CLAIMS:
        owner, depth = getattr(handle, "generating", (None, 0))
        if depth and owner != me:
            raise StreamerError(
                "this model is generating an answer in another thread, and a model generates one "
                "answer at a time: wait for that answer to finish (or close its stream), or load "
                "the model once for each thread."
            )
        handle.generating = (me, depth + 1)
    try:
        yield
    finally:  # also when the stream is closed or dropped unfinished
        with _CLAIMS:
            handle.generating = (me, handle.generating[1] - 1)


_SAMPLER_KEYWORDS = set(inspect.signature(make_sampler).parameters) - {"temp", "top_p"}
_PROCESSOR_KEYWORDS = set(inspect.signature(make_logits_processors).parameters)
_STEP_KEYWORDS = (
    set(inspect.signature(generate_step).parameters) - {"prompt", "model", "max_tokens"}
) | speculative.KEYWORDS


def _mlx_lm_keywords(temp: float, top_p: float, kwargs: dict) -> dict:
    """mlx_lm.stream_generate's keywords from the user's: a sampler and logits processors built
    by mlx-lm from its own sampling keywords."""
    unknown = sorted(set(kwargs) - _SAMPLER_KEYWORDS - _PROCESSOR_KEYWORDS - _STEP_KEYWORDS)
    if unknown:
        known = ", ".join(sorted(_SAMPLER_KEYWORDS | _PROCESSOR_KEYWORDS | _STEP_KEYWORDS))
        raise StreamerError(
            f"unknown keyword argument {unknown[0]!r}; known: temp, top_p, seed, {known}."
        )
    checks = ids_in_vocabulary(kwargs)
    if kwargs.get("sampler", 0) is None:  # as mlx-lm reads it: none given, so temp and top_p hold
        del kwargs["sampler"]
    sampling = {k: kwargs.pop(k) for k in _SAMPLER_KEYWORDS & set(kwargs)}
    processing = {k: kwargs.pop(k) for k in _PROCESSOR_KEYWORDS & set(kwargs)}
    if "sampler" in kwargs and sampling:
        raise StreamerError(f"give either sampler= or {sorted(sampling)[0]}=, not both.")
    kwargs.setdefault("sampler", any_top_k_sampler(temp, top_p, **sampling))
    if processing or checks:
        kwargs["logits_processors"] = [
            *(kwargs.get("logits_processors") or []),
            *checks,
            *(make_logits_processors(**processing) if processing else []),
        ]
    return kwargs


def _check_objects(model: nn.Module, kwargs: dict, prompt_tokens: int) -> None:
    """mlx-lm's keywords that take objects, refused here by name rather than as a TypeError or
    AttributeError deep in its loop: functions (or None), logits_processors a list of them,
    prompt_cache one cache a layer (as make_prompt_cache makes), stream an MLX stream,
    input_embeddings a vector a prompt token."""
    check_input_embeddings(model, kwargs.get("input_embeddings"), prompt_tokens)
    for name in ("sampler", "prompt_progress_callback"):
        if kwargs.get(name) is not None and not callable(kwargs[name]):
            raise StreamerError(f"{name} must be a function or None (got {kwargs[name]!r:.60}).")
    processors = kwargs.get("logits_processors")
    if processors is not None and not (
        isinstance(processors, (list, tuple)) and all(map(callable, processors))
    ):
        raise StreamerError(
            "logits_processors must be a list of functions (tokens, logits) -> logits, or None "
            f"(got {processors!r:.60})."
        )
    if kwargs.get("prompt_cache") is not None:
        check_prompt_cache(model, kwargs["prompt_cache"])
    if "stream" in kwargs and not isinstance(kwargs["stream"], _STREAMS):
        raise StreamerError(
            "stream must be an MLX stream or device, such as mx.cpu "
            f"(got {kwargs['stream']!r:.60})."
        )


_STREAMS = (mx.Stream, mx.ThreadLocalStream, mx.Device, mx.DeviceType)


def any_top_k_sampler(temp: float, top_p: float = 1.0, top_k: int = 0, **rest) -> Callable:
    """mlx-lm's make_sampler, but a top_k at or past the logits' width (the vocabulary, known at
    the first step) keeps every token: mlx-lm refuses such a k, and keeping the k likeliest of
    fewer tokens is keeping them all."""
    samplers: dict[int, Callable] = {}

    def sampler(logprobs: mx.array) -> mx.array:
        width = logprobs.shape[-1]
        if width not in samplers:
            k = top_k if top_k < width else 0
            samplers[width] = make_sampler(temp, top_p=top_p, top_k=k, **rest)
        return samplers[width](logprobs)

    return sampler


def generate(
    model: nn.Module,
    tokenizer: TokenizerWrapper,
    prompt: str | list[int] | mx.array,
    max_tokens: int = 256,
    *,
    verbose: bool = False,
    **kwargs,
) -> str:
    """The generated text; with `verbose`, print it as it streams and then the stats line."""
    text = []
    response = None
    for response in stream_generate(model, tokenizer, prompt, max_tokens, **kwargs):
        text.append(response.text)
        if verbose:
            print(response.text, end="", flush=True)
    if verbose and response is not None:
        print("\n" + response.stats.line())
    return "".join(text)
