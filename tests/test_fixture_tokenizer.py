"""The fixtures' tokenizer is the same bytes whatever the process ran before it: every fixture
checkpoint carries it, and tests compare token ids with mlx-lm's over the same files."""

from __future__ import annotations

import threading

from fixtures import tokenizer


def test_the_tokenizer_ignores_what_the_process_did_before(monkeypatch):
    """A module it reads docstrings from gaining an attribute (a relay thread's test left a dict
    in one) had changed the text it trains on, so which test ran first in a pytest worker chose
    the tokenizer: a sampled test then drew other tokens (and no draft was kept)."""
    before = tokenizer._trained(tokenizer.VOCAB_SIZE)
    tokenizer._trained.cache_clear()
    monkeypatch.setattr(threading, "_left_by_a_test", {}, raising=False)
    try:
        assert tokenizer._trained(tokenizer.VOCAB_SIZE) == before
    finally:
        tokenizer._trained.cache_clear()
