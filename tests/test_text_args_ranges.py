"""The text_config of the vision-language families whose mlx-lm args class is `TextArgs` (Llama 4,
MiniMax-M3-VL, Muse Spark, Kimi K3 as its wrapper nests it) or another module's (Kimi K2.5's is
DeepSeek-V3's; Gemma 4's, Mistral 3's, Qwen3-VL-MoE's a plain dict): checked as other families'
configs are, where an out-of-range value was an MLX traceback from plan and load."""

from __future__ import annotations

import json

import pytest

from fixtures import tiny_config
from fixtures.published_downloads import PUBLISHED_DOWNLOADS
from streamer.cli import main
from streamer.errors import StreamerError
from streamer.families.config import check_config


def nested(model_type: str, /, **text_changes) -> dict:
    """The family's tiny config.json, its text_config changed (Kimi K3's flat one nested, as
    mlx-lm's kimi_k3 also reads it)."""
    config = tiny_config(model_type)
    if "text_config" not in config:
        config = {**config, "text_config": {**config, "model_type": "kimi_linear"}}
    return {**config, "text_config": {**config["text_config"], **text_changes}}


TEXT_ARGS_FAMILIES = ["llama4", "minimax_m3_vl", "muse_spark", "kimi_k3"]
OTHER_TEXT_CONFIGS = ["kimi_k25", "gemma4", "mistral3", "qwen3_vl_moe"]


@pytest.mark.parametrize("model_type", TEXT_ARGS_FAMILIES + OTHER_TEXT_CONFIGS)
def test_plan_refuses_kv_heads_that_do_not_divide_the_heads_in_one_line(
    tmp_path, capsys, model_type
):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(nested(model_type, num_attention_heads=4, num_key_value_heads=3)))
    assert main(["plan", str(path)]) == 2
    said = capsys.readouterr().err.strip()
    assert "config field text_config.num_key_value_heads is 3, expected a divisor of 4" in said
    assert "\n" not in said and "Traceback" not in said


@pytest.mark.parametrize("model_type", TEXT_ARGS_FAMILIES)
@pytest.mark.parametrize(
    "field,value,said",
    [
        ("num_local_experts", 0, "is 0, expected an integer from 1"),
        ("hidden_size", "128", "is '128', expected an integer"),
        ("rms_norm_eps", -1.0, "is -1.0, expected a positive finite number"),
    ],
)
def test_a_bad_text_config_value_is_refused_naming_it(model_type, field, value, said):
    if field == "num_local_experts" and model_type == "kimi_k3":
        field = "num_experts"  # Kimi K3's name for its expert count
    with pytest.raises(StreamerError, match=f"config field text_config.{field} {said}"):
        check_config(nested(model_type, **{field: value}), "config.json")


def test_llama_4_scout_s_published_text_config_is_taken():
    """Its fields beside the shapes as published: attn_temperature_tuning true, which mlx-lm
    declares an int and reads as one (a bool is an int), eos ids listed, its layer lists."""
    config, _, _ = PUBLISHED_DOWNLOADS["llama-4-scout"]
    published = {
        "attn_temperature_tuning": True,
        "attn_scale": 0.1,
        "floor_scale": 8192,
        "max_position_embeddings": 10485760,
        "eos_token_id": [200001, 200007, 200008],
        "pad_token_id": 200018,
        "moe_layers": list(range(48)),
        "rope_scaling": {**config["text_config"]["rope_scaling"], "factor": 16.0},
    }
    text = check_config(nested("llama4", **{**config["text_config"], **published}), "c")
    text = text["text_config"]
    assert text["attn_temperature_tuning"] is True and text["moe_layers"] == list(range(48))


def test_a_stray_text_config_leaves_a_flat_family_s_own_fields_checked():
    """qwen3_moe's mlx-lm args take no text_config: its model reads the config's own fields."""
    config = {**tiny_config("qwen3_moe"), "num_key_value_heads": 3, "text_config": {}}
    with pytest.raises(StreamerError, match="config field num_key_value_heads is 3"):
        check_config(config, "config.json")
