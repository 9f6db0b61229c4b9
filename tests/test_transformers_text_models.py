"""A vision-language family's text model alone, as transformers' AutoModelForCausalLM builds and
saves it, streams to what transformers computes."""

from __future__ import annotations

import json

from test_transformers_written import assert_streams_as

from fixtures.transformers_written import write_transformers_checkpoint


def test_qwen3_5_moe_text_model_alone_streams(tmp_path):
    """AutoModelForCausalLM builds Qwen3.5-MoE's text model alone (model_type qwen3_5_moe_text,
    its layers under `model.`), which mlx-lm's qwen3_5_moe runs from a config without
    text_config."""
    oracle = write_transformers_checkpoint(tmp_path / "src", "qwen3_5_moe", text_alone=True)
    config = json.loads((tmp_path / "src" / "config.json").read_text())
    assert config["model_type"] == "qwen3_5_moe_text" and "text_config" not in config
    assert_streams_as(oracle, tmp_path)
