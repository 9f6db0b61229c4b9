"""Text generation in the style of mlx-lm, with expert-streaming statistics on every response."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.generate import generation_stream
from mlx_lm.tokenizer_utils import TokenizerWrapper

from . import arguments
from .api_request import cached_tokens, leveled, prompt_tokens, within_context
from .arguments import KV_GROUP_SIZE, check_request, check_sampling
from .errors import ArgumentError, one_line
from .generation_objects import check_objects
from .kv_quantization import check_kv_cache_quantizes
from .mlx_lm_keywords import mlx_lm_keywords, plain_keywords, plain_number
from .response import Response
from .run_stats import reset_peak_rss, run_stats
from .speculative import stream as speculative

# text, or token ids: a list or tuple, or an mx.array or numpy array of them (as mlx-lm takes)
Prompt = str | Sequence[int] | mx.array | np.ndarray


def stream_generate(
    model: nn.Module,
    tokenizer: TokenizerWrapper,
    prompt: Prompt,
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
    prompt = prompt_tokens(model, tokenizer, prompt)
    kv_bits = kwargs.get("kv_bits")
    if kv_bits is not None:
        check_kv_cache_quantizes(model, kwargs)
    check_objects(model, kwargs, len(prompt))
    positions = len(prompt) or len(kwargs["input_embeddings"])  # an empty prompt: embeddings
    held = cached_tokens(kwargs.get("prompt_cache"))
    max_tokens = within_context(model, held, positions, max_tokens)
    kwargs = mlx_lm_keywords(temp, top_p, kwargs)
    with model.streamer.claimed():
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
                yield Response(r.text, r.token, r.finish_reason, stats, r.logprobs, r.from_draft)
        except BaseException as e:  # a Ctrl-C too: stopped mid-step, no layer left a step ahead
            leveled(kwargs.get("prompt_cache"))
            # mx.quantize's ValueError: the keys' width is not a multiple of the group
            quantize = isinstance(e, ValueError) and str(e).startswith("[quantize]")
            if kv_bits is None or not quantize:
                raise
            raise ArgumentError(
                f"kv_group_size {kwargs.get('kv_group_size', KV_GROUP_SIZE)} does not divide "
                f"this model's key and value widths ({one_line(e)}): choose a smaller "
                "kv_group_size."
            ) from None
        # mlx-lm leaves one step in flight on its stream; under expert parallelism its all_sums
        # must finish before any later collective, or the ranks' messages interleave
        mx.synchronize(kwargs.get("stream", generation_stream))


def generate(
    model: nn.Module,
    tokenizer: TokenizerWrapper,
    prompt: Prompt,
    max_tokens: int = 256,
    *,
    verbose: bool = False,
    **kwargs,
) -> str:
    """The generated text; with `verbose`, print it as it streams and then the stats line."""
    if isinstance(max_tokens, bool):  # mlx_lm.generate(model, tokenizer, prompt, True)
        raise ArgumentError(
            f"generate's fourth argument is max_tokens (mlx-lm's is verbose; got {max_tokens}): "
            f"pass verbose={max_tokens} by keyword."
        )
    text = []
    response = None
    for response in stream_generate(model, tokenizer, prompt, max_tokens, **kwargs):
        text.append(response.text)
        if verbose:
            print(response.text, end="", flush=True)
    if verbose and response is not None:
        print("\n" + response.stats.line())
    return "".join(text)
