"""Long-running use: a chat of many turns past the model's context, a server answering request
after request. What a run holds (kept KV caches, descriptors, threads, mappings) stays bounded."""

from __future__ import annotations

import io

import pytest

import streamer
from streamer.cli import parser
from streamer.cli.chat import chat
from streamer.server.api import Completion, Sampling
from streamer.server.engine import Done, Engine, Job, Step


@pytest.fixture(scope="module")
def local(checkpoints):
    return streamer.load(checkpoints.repacked(checkpoints.hf("qwen3_moe")))


def chatted(engine: Engine, lines: list[str], context: int) -> str:
    """What the chat printed on stderr after `lines`, once the last answer's cache is kept."""
    err = io.StringIO()
    stdin = io.StringIO("".join(line + "\n" for line in lines))
    chat(engine, max_tokens=8, context=context, stdin=stdin, stdout=io.StringIO(), stderr=err)
    engine.wait_kept()
    return err.getvalue()


def test_a_chat_past_its_context_says_so_and_reset_frees_its_kv_cache(local):
    model, tokenizer = local
    engine = Engine(model, tokenizer, 2)
    said = chatted(engine, [f"tell me about {i}" for i in range(30)] + ["/reset", "hi"], 120)
    assert said.count("but the model's context is 120 tokens: /reset to start over") > 10
    # after /reset only the new conversation's KV cache is held, as in a chat that began with it
    fresh = Engine(model, tokenizer, 2)
    chatted(fresh, ["hi"], 120)
    assert len(engine.prompt_cache) == len(fresh.prompt_cache) == 1
    assert engine.prompt_cache.nbytes == fresh.prompt_cache.nbytes


def ask(engine: Engine, text: str) -> Done:
    prompt = engine.tokenizer.encode(text)
    job = engine.submit(Job(Completion(False, "m", 4, Sampling(), text=text), prompt, 4))
    while not isinstance(event := job.events.get(timeout=120), Done):
        assert isinstance(event, Step), event
    engine.wait_kept()
    return event


def test_the_kept_kv_caches_stay_under_their_byte_bound(local):
    model, tokenizer = local
    engine = Engine(model, tokenizer, 10)
    ask(engine, "question 0")
    one = engine.prompt_cache.nbytes  # one short conversation's cache
    engine = Engine(model, tokenizer, 10, prompt_cache_bytes=3 * one)
    for i in range(12):
        ask(engine, f"question {i}")
        assert engine.prompt_cache.nbytes <= 3 * one
    assert len(engine.prompt_cache) == 3
    # serve bounds them by default, as llama.cpp's server does (its --cache-ram: 8 GiB)
    args = parser().parse_args(["serve", "--model", "m"])
    assert args.prompt_cache_bytes == 8 << 30
    assert (
        parser()
        .parse_args(["serve", "--model", "m", "--prompt-cache-bytes", "1G"])
        .prompt_cache_bytes
        == 1 << 30
    )
