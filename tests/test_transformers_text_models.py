"""A vision-language family's text model alone, as transformers' AutoModelForCausalLM builds and
saves it, streams to what transformers computes."""

from __future__ import annotations

import json

import pytest
from test_transformers_written import assert_streams_as

from fixtures.transformers_written import write_transformers_checkpoint
from streamer.errors import StreamerError
from streamer.repack import repack


@pytest.mark.parametrize(
    "family, model_type",
    [
        # its layers under `model.`; mlx-lm's qwen3_5_moe runs a config without text_config
        ("qwen3_5_moe", "qwen3_5_moe_text"),
        # mlx-lm's llama4_text is a dense model; its llama4 reads this one as text_config
        ("llama4", "llama4_text"),
    ],
)
def test_text_model_alone_streams(tmp_path, family, model_type):
    oracle = write_transformers_checkpoint(tmp_path / "src", family, text_alone=True)
    config = json.loads((tmp_path / "src" / "config.json").read_text())
    assert config["model_type"] == model_type and "text_config" not in config
    assert_streams_as(oracle, tmp_path)


def test_llama4_text_model_with_moe_layers_mlx_lm_places_otherwise_is_refused(tmp_path):
    """transformers' moe_layers overrides interleave_moe_layer_step, which alone places mlx-lm's
    llama4 MoE layers: a text model alone whose moe_layers say otherwise is refused."""
    changes = {"moe_layers": [0, 1, 2, 3]}
    write_transformers_checkpoint(tmp_path / "src", "llama4", changes=changes, text_alone=True)
    with pytest.raises(
        StreamerError, match=r"moe_layers \[0, 1, 2, 3\].*interleave_moe_layer_step"
    ):
        repack(tmp_path / "src", tmp_path / "dst", log=lambda _: None)
