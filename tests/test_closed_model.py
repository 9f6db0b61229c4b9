"""A model after `model.streamer.close()`: whatever asks it to compute is refused in one line, at
every budget (a resident model too), and a close while another thread generates is refused
rather than pulling the files from under that thread's reads."""

from __future__ import annotations

import threading

import mlx.core as mx
import pytest

import streamer
from streamer.errors import StreamerError

PROMPT = "hello world, this is a prompt"
CLOSED = r"this model was closed \(model.streamer.close\(\)\): load it again to run it"


@pytest.mark.parametrize("read_path", ["mapped", "slots"])
@pytest.mark.parametrize("budget", [0, None])
def test_a_closed_model_refuses_to_compute(checkpoints, read_path, budget):
    folder = checkpoints.repacked(checkpoints.mlx("qwen3_moe"))
    model, tokenizer = streamer.load(folder, memory_budget=budget, read_path=read_path)
    model.streamer.close()
    model.streamer.close()  # twice: nothing more to give back
    with pytest.raises(StreamerError, match=CLOSED):
        model(mx.array([tokenizer.encode(PROMPT)]))
    with pytest.raises(StreamerError, match=CLOSED):
        streamer.generate(model, tokenizer, PROMPT, max_tokens=2)


@pytest.mark.parametrize("read_path", ["mapped", "slots"])
def test_a_close_while_another_thread_generates_is_refused(checkpoints, read_path):
    folder = checkpoints.repacked(checkpoints.mlx("qwen3_moe"))
    model, tokenizer = streamer.load(folder, memory_budget=0, read_path=read_path)
    fresh, _ = streamer.load(folder, memory_budget=0, read_path=read_path)
    expected = streamer.generate(fresh, tokenizer, PROMPT, max_tokens=6)
    streaming, go_on, answer = threading.Event(), threading.Event(), []

    def generate() -> None:
        for response in streamer.stream_generate(model, tokenizer, PROMPT, max_tokens=6):
            answer.append(response.text)
            streaming.set()
            go_on.wait()

    thread = threading.Thread(target=generate)
    thread.start()
    streaming.wait()
    try:
        with pytest.raises(StreamerError, match="generating an answer in another thread"):
            model.streamer.close()
    finally:
        go_on.set()
        thread.join()
    assert "".join(answer) == expected
    model.streamer.close()  # that answer finished: closed now
    with pytest.raises(StreamerError, match=CLOSED):
        streamer.generate(model, tokenizer, PROMPT, max_tokens=2)
