"""serve's and chat's KV caches kept in memory across a conversation's turns: the cache a turn
extends is taken out of the kept ones, not copied (a copy of the whole conversation every turn)."""

from __future__ import annotations

import copy

import mlx.core as mx
from mlx_lm.models.cache import KVCache, LRUPromptCache
from mlx_lm.sample_utils import make_logits_processors

import streamer
from streamer.api_request import cached_tokens
from streamer.server import engine as engine_module
from streamer.server.api import Completion, Sampling
from streamer.server.engine import Engine
from streamer.server.fields import ApiError
from streamer.server.jobs import Done, Job, Step
from streamer.server.prompt_cache import PromptCache

TURNS = 10
USER = [7, 21, 99, 150, 8, 64, 300, 12] * 6  # a user's turn, as token ids: 10 turns pass 256


def _conversation(engine: Engine) -> tuple[list[list[int]], list[str], list[int]]:
    """TURNS turns, each the last turn's kept tokens and USER: the tokens kept after each turn
    (its prompt and answer), each answer's text, and the cached tokens each prompt started from."""
    kept: list[list[int]] = []
    insert = engine.prompt_cache.insert_cache
    engine.prompt_cache.insert_cache = lambda m, t, c: (kept.append(t), insert(m, t, c))
    answers, cached = [], []
    for turn in range(TURNS):
        prompt = (kept[-1] if kept else []) + [t + turn for t in USER]
        job = engine.submit(Job(Completion(False, "m", 6, Sampling()), prompt, 6))
        events = []
        while not isinstance(event := job.events.get(timeout=60), Done):
            events.append(event)
        engine.wait_kept()
        answers.append("".join(e.piece.content for e in events if isinstance(e, Step)))
        cached.append(event.cached_tokens)
    return kept, answers, cached


def _copied_bytes(monkeypatch) -> list[int]:
    """The bytes of KV caches deep-copied from now on, one entry a copy."""
    copied, deepcopy = [], copy.deepcopy

    def counting(value, *args):
        if isinstance(value, list) and value and hasattr(value[0], "nbytes"):
            copied.append(sum(c.nbytes for c in value))
        return deepcopy(value, *args)

    monkeypatch.setattr(copy, "deepcopy", counting)
    return copied


def test_a_conversations_cache_is_taken_not_copied_and_answers_stay_the_same(local, monkeypatch):
    """Every turn deep-copied the conversation's whole KV cache, growing with it (quadratic over
    a long chat); the answers stay those the copying cache gave."""
    model, tokenizer = local
    copied = _copied_bytes(monkeypatch)
    before = Engine(model, tokenizer)
    before.prompt_cache = LRUPromptCache(10)  # mlx-lm's: copies what it hands out
    expected = _conversation(before)
    assert copied[-1] > copied[0]  # a copy of the whole conversation each turn, growing
    copied[:] = []
    assert _conversation(Engine(model, tokenizer)) == expected
    assert all(expected[2][1:]) and copied == []


def test_a_turn_whose_client_left_during_its_prompt_leaves_the_conversations_cache_kept(local):
    """The cache a turn extends is taken out of those kept: a client gone during the prompt (the
    job Abandoned) lost it, and the conversation's next turn computed it all again."""
    model, tokenizer = local
    job = None

    def progress(done: int, total: int) -> None:
        if done >= 64 and job is not None:
            job.cancelled.set()  # the client leaves after the prompt's first step

    options = {"prefill_step_size": 64, "prompt_progress_callback": progress}
    engine = Engine(model, tokenizer, options=options)
    first = USER * 2
    _done(engine, engine.submit(Job(Completion(False, "m", 2, Sampling()), first, 2)))
    job = Job(Completion(False, "m", 2, Sampling()), first + USER * 4, 2)
    assert _done(engine, engine.submit(job)).completion_tokens == 0  # abandoned during its prompt
    job = None
    again = Job(Completion(False, "m", 2, Sampling()), first + USER * 4, 2)
    again = _done(engine, engine.submit(again))
    assert again.cached_tokens >= len(first) + 64, again


def _done(engine: Engine, job: Job) -> Done:
    """The submitted job's Done, once its cache is kept."""
    while not isinstance(event := job.events.get(timeout=60), Done):
        pass
    engine.wait_kept()
    return event


def _branches(engine: Engine) -> list[tuple[list[int], int]]:
    """A first turn, then three turns that branch from it, submitted at once: the tokens each
    branch keeps and the cached tokens it started from."""
    kept: list[list[int]] = []
    insert = engine.prompt_cache.insert_cache
    engine.prompt_cache.insert_cache = lambda m, t, c: (kept.append(t), insert(m, t, c))
    _done(engine, engine.submit(Job(Completion(False, "m", 4, Sampling()), USER * 2, 4)))
    jobs = [Job(Completion(False, "m", 4, Sampling()), kept[0] + [3 + i] * 9, 4) for i in range(3)]
    for job in jobs:
        engine.submit(job)
    cached = [_done(engine, job).cached_tokens for job in jobs]
    return list(zip(kept[1:], cached, strict=True))


def test_branches_from_one_kept_turn_answer_as_with_copies(local):
    """Requests that share a kept prefix, sent at once, run in turn on the engine's thread: the
    first takes the prefix's cache and the others start from its kept sequence, trimmed (a
    copy), as they did when every fetch was a copy."""
    model, tokenizer = local
    before = Engine(model, tokenizer)
    before.prompt_cache = LRUPromptCache(10)
    expected = _branches(before)
    assert _branches(Engine(model, tokenizer)) == expected
    assert all(cached >= len(USER) * 2 for _, cached in expected)


def _failing_at_sample(monkeypatch, failing: int) -> None:
    """The engine's sampler raises (as an expert's read may) at its `failing`-th call from now
    on: after the prompt, every layer of that step computed."""
    calls = 0
    chosen = engine_module.sampler_and_processors

    def sampler_and_processors(sampling: Sampling, held: list[int]):
        sampler, processors = chosen(sampling, held)

        def sample(logprobs):
            nonlocal calls
            calls += 1
            if calls == failing:
                raise OSError(5, "Input/output error")
            return sampler(logprobs)

        return sample, processors

    monkeypatch.setattr(engine_module, "sampler_and_processors", sampler_and_processors)


def test_a_turn_that_fails_mid_answer_leaves_what_it_computed_kept(local, monkeypatch):
    """The cache a turn extends is taken out of those kept: a failure in a later step (a read's
    error, a logit_bias past the logits' width found at the first step) lost it, and the
    conversation's next turn computed it all again. What is kept holds the tokens it is kept
    under: the failed step had fed a token never sent."""
    model, tokenizer = local
    engine = Engine(model, tokenizer)
    kept: list[tuple[list[int], int]] = []  # each sequence kept, and the positions its cache holds
    insert = engine.prompt_cache.insert_cache
    engine.prompt_cache.insert_cache = lambda m, t, c: (
        kept.append((t, cached_tokens(c))),
        insert(m, t, c),
    )
    _done(engine, engine.submit(Job(Completion(False, "m", 2, Sampling()), USER * 2, 2)))
    prompt = kept[0][0] + USER * 4  # the next turn: it takes the first turn's cache and extends it
    _failing_at_sample(monkeypatch, failing=3)  # the first two tokens made, the second fed
    job = engine.submit(Job(Completion(False, "m", 6, Sampling()), prompt, 6))
    while not isinstance(event := job.events.get(timeout=60), ApiError):
        assert not isinstance(event, Done), event
    assert event.status == 500
    monkeypatch.undo()
    cut, held = kept[1]
    assert cut[: len(prompt)] == prompt and held == len(cut), (len(cut), held)
    again = _done(engine, engine.submit(Job(Completion(False, "m", 2, Sampling()), prompt, 2)))
    assert again.cached_tokens == len(prompt) - 1, again  # the last one gives the first logits
    assert again.stats.prompt_tokens == 1  # the tokens prefilled


# What PromptCache uses of mlx-lm's LRUPromptCache that is not its public API (which has no way to
# hand out a kept cache uncopied, nor to drop one entry by its tokens): the attribute, its methods.
PRIVATE = {
    "_trie": ("search", "get", "pop"),
    "_lru": ("remove",),
    "_n_bytes": (),
    "_n_bytes_by_type": (),
}


def _kv(tokens: int) -> list[KVCache]:
    cache = KVCache()
    cache.update_and_fetch(mx.zeros((1, 1, tokens, 4)), mx.zeros((1, 1, tokens, 4)))
    return [cache]


def test_what_it_uses_of_mlx_lms_private_parts_is_as_it_expects():
    """mlx-lm is pinned (pyproject.toml): a new pin whose LRUPromptCache changed shape fails here,
    naming what changed, where PromptCache would have miscounted or kept what it handed out."""
    kept = PromptCache(10)
    for name, methods in PRIVATE.items():
        assert name in vars(kept), f"LRUPromptCache.{name} is gone: prompt_cache.py uses it"
        for method in methods:
            found = getattr(vars(kept)[name], method, None)
            assert callable(found), (
                f"LRUPromptCache.{name}.{method} is gone: prompt_cache.py uses it"
            )
    taken, other = _kv(3), _kv(2)
    kept.insert_cache("m", [1, 2, 3], taken)
    kept.insert_cache("m", [7, 8], other)
    cache, rest = kept.fetch_nearest_cache("m", [1, 2, 3, 4])
    assert cache is taken and rest == [4]  # taken out, not copied
    left = other[0].nbytes
    assert (len(kept), kept.nbytes) == (1, left)
    assert kept.stats_by_type()["assistant"] == {"n_sequences": 1, "n_bytes": left}
    assert kept.fetch_nearest_cache("m", [1, 2, 3, 4]) == (None, [1, 2, 3, 4])
    kept.trim_to(n_sequences=0)
    assert (len(kept), kept.nbytes) == (0, 0)


def test_a_penalty_sees_the_whole_prompt_whether_or_not_its_prefix_was_cached(local):
    """A penalty's window (the last 20 tokens) held only the tokens computed after the cached
    prefix: asked again, a request was answered otherwise (its prompt all cached, the window held
    one token). Token 7, biased up, is in the prompt's last 20: the penalty pushes it down."""
    model, tokenizer = local
    sampling = Sampling(logit_bias={7: 100.0}, repetition_penalty=100.0)
    processors = make_logits_processors({7: 100.0}, 100.0)
    want = streamer.generate(model, tokenizer, USER, 6, logits_processors=processors)
    engine = Engine(model, tokenizer)
    answers = [_answer(engine, USER, sampling) for _ in range(2)]
    assert [done.cached_tokens for _, done in answers] == [0, len(USER) - 1]
    assert [text for text, _ in answers] == [want, want]


def _answer(engine: Engine, prompt: list[int], sampling: Sampling) -> tuple[str, Done]:
    """Six tokens' text after `prompt`, and its Done, once its cache is kept."""
    job = engine.submit(Job(Completion(False, "m", 6, sampling), prompt, 6))
    pieces = []
    while not isinstance(event := job.events.get(timeout=60), Done):
        pieces.append(event.piece.content)
    engine.wait_kept()
    return "".join(pieces), event


def test_a_turn_cut_before_it_computed_anything_keeps_nothing(local):
    """A job whose client left as its prompt began (cut at the prompt's first progress report,
    nothing computed) kept its empty KV cache under no tokens, taking one of the kept places."""
    model, tokenizer = local
    job = None

    def progress(done: int, total: int) -> None:
        if job is not None:
            job.cancelled.set()  # the client leaves as the prompt starts

    engine = Engine(model, tokenizer, options={"prompt_progress_callback": progress})
    job = Job(Completion(False, "m", 2, Sampling()), USER * 2, 2)
    assert _done(engine, engine.submit(job)).completion_tokens == 0
    assert len(engine.prompt_cache) == 0
