"""`streamer serve` refusing a request before it costs anything: a field the request's check
can refuse is not first found wrong after the prompt is tokenized or computed."""

from __future__ import annotations

import threading

import pytest

from streamer.server.api import Completion, Sampling
from streamer.server.app import App
from streamer.server.fields import ApiError
from streamer.server.jobs import Job


class CountingTokenizer:
    """A tokenizer of 10 tokens that counts the prompts it encodes."""

    bos_token = None

    def __init__(self):
        self.encoded = 0

    def get_vocab(self) -> dict[str, int]:
        return {str(i): i for i in range(10)}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.encoded += 1
        return [1]


class QueueingEngine:
    """An engine that counts the jobs submitted to it (none is computed)."""

    healthy = True

    def __init__(self):
        self.tokenizer, self.tokenizer_lock = CountingTokenizer(), threading.Lock()
        self.submitted: list[Job] = []

    def submit(self, job: Job) -> Job:
        self.submitted.append(job)
        return job


def test_a_logit_bias_past_the_vocabulary_is_refused_before_the_prompt_is_tokenized():
    """The id past the vocabulary was found at the generation's first step, after the prompt
    was tokenized and computed (a whole prefill, minutes for a long prompt of a streamed model)."""
    engine = QueueingEngine()
    app = App(engine, "m", Sampling(), 8, 1024)
    sampling = Sampling(logit_bias={3: 1.0, 10: 1.0})
    with pytest.raises(ApiError) as refused:
        app.job(Completion(False, "m", 1, sampling, text="hi"))
    assert refused.value.status == 400 and refused.value.param == "logit_bias"
    assert "token id 10 is past the model's vocabulary (10 tokens)" in refused.value.message
    assert engine.tokenizer.encoded == 0


def test_a_max_tokens_past_the_whole_context_is_refused_before_the_prompt_is_tokenized():
    """max_tokens of 2000 against a context of 1024 was refused only once the prompt was tokenized
    (megabytes of text for a long context, seconds under the tokenizer's lock)."""
    engine = QueueingEngine()
    app = App(engine, "m", Sampling(), 8, 1024)
    with pytest.raises(ApiError) as refused:
        app.job(Completion(False, "m", 2000, Sampling(), text="hi"))
    assert refused.value.status == 400 and refused.value.param == "max_tokens"
    assert refused.value.code == "context_length_exceeded"
    assert "max_tokens is 2000, but the model's context is 1024 tokens" in refused.value.message
    assert engine.tokenizer.encoded == 0
