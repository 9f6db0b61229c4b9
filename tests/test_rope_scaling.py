"""A config whose RoPE scaling mlx-lm's model for it does not apply (it builds a plain RoPE
whatever rope_scaling says) is refused with the reason; where mlx-lm applies it, it streams to
what transformers computes (streamer/families/rope_scaling.py)."""

from __future__ import annotations

import pytest
from test_transformers_written import assert_streams_as

from fixtures.transformers_written import write_transformers_checkpoint
from streamer.errors import StreamerError
from streamer.plan import plan
from streamer.repack import repack

YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 512,
}
SCALED = {"rope_parameters": YARN, "max_position_embeddings": 2048}


def test_rope_scaling_mlx_lm_does_not_apply_is_refused(tmp_path):
    """mlx-lm's qwen3_moe computes plain RoPE with YaRN asked for (1.2 logits off transformers on
    this model), as Qwen's docs tell Qwen3 users to add for long contexts."""
    write_transformers_checkpoint(tmp_path / "src", "qwen3_moe", changes=SCALED)
    with pytest.raises(StreamerError, match=r"rope_scaling 'yarn'.*mlx-lm's qwen3_moe model"):
        repack(tmp_path / "src", tmp_path / "dst", log=lambda _: None)
    assert not (tmp_path / "dst").exists()
    with pytest.raises(StreamerError, match=r"rope_scaling 'yarn'"):  # from config.json alone
        plan(tmp_path / "src" / "config.json", 2**34)


def test_rope_scaling_mlx_lm_applies_streams(tmp_path):
    oracle = write_transformers_checkpoint(tmp_path / "src", "afmoe", changes=SCALED)
    assert_streams_as(oracle, tmp_path)


def test_rope_scaling_of_another_type_than_mlx_lm_computes_is_refused(tmp_path):
    """mlx-lm's DeepSeek-V2 computes YaRN from rope_scaling whatever its type (1.6 logits off
    transformers' linear scaling on this model)."""
    linear = {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}
    write_transformers_checkpoint(
        tmp_path / "src", "deepseek_v2", changes={"rope_parameters": linear}
    )
    with pytest.raises(StreamerError, match=r"rope_scaling 'linear'.*computes 'yarn'"):
        repack(tmp_path / "src", tmp_path / "dst", log=lambda _: None)


def test_dynamic_scaling_past_the_context_only_streams_on_plain_rope(tmp_path):
    """transformers' dynamic NTK scaling changes nothing within max_position_embeddings, past
    which no prompt is run: mlx-lm's plain RoPE computes the same."""
    dynamic = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    oracle = write_transformers_checkpoint(
        tmp_path / "src", "qwen3_moe", changes={"rope_parameters": dynamic}
    )
    assert_streams_as(oracle, tmp_path)
