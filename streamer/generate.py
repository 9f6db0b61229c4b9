"""Text generation in the style of mlx-lm, with expert-streaming statistics on every response."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import generation_stream
from mlx_lm.tokenizer_utils import TokenizerWrapper

from . import arguments
from .arguments import check_request, check_sampling, tokens_text
from .errors import StreamerError, one_line
from .generation_objects import check_objects, check_tokenizer
from .kv_quantization import check_kv_cache_quantizes
from .loading.handle import streaming
from .mlx_lm_keywords import mlx_lm_keywords, plain_keywords, plain_number
from .response import Response
from .run_stats import run_stats
from .speculative import stream as speculative


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
    max_tokens, temp, top_p, seed = map(plain_number, (max_tokens, temp, top_p, seed))
    kwargs = plain_keywords(kwargs)
    if not isinstance(prompt, (str, list, tuple)) and hasattr(prompt, "tolist"):
        prompt = prompt.tolist()  # token ids in an mx.array (or numpy's), as mlx-lm takes them
    check_request(prompt, max_tokens, embedded=kwargs.get("input_embeddings") is not None)
    check_sampling(temp, top_p, seed, top_k=kwargs.get("top_k", 0), min_p=kwargs.get("min_p", 0.0))
    arguments.check_keywords(kwargs)
    prompt = _prompt_tokens(model, tokenizer, prompt)
    kv_bits = kwargs.get("kv_bits")
    if kv_bits is not None:
        check_kv_cache_quantizes(model, kwargs)
    check_objects(model, kwargs, len(prompt))
    positions = len(prompt) or len(kwargs["input_embeddings"])  # an empty prompt: embeddings
    max_tokens = _within_context(model, _held(kwargs.get("prompt_cache")), positions, max_tokens)
    kwargs = mlx_lm_keywords(temp, top_p, kwargs)
    with _claimed(model.streamer):
        if seed is not None:  # claimed first: another thread's answer draws from the same seed
            mx.random.seed(seed)
        model.streamer.stats.reset()
        mx.reset_peak_memory()
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
                yield Response(r.text, r.token, r.finish_reason, stats, r.logprobs, r.from_draft)
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


def _prompt_tokens(
    model: nn.Module, tokenizer: TokenizerWrapper, prompt: str | list[int]
) -> list[int]:
    """Tokenized once here, for _within_context to count."""
    handle = streaming(model)  # mlx_lm.load's model (or None) was an AttributeError
    if handle is None:
        name = type(model).__name__
        raise StreamerError(f"model must be one streamer.load returned (got a {name}).")
    check_tokenizer(tokenizer)
    if isinstance(prompt, str):
        # as mlx-lm does: no second BOS when the text already starts with one
        bos = tokenizer.bos_token
        return tokenizer.encode(prompt, add_special_tokens=not (bos and prompt.startswith(bos)))
    tokens = [int(t) for t in prompt]  # numpy's integers too: mx.array refuses them
    arguments.check_prompt_ids(tokens, tokenizer)
    return tokens


def _held(prompt_cache: list | None) -> int:
    """The positions a prompt_cache already holds (an earlier turn's): the new prompt follows
    them. Caches without positions (a state-space layer's) count none."""
    offsets = (getattr(c, "offset", None) for c in prompt_cache or [])
    return max((o for o in offsets if type(o) is int), default=0)


def _within_context(model: nn.Module, held: int, positions: int, max_tokens: int) -> int:
    """max_tokens, refused with the numbers where it and the prompt's positions (its tokens, or
    its input_embeddings alone, after the `held` a prompt_cache holds) pass the model's context:
    beyond its trained positions a model degrades into plausible nonsense. mlx-lm's "no limit"
    (-1): what the context leaves."""
    context = streaming(model).context_length
    said = f"the prompt is {tokens_text(positions)}"
    if held:
        said += f" after the {tokens_text(held)} prompt_cache holds"
    where = (
        f"the model's context is {tokens_text(context)} (max_position_embeddings in config.json)"
    )
    shorten = "shorten the prompt" + (" or start a new prompt_cache" if held else "")
    positions += held
    if max_tokens == arguments.NO_LIMIT:
        if not context:
            raise StreamerError(
                "max_tokens=-1 generates until the model's context is full, but config.json "
                "gives no context (max_position_embeddings): give a number of tokens."
            )
        if positions >= context:
            raise StreamerError(f"{said} but {where}, which leaves no room: {shorten}.")
        return context - positions
    if context and positions > context:
        raise StreamerError(f"{said} but {where}: {shorten}.")
    if context and positions + max_tokens > context:
        raise StreamerError(
            f"{said} and max_tokens is {max_tokens}, but {where}: lower max_tokens to at most "
            f"{context - positions} or {shorten}."
        )
    return max_tokens


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
