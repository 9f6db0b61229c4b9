"""mlx_lm.stream_generate's responses around the speculative loop, and the drafter asked for."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx_lm
from mlx_lm.generate import GenerationResponse, generation_stream, wired_limit
from mlx_lm.sample_utils import make_sampler
from mlx_lm.tokenizer_utils import TokenizerWrapper

from ..arguments import check_at_least, check_draft_tokens, check_token_ids, vocabulary
from ..errors import StreamerError
from .draft_model import load_draft_model
from .drafters import PROMPT_LOOKUP_NGRAM, DraftModel, PromptLookup
from .loop import speculative_generate_step

NUM_DRAFT_TOKENS = 3  # mlx_lm.generate's --num-draft-tokens default
KEYWORDS = {"draft_model", "num_draft_tokens", "prompt_lookup", "prompt_cache_tokens"}


def drafter(
    kwargs: dict, tokenizer: TokenizerWrapper, dtype: mx.Dtype | None
) -> DraftModel | PromptLookup | None:
    """The drafter the keywords ask for (popped from `kwargs`), or None for plain decoding: no
    draft_model nor prompt_lookup, or num_draft_tokens=0 (a request turning drafts off). A
    draft_model named by folder is loaded in `dtype`, the streamed model's load's."""
    draft_model = kwargs.pop("draft_model", None)
    lookup = kwargs.pop("prompt_lookup", None)
    held = kwargs.get("prompt_cache_tokens")
    if held is not None:  # else the drafter's TypeError in the loop, or its n-grams of anything
        if not isinstance(held, (list, tuple)):
            raise StreamerError(
                "prompt_cache_tokens must be a list of the token ids prompt_cache holds "
                f"(got {held!r:.60})."
            )
        check_token_ids(held, "prompt_cache_tokens", vocabulary(tokenizer))
    k = kwargs.get("num_draft_tokens")
    if k is not None:
        check_draft_tokens(k, "num_draft_tokens", 0)
    if draft_model is not None and lookup not in (None, False, 0):
        raise StreamerError("give draft_model= or prompt_lookup=, not both: one drafter drafts.")
    if k == 0 or (draft_model is None and lookup in (None, False, 0)):
        kwargs.pop("num_draft_tokens", None)
        kwargs.pop("prompt_cache_tokens", None)
        return None
    for name, why in (
        ("max_kv_size", "drafting into a bounded KV cache is not checked exact yet"),
        ("input_embeddings", "drafts are tokens"),
    ):
        if kwargs.get(name) is not None:
            raise StreamerError(f"{name} cannot be combined with speculative decoding: {why}.")
        kwargs.pop(name, None)
    if draft_model is not None:
        if not isinstance(draft_model, (str, Path, nn.Module)):  # else mlx-lm's AttributeError
            raise StreamerError(
                "draft_model must be a model (as mlx_lm.load returns it) or its folder or "
                f"org/name (got {draft_model!r:.60})."
            )
        if isinstance(draft_model, (str, Path)):
            draft_model = load_draft_model(draft_model, tokenizer, dtype)
        sampler = kwargs.get("sampler") or make_sampler(0.0)
        return DraftModel(draft_model, sampler, vocabulary=vocabulary(tokenizer))
    if lookup is True:
        return PromptLookup(PROMPT_LOOKUP_NGRAM)
    check_at_least(lookup, "prompt_lookup", 1)  # as --prompt-lookup: an n-gram's tokens
    return PromptLookup(lookup)


def stream_generate(
    model: nn.Module, tokenizer: TokenizerWrapper, prompt: list[int], max_tokens: int, kwargs: dict
) -> Iterator[GenerationResponse]:
    """mlx_lm.stream_generate(model, tokenizer, prompt, max_tokens, **kwargs), drafting as
    `kwargs` ask (checked now, before any token): with a drafter, the speculative loop's."""
    drafts = drafter(kwargs, tokenizer, model.streamer.load_dtype)
    if drafts is None:
        return mlx_lm.stream_generate(model, tokenizer, prompt, max_tokens=max_tokens, **kwargs)
    return responses(model, tokenizer, prompt, drafts, max_tokens=max_tokens, **kwargs)


def responses(
    model: nn.Module,
    tokenizer: TokenizerWrapper,
    prompt: list[int],
    drafter: DraftModel | PromptLookup,
    *,
    max_tokens: int,
    stream=generation_stream,
    num_draft_tokens: int | None = None,
    **kwargs,
) -> Iterator[GenerationResponse]:
    """mlx_lm.stream_generate's responses (from_draft says which tokens a draft gave), ending as
    it ends: at an EOS token or max_tokens."""
    prompt_array = mx.array(prompt)
    detokenizer = tokenizer.detokenizer
    steps = speculative_generate_step(
        prompt_array,
        model,
        drafter,
        num_draft_tokens=num_draft_tokens or NUM_DRAFT_TOKENS,
        max_tokens=max_tokens,
        **kwargs,
    )
    with wired_limit(model, [stream]), mx.stream(stream):
        tic = time.perf_counter()
        for n, (token, logprobs, from_draft) in enumerate(steps):
            if n == 0:
                prompt_tps = len(prompt) / (time.perf_counter() - tic)
                tic = time.perf_counter()
            eos = token in tokenizer.eos_token_ids
            if not eos:
                detokenizer.add_token(token)
            last = eos or n + 1 == max_tokens
            if last:
                detokenizer.finalize()
            yield GenerationResponse(
                text=detokenizer.last_segment,
                token=token,
                logprobs=logprobs,
                from_draft=from_draft,
                prompt_tokens=len(prompt),
                prompt_tps=prompt_tps,
                generation_tokens=n + 1,
                generation_tps=(n + 1) / (time.perf_counter() - tic),
                peak_memory=mx.get_peak_memory() / 1e9,
                finish_reason=("stop" if eos else "length") if last else None,
            )
            if last:
                break
