"""An output built from a model and evaluated after the model is closed or dropped is the model's
output: MLX evaluates lazily, so `logits = model(x); del model; mx.eval(logits)` is ordinary
Python. On the CPU a mapped buffer read zeros once its model was closed (wrong logits, silently)."""

from __future__ import annotations

import gc

import mlx.core as mx
import pytest

import streamer


@pytest.mark.parametrize("read_path", ["mapped", "slots"])
@pytest.mark.parametrize("source", ["repacked", "in place"])
@pytest.mark.parametrize("ending", ["closed", "dropped"])
def test_an_output_evaluated_after_its_model_ends(checkpoints, read_path, source, ending):
    download = checkpoints.mlx("qwen3_moe")
    folder = checkpoints.repacked(download) if source == "repacked" else download
    model, tokenizer = streamer.load(folder, memory_budget=0, read_path=read_path)
    tokens = mx.array([tokenizer.encode("hello there")])
    expected = model(tokens)
    mx.eval(expected)
    pending = model(tokens)
    if ending == "closed":
        model.streamer.close()
    del model
    gc.collect()
    assert mx.array_equal(pending, expected)
