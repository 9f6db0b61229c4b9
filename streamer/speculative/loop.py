"""The speculative decoding loop: mlx_lm's speculative_generate_step, with any drafter, with
verify passes counted as decode in the streaming statistics, and exact against plain decoding.

Each pass feeds the target the last token and up to k drafts in one forward pass: a streamed
MoE layer then syncs once and reads each routed expert once for all k+1 inputs (experts/ treats a
pass as it treats a prompt chunk). The target's token at every position is sampled as plain
decoding samples it; drafts are kept while they equal it, and the first that does not is replaced
by the target's token. So greedy output is plain greedy output, and a sampler gives exactly what
mlx_lm's speculative_generate_step gives (the same draws in the same order). The target's KV
cache is trimmed back to the kept tokens (trim.py: sliding-window caches too, which mlx-lm's
trim_prompt_cache leaves untrimmed once their window is full).

Where this differs from mlx-lm: logits processors see the whole sequence (prompt, output and the
drafts before the position), as they do in plain decoding, so a repetition penalty is applied
exactly as without drafts; with kv_bits no pass crosses quantized_kv_start and the cache is
quantized after the rejected drafts are trimmed, so each position sees the cache quantized or
not as in plain decoding; and a drafter may propose fewer than k tokens (prompt lookup).

On an expert-parallel group every rank runs this loop on the same tokens: a pass is a chunk of
k+1 inputs, as a prompt chunk is, and its logits are the same on every rank after the layers'
sums, so the ranks keep the same drafts and run the same passes (checked once per pass).
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable, Iterator

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.generate import maybe_quantize_kv_cache
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.sample_utils import make_sampler

from ..arguments import KV_GROUP_SIZE, QUANTIZED_KV_START
from ..defaults import PREFILL_STEP
from ..loading.handle import streaming
from ..parallel.group import GroupError, gather_floats
from .drafters import DraftModel, PromptLookup, prefill
from .trim import check_trimmable, trim


def speculative_generate_step(
    prompt: mx.array,
    model: nn.Module,
    drafter: DraftModel | PromptLookup,
    *,
    num_draft_tokens: int,
    max_tokens: int = 256,
    sampler: Callable | None = None,
    logits_processors: list[Callable] | None = None,
    prompt_cache: list | None = None,
    prompt_cache_tokens: list[int] | None = None,
    prefill_step_size: int = PREFILL_STEP,
    kv_bits: int | None = None,
    kv_group_size: int = KV_GROUP_SIZE,
    quantized_kv_start: int = QUANTIZED_KV_START,  # as plain decoding's (generate_step's)
    prompt_progress_callback: Callable[[int, int], None] | None = None,
) -> Iterator[tuple[int, mx.array, bool]]:
    """Yield (token, logprobs, from_draft) as mlx_lm's speculative_generate_step does.
    `prompt_cache_tokens`: the tokens `prompt_cache` already holds (the drafter sees them too)."""
    cache, quantize = _kv_cache(model, prompt_cache, kv_bits, kv_group_size, quantized_kv_start)
    sampler = sampler or make_sampler(0.0)
    handle = streaming(model)
    stats = handle.stats if handle is not None else None
    prompt = prompt.tolist()
    progress = prompt_progress_callback or (lambda *_: None)
    y = prompt[prefill(model, cache, prompt, prefill_step_size, quantize, progress)]
    seen = prompt[:-1]  # before the pass's first input: what processors see, as in generate_step
    drafter.start([*(prompt_cache_tokens or []), *prompt], prefill_step_size)
    emitted = unfed = 0  # unfed: inputs of the pass under way past the tokens yielded but one
    in_step = _lockstep(handle)
    # with kv_bits no pass crosses quantized_kv_start: plain decoding computes each position
    # before it on the cache as it is, each from it on quantized (the cache is quantized once
    # it holds that many kept tokens, after the pass's rejected drafts are trimmed)
    room = functools.partial(_room, num_draft_tokens, kv_bits and quantized_kv_start)
    position = max((c.offset for c in cache if hasattr(c, "offset")), default=0)
    drafts = drafter.draft(min(max_tokens, room(position)))
    in_step(emitted, [y], drafts)
    try:
        while emitted < max_tokens:
            inputs = [y, *drafts]
            tokens, logprobs, accepted = _verify(
                model, cache, inputs, seen, sampler, logits_processors, stats
            )
            position += accepted + 1  # where the next pass starts
            if emitted == 0:
                progress(len(prompt), len(prompt))
            kept = min(accepted + 1, max_tokens - emitted)
            y, upcoming = tokens[accepted], []
            if emitted + kept < max_tokens:  # the next pass's drafts, before this one's tokens go
                drafter.advance(drafts, accepted, y)
                upcoming = drafter.draft(min(max_tokens - emitted - kept, room(position)))
            in_step(emitted + kept, [*tokens[:kept], y], upcoming)
            for i in range(kept):
                emitted += 1
                if stats is not None:
                    stats.drafts.emitted += 1
                unfed = len(drafts) - i  # stopped after this token: the cache ends before it
                yield tokens[i], logprobs[i], i < accepted
            trim(cache, unfed)  # the rejected drafts (and any past max_tokens)
            quantize(cache)
            unfed = 0
            seen += inputs[: accepted + 1]
            drafts = upcoming
    finally:  # the cache holds every token yielded but the last (the next run's first input)
        trim(cache, unfed)
        quantize(cache)  # as plain decoding leaves it
        if stats is not None:
            stats.verifying = None


def _kv_cache(
    model: nn.Module,
    prompt_cache: list | None,
    kv_bits: int | None,
    kv_group_size: int,
    quantized_kv_start: int,
) -> tuple[list, Callable[[list], None]]:
    """The KV cache (a new one unless given; refused if a pass's rejected tokens cannot be trimmed
    from it) and the function that quantizes it after each pass, as generate_step does."""
    own = make_prompt_cache(model)
    cache = prompt_cache if prompt_cache is not None else own
    check_trimmable(cache, own)
    quantize = functools.partial(
        maybe_quantize_kv_cache,
        quantized_kv_start=quantized_kv_start,
        kv_group_size=kv_group_size,
        kv_bits=kv_bits,
    )
    return cache, quantize


def _room(num_draft_tokens: int, start: int | None, position: int) -> int:
    """How many drafts a pass from `position` may hold: with a quantized_kv_start (`start`) still
    ahead, its last input is the last position before it."""
    if not start or position >= start:
        return num_draft_tokens
    return max(min(num_draft_tokens, start - position - 1), 0)


def _verify(model, cache, inputs, seen, sampler, logits_processors, stats):
    """One pass over the last token and its drafts (`inputs`): the token sampled after each input,
    their logprobs, and how many drafts were kept (each agreeing with the token sampled before)."""
    drafts = inputs[1:]
    if stats is not None:
        stats.start_pass()
    logits = model(mx.array(inputs, mx.uint32)[None], cache=cache)[0]
    tokens, logprobs = _sample(logits, seen, inputs, sampler, logits_processors)
    mx.eval(tokens, logprobs)
    tokens = tokens.tolist()
    accepted = 0
    while accepted < len(drafts) and tokens[accepted] == drafts[accepted]:
        accepted += 1
    if stats is not None:
        stats.end_pass(len(drafts), accepted)
    return tokens, logprobs, accepted


def _lockstep(handle) -> Callable[[int, list[int], list[int]], None]:
    """On an expert-parallel group, a check that every rank is in step, called once per pass
    before its tokens are yielded: the same count emitted, the same tokens and the same drafts
    for the next pass. A rank whose pass differed in length would wait in another all_sum than
    the others, and one that stopped at another token would leave them waiting: the group hangs.
    The ranks agree by construction (one model, the same logits after each layer's sums, one
    sampling seed; prompt lookup is deterministic, a draft model is the same resident model on
    every rank); where a rank's arithmetic differs all the same (another chip), every rank stops
    here with one line. Alone: nothing to check."""
    group = handle.group if handle is not None else None
    if group is None:
        return lambda *_: None

    def check(emitted: int, tokens: list[int], drafts: list[int]) -> None:
        digest = zlib.crc32(np.array([*tokens, -1, *drafts], np.int64).tobytes())
        rows = gather_floats(group, [emitted, len(drafts), digest])
        differs = np.flatnonzero((rows != rows[0]).any(axis=1))
        if differs.size:
            raise GroupError(
                f"rank {differs[0]} computed other tokens or drafts than rank 0 by output token "
                f"{min(rows[:, 0]):.0f} (its arithmetic differs): speculative decoding needs "
                "every rank to take the same decisions, so every rank stops. Drop the drafting "
                "flags on this group."
            )

    return check


def _sample(
    logits: mx.array,
    seen: list[int],
    inputs: list[int],
    sampler: Callable,
    processors: list[Callable] | None,
) -> tuple[mx.array, mx.array]:
    """The target's token at every position of the pass, and its logprobs. Without processors
    one sampler call for all positions (as mlx-lm's); with them one per position, each seeing the
    sequence up to that input, as plain decoding does."""
    if not processors:
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        return sampler(logprobs), logprobs
    tokens, rows = [], []
    for i in range(len(inputs)):
        row = logits[i : i + 1]
        tokens_so_far = mx.array([*seen, *inputs[: i + 1]])
        for processor in processors:
            row = processor(tokens_so_far, row)
        row = row - mx.logsumexp(row, axis=-1, keepdims=True)
        tokens.append(sampler(row))
        rows.append(row)
    return mx.concatenate(tokens), mx.concatenate(rows)
