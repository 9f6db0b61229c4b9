"""The streamed model computes what mlx-lm's fully resident model computes, for every architecture."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.sample_utils import make_sampler

import streamer
from streamer.repack import Quantize

from conftest import ARCHS, reference_model

PROMPT = "The function returns the value of the argument, or raises an error if the file is missing."


def greedy_tokens(model, prompt: mx.array, n: int = 64) -> list[int]:
    steps = generate_step(prompt, model, max_tokens=n, sampler=make_sampler(temp=0.0))
    return [int(token) for token, _ in steps]


def compare(streamed_path, reference, tolerance: float) -> None:
    model, tokenizer = streamer.load(streamed_path, memory_budget=0)
    prompt = mx.array(tokenizer.encode(PROMPT))
    diff = mx.abs(model(prompt[None]) - reference(prompt[None])).max().item()
    assert diff <= tolerance, f"max abs logit difference {diff}"
    assert greedy_tokens(model, prompt) == greedy_tokens(reference, prompt)
    stats = model.expert_stats
    assert stats.decode_tokens >= 63  # the decode steps really streamed experts
    assert stats.decode.syncs == stats.decode.layer_calls


@pytest.mark.parametrize("arch", ARCHS)
def test_hf_bf16_checkpoint_matches_mlx_lm(checkpoints, arch):
    src = checkpoints.hf(arch)
    compare(checkpoints.repacked(src), reference_model(src), tolerance=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_mlx_quantized_checkpoint_is_identical_to_mlx_lm(checkpoints, arch):
    src = checkpoints.mlx(arch)
    compare(checkpoints.repacked(src), reference_model(src), tolerance=0.0)


@pytest.mark.parametrize("arch", ARCHS)
def test_quantize_while_repacking_equals_mlx_lm_convert(checkpoints, arch):
    streamed = checkpoints.repacked(checkpoints.hf(arch), quantize=Quantize(4, 64))
    compare(streamed, reference_model(checkpoints.mlx(arch)), tolerance=0.0)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_other_source_dtypes(checkpoints, dtype):
    src = checkpoints.hf("qwen3_moe", dtype)
    compare(checkpoints.repacked(src), reference_model(src), tolerance=1e-4)


def test_8bit_group_32(checkpoints):
    src = checkpoints.mlx("mixtral", bits=8, group_size=32)
    compare(checkpoints.repacked(src), reference_model(src), tolerance=0.0)


def test_mlx_lm_generate_runs_unchanged_on_a_streamed_model(checkpoints):
    import mlx_lm

    model, tokenizer = streamer.load(checkpoints.repacked(checkpoints.hf("qwen2_moe")), memory_budget=0)
    ours = streamer.generate(model, tokenizer, PROMPT, max_tokens=16)
    theirs = mlx_lm.generate(model, tokenizer, PROMPT, max_tokens=16)
    assert ours == theirs and len(tokenizer.encode(ours)) > 0


@pytest.mark.parametrize("budget", ["all", "one layer", "default"])
def test_resident_layers_within_a_memory_budget(checkpoints, budget):
    from streamer.cache.resident_layers import layer_bytes
    from streamer.io.manifest import read_manifest

    src = checkpoints.mlx("qwen3_moe")
    folder = checkpoints.repacked(src)
    one_layer = layer_bytes(read_manifest(folder).layers[0], mx.float32)
    memory_budget = {"all": 1 << 40, "one layer": one_layer, "default": None}[budget]
    model, tokenizer = streamer.load(folder, memory_budget=memory_budget)
    expected_resident = {"all": 2, "one layer": 1, "default": 2}[budget]  # tiny model: default keeps all
    assert model.residency.startswith(f"{expected_resident} of 2 MoE layers resident")
    reference = reference_model(src)
    prompt = mx.array(tokenizer.encode(PROMPT))
    assert mx.array_equal(model(prompt[None]), reference(prompt[None]))
    assert greedy_tokens(model, prompt, 16) == greedy_tokens(reference, prompt, 16)
    decode = model.expert_stats.decode
    assert decode.syncs == decode.layer_calls // 2 * (2 - expected_resident)
    assert decode.experts_read <= decode.syncs * 4


def test_negative_budget_is_refused(checkpoints):
    with pytest.raises(streamer.StreamerError, match="memory_budget"):
        streamer.load(checkpoints.repacked(checkpoints.hf("qwen3_moe")), memory_budget=-1)


def test_newer_transformers_config_spelling(checkpoints, tmp_path):
    """transformers 5 writes rope_parameters and dtype instead of rope_theta and torch_dtype."""
    import json
    import shutil

    src = tmp_path / "src"
    shutil.copytree(checkpoints.hf("qwen3_moe"), src)
    config = json.loads((src / "config.json").read_text())
    theta = config.pop("rope_theta")
    config["rope_parameters"] = {"rope_theta": theta, "rope_type": "default"}
    config["dtype"] = config.pop("torch_dtype")
    (src / "config.json").write_text(json.dumps(config))
    streamer.repack.repack(src, tmp_path / "dst", log=lambda _: None)
    compare(tmp_path / "dst", reference_model(checkpoints.hf("qwen3_moe")), tolerance=1e-4)
