"""Serve's and chat's engine computes on its own thread: a model whose modules keep arrays beside
their parameters (a YaRN rope's frequencies: gpt-oss, DeepSeek-V3.2, Llama 4) had them computed
lazily on the loading thread's stream, and every answer failed there (`There is no Stream(cpu, 0)
in current thread`)."""

from __future__ import annotations

import pytest

import streamer
from streamer.server.api import Completion, Sampling
from streamer.server.engine import Done, Engine, Job, Step


@pytest.mark.parametrize("arch", ["gpt_oss", "deepseek_v32", "llama4"])
def test_the_engine_thread_answers_as_generate(checkpoints, arch):
    model, tokenizer = streamer.load(checkpoints.repacked(checkpoints.hf(arch)))
    engine = Engine(model, tokenizer, 2)
    prompt = tokenizer.encode("import os")
    job = engine.submit(Job(Completion(False, "m", 6, Sampling(), text="import os"), prompt, 6))
    pieces = []
    while not isinstance(event := job.events.get(timeout=120), Done):
        assert isinstance(event, Step), event
        pieces.append(event.piece.content)
    assert "".join(pieces) == streamer.generate(model, tokenizer, "import os", 6)
