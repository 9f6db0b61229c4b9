"""Where drafted tokens come from: a small resident model (as mlx-lm drafts), or the prompt itself.

A drafter sees every token of the sequence (`start`, then `advance` after each verify pass) and
proposes up to n tokens that may come next (`draft`). What it proposes never changes the output,
only how many tokens a pass keeps: the target model checks every draft.
"""

from __future__ import annotations

from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

# what a prompt-lookup drafter matches by default: the last 3 tokens, then 2, then 1
PROMPT_LOOKUP_NGRAM = 3


def prefill(
    model: nn.Module,
    cache: list,
    tokens: list[int],
    step: int,
    quantize: Callable[[list], None] = lambda cache: None,
    progress: Callable[[int, int], None] = lambda done, total: None,
) -> int:
    """Compute all but the last of `tokens` into `cache`, in chunks of `step` (as mlx-lm's
    generate_step prefills): the last is the next pass's first input. Returns how many were
    computed."""
    done = 0
    progress(0, len(tokens))
    while len(tokens) - done > 1:
        n = min(step, len(tokens) - done - 1)
        model(mx.array(tokens[done : done + n], mx.uint32)[None], cache=cache)
        quantize(cache)
        mx.eval([c.state for c in cache])
        done += n
        progress(done, len(tokens))
        mx.clear_cache()
    return done


class DraftModel:
    """mlx-lm's drafting: the draft model samples each draft with the target's sampler (the same
    random draws, in the same order, as mlx_lm's speculative_generate_step), and its KV cache is
    trimmed back to the accepted tokens after each pass."""

    def __init__(self, model: nn.Module, sampler: Callable, vocabulary: int | None = None):
        self.model, self.sampler = model, sampler
        self.vocabulary = vocabulary  # the target's tokens: ids past them are not drafts
        self.cache = make_prompt_cache(model)
        self.pending: list[int] = []  # tokens the draft model has not computed yet

    def start(self, tokens: list[int], step: int) -> None:
        """Compute all but the last of `tokens` (the sequence so far) into the draft's cache,
        `step` at a time: the target's prefill_step_size, as mlx-lm's drafting reads it."""
        done = prefill(self.model, self.cache, tokens, step)
        self.pending = tokens[done:]

    def draft(self, n: int) -> list[int]:
        drafts, inputs = [], self.pending
        for _ in range(n):
            logits = self.model(mx.array(inputs, mx.uint32)[None], cache=self.cache)[0, -1:]
            token = self.sampler(logits - mx.logsumexp(logits, axis=-1, keepdims=True))
            mx.async_eval(token)
            drafts.append(token)
            inputs = token
        drafts = mx.concatenate(drafts).tolist() if drafts else []
        kept = next((i for i, t in enumerate(drafts) if t >= (self.vocabulary or t + 1)), n)
        if kept < len(drafts):  # a draft of a larger vocabulary (same tokenizer, more rows): the
            # target would read its embedding out of bounds, and the garbage changed its output
            trim_prompt_cache(self.cache, len(drafts) - max(kept, 1))
            self.pending = self.pending if kept else []  # none kept: the inputs were computed
            drafts = drafts[:kept]
        return drafts

    def advance(self, drafts: list[int], accepted: int, token: int) -> None:
        """`accepted` of `drafts` were kept, then the target gave `token`. The draft computed
        every draft but the last: the rejected ones are trimmed from its cache."""
        if not drafts:
            self.pending = self.pending + [token]
            return
        trim_prompt_cache(self.cache, max(len(drafts) - accepted - 1, 0))
        self.pending = ([drafts[-1]] if accepted == len(drafts) else []) + [token]


class PromptLookup:
    """Prompt lookup decoding: the drafts are what followed the latest earlier occurrence of the
    sequence's last `ngram` tokens (then of fewer, down to one), in the prompt and output so far.
    It pays where text repeats: code edits, quoting, reformatting. No match: no drafts, and the
    pass is a plain decode step."""

    def __init__(self, ngram: int = PROMPT_LOOKUP_NGRAM):
        self.ngram = ngram  # at least 1: checked with prompt_lookup (stream.drafter)
        self.tokens: list[int] = []

    def start(self, tokens: list[int], step: int) -> None:
        """`step`: the target's prefill step, which a lookup has nothing to compute with."""
        self.tokens = list(tokens)

    def draft(self, n: int) -> list[int]:
        tokens = np.array(self.tokens)
        for size in range(min(self.ngram, len(tokens) - 1), 0, -1):
            # every window before the tail itself (its continuation is not empty) that equals it
            windows = np.lib.stride_tricks.sliding_window_view(tokens[:-1], size)
            found = np.flatnonzero((windows == tokens[-size:]).all(axis=1))
            if len(found):
                start = int(found[-1]) + size  # the latest: text repeats what it said last
                return tokens[start : start + n].tolist()
        return []

    def advance(self, drafts: list[int], accepted: int, token: int) -> None:
        self.tokens += [*drafts[:accepted], token]
