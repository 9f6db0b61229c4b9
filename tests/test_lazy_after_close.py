"""An output built from a model and evaluated after the model is closed or dropped is the model's
output: MLX evaluates lazily, so `logits = model(x); del model; mx.eval(logits)` is ordinary
Python. On the CPU a mapped buffer read zeros once its model was closed (wrong logits, silently).
With the matmuls cut across cores (cpu_cores.py) the output waits on streams of other threads,
which close does not wait for: it need not, as what they read stays readable (the mapping is an
MLX buffer the pending arrays hold, its pages faulted in again from the file; a slot is an
array), also when they are still computing as it closes."""

from __future__ import annotations

import gc

import mlx.core as mx
import pytest

import streamer
from streamer import cpu_cores


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("read_path", ["mapped", "slots"])
@pytest.mark.parametrize("source", ["repacked", "in place"])
@pytest.mark.parametrize("ending", ["closed", "closed computing", "dropped", "dropped computing"])
def test_an_output_evaluated_after_its_model_ends(
    checkpoints, monkeypatch, threads, read_path, source, ending
):
    monkeypatch.setattr(cpu_cores, "MIN_PART_BYTES", 1)  # the tiny model's layers cut too
    monkeypatch.setattr("streamer.loading.backend.usable_cores", lambda: 2)  # on any machine
    download = checkpoints.mlx("qwen3_moe")
    folder = checkpoints.repacked(download) if source == "repacked" else download
    model, tokenizer = streamer.load(folder, memory_budget=0, read_path=read_path, threads=threads)
    tokens = mx.array([tokenizer.encode("hello there " * 20)])
    expected = model(tokens)
    mx.eval(expected)
    pending = model(tokens)
    if ending.endswith("computing"):
        mx.async_eval(pending)
    if ending.startswith("closed"):
        model.streamer.close()
    del model
    gc.collect()
    assert mx.array_equal(pending, expected)
