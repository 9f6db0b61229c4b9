"""A model dropped without `model.streamer.close()` gives its files back to the OS: mlx-lm lowers
the process's descriptor limit to 2048 when imported, and a program that loads models in turn
(a test suite, a notebook, a server that swaps models) would otherwise run out."""

from __future__ import annotations

import gc
import os

import mlx.core as mx
import pytest

import streamer


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts /proc/self/fd (Linux)")
@pytest.mark.parametrize("read_path", ["mapped", "slots"])
@pytest.mark.parametrize("source", ["repacked", "in place"])
def test_a_dropped_model_closes_its_files(checkpoints, read_path, source):
    download = checkpoints.mlx("qwen3_moe")
    folder = checkpoints.repacked(download) if source == "repacked" else download
    warm, _ = streamer.load(folder, memory_budget=0, read_path=read_path)  # lazy imports' files
    warm.streamer.close()
    del warm
    gc.collect()
    before = open_descriptors()
    model, tokenizer = streamer.load(folder, memory_budget=0, read_path=read_path)
    mx.eval(model(mx.array([tokenizer.encode("hello")])))
    assert open_descriptors() > before  # the expert files (and a download's shards) are open
    del model, tokenizer
    gc.collect()
    assert open_descriptors() == before
