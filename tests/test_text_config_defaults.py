"""A vision-language model's text_config that leaves a field out, where transformers' text config
class fills a default mlx-lm's text model args do not: filled as transformers fills it, or refused
where no value is the published models' (streamer/families/transformers/defaults.py and
streamer/families/transformers/unfilled.py). The same for the text models' own model types
(Mistral 4, Gemma 4, a Qwen3.5 text model)."""

from __future__ import annotations

import re

import mlx.core as mx
import pytest

import streamer
from fixtures import TINY_CONFIGS, tiny_config
from streamer.families.architectures import build_model
from streamer.families.config import check_config
from streamer.families.mlx_lm_models import model_file
from streamer.families.transformers.defaults import DEEPSEEK_V3, MISTRAL4_YARN, text_model_type
from streamer.families.transformers.spellings import normalize_config


def without(values: dict, *fields: str) -> dict:
    return {k: v for k, v in values.items() if k not in fields}


def text_left_out(model_type: str, *fields: str) -> dict:
    config = tiny_config(model_type)
    return {**config, "text_config": without(config["text_config"], *fields)}


def test_every_vision_language_family_has_the_text_model_transformers_reads():
    from transformers import CONFIG_MAPPING

    for model_type in TINY_CONFIGS:
        config = tiny_config(model_type)
        if isinstance(config.get("text_config"), dict):
            assert text_model_type(config) in CONFIG_MAPPING, model_type


def test_kimi_k25_routing_left_out_of_its_text_config_is_deepseek_v3s():
    """transformers reads Kimi K2.5's text model as DeepSeek-V3 (2.5, 8 groups, top 4), mlx-lm's
    deepseek_v3 args default to 1.0 and one group: the top-level fill, in text_config too."""
    config = normalize_config(text_left_out("kimi_k25", *DEEPSEEK_V3))
    args = model_file("kimi_k25").ModelArgs.from_dict(config).text_config
    assert {field: getattr(args, field) for field in DEEPSEEK_V3} == DEEPSEEK_V3


@pytest.mark.parametrize("model_type", ["mistral4", "mistral3"])
def test_mistral_4_without_rope_parameters_computes_transformers_yarn(model_type):
    """mlx-lm's mistral4 without rope_parameters failed at its first token (a TypeError)."""
    config = tiny_config(model_type)
    if "text_config" in config:
        config = text_left_out(model_type, "rope_parameters")
    else:
        config = without(config, "rope_parameters")
    normalized = normalize_config(config)
    assert normalized.get("text_config", normalized)["rope_parameters"] == MISTRAL4_YARN
    logits = build_model(normalized, "c")(mx.array([[1, 2, 3]]))
    assert bool(mx.isfinite(logits).all())


def rope_bases(config: dict) -> set:
    model = build_model(normalize_config(config), "c")
    return {m.base for _, m in model.named_modules() if type(m).__name__.endswith("RoPE")}


def test_qwen3_5_text_rope_theta_alone_is_its_rope_base():
    """A transformers 4 spelling (rope_theta beside partial_rotary_factor): mlx-lm's default
    rope_parameters replaced it with base 100000."""
    config = text_left_out("qwen3_5_moe", "rope_parameters")
    config["text_config"].update(rope_theta=10_000_000, partial_rotary_factor=0.25)
    assert rope_bases(config) == {10_000_000}
    assert rope_bases(tiny_config("qwen3_5_moe")) == {10_000_000}  # as published


@pytest.mark.parametrize(
    "config, said",
    [
        (
            text_left_out("qwen3_5_moe", "rope_parameters"),
            "text_config.rope_parameters is left out: transformers' qwen3_5_moe_text then "
            "computes RoPE with base 10000, mlx-lm with 100000, the published models with",
        ),
        (
            text_left_out("gemma4", "final_logit_softcapping"),
            "text_config.final_logit_softcapping is left out: transformers' gemma4 then caps "
            "no logits, mlx-lm at 30.0",
        ),
        (
            without(tiny_config("gemma4_text"), "final_logit_softcapping"),
            "final_logit_softcapping is left out: transformers' gemma4 then caps no logits",
        ),
    ],
)
def test_a_field_whose_defaults_are_not_the_published_models_is_refused(config, said):
    with pytest.raises(streamer.StreamerError, match=f"^c: {said}"):
        check_config(config, "c")
    # a null is a value both compute: no cap, no refusal
    if "softcapping" in said:
        null = {"final_logit_softcapping": None}
        text = config.get("text_config")
        check_config(
            {**config, "text_config": {**text, **null}} if text else {**config, **null}, "c"
        )


def minimax_m3_flat(**changes) -> dict:
    """MiniMax-M3-VL's text_config as transformers 5 spells it: the indexer's fields flat, the
    sparse layers in layer_types (the hub's sparse_attention_config nests them)."""
    config = tiny_config("minimax_m3_vl")
    text = dict(config["text_config"])
    nested = text.pop("sparse_attention_config")
    text.update(
        index_n_heads=nested["sparse_num_index_heads"],
        index_head_dim=nested["sparse_index_dim"],
        index_block_size=nested["sparse_block_size"],
        index_local_blocks=nested["sparse_local_block"],
        layer_types=[
            "minimax_m3_sparse" if f else "full_attention" for f in nested["sparse_attention_freq"]
        ],
        **changes,
    )
    return {**config, "text_config": text}


def test_minimax_m3_indexer_top_k_left_out_is_transformers_16():
    """mlx-lm's None failed at the first sparse layer (a TypeError)."""
    normalized = normalize_config(check_config(minimax_m3_flat(), "c"))
    assert normalized["text_config"]["index_topk_blocks"] == 16
    logits = build_model(normalized, "c")(mx.array([[1, 2, 3, 4, 5, 6, 7, 8, 9]]))
    assert bool(mx.isfinite(logits).all())


@pytest.mark.parametrize(
    "changes, said",
    [
        (
            {"rope_parameters": {"rope_type": "default", "rope_theta": 5e6}},
            "rope_parameters has no partial_rotary_factor: transformers' minimax_m3_vl then "
            "rotates all of each head, mlx-lm half of it",
        ),
        (  # transformers 5 writes its default rotary_dim (64) whatever the head
            {"rotary_dim": 64},
            "rotary_dim is 64, but rope_parameters' share of the 32-dim head is 16 dims: "
            "transformers' minimax_m3_vl rotates those 16 (it reads no rotary_dim), mlx-lm 64",
        ),
    ],
)
def test_minimax_m3_rotation_transformers_and_mlx_lm_read_otherwise_is_refused(changes, said):
    with pytest.raises(streamer.StreamerError, match=f"^c: text_config.{re.escape(said)}"):
        check_config(minimax_m3_flat(**changes), "c")
    check_config(minimax_m3_flat(rotary_dim=16), "c")  # as published: they agree


def old_spelling(model_type: str, *left_out: str) -> dict:
    """Mistral 4's RoPE settings (mistral3's text model's) as transformers 4 spells them:
    rope_scaling beside rope_theta, without rope_parameters."""
    config = tiny_config(model_type)
    text = config.get("text_config", config)
    rope = without(text["rope_parameters"], "rope_theta", *left_out)
    text = {**without(text, "rope_parameters"), "rope_scaling": rope, "rope_theta": 20000.0}
    return {**config, "text_config": text} if "text_config" in config else text


def logits(config: dict) -> mx.array:
    mx.random.seed(0)  # the same weights for each spelling
    return build_model(normalize_config(check_config(config, "c")), "c")(mx.array([[1, 2, 3]]))


@pytest.mark.parametrize("model_type", ["mistral4", "mistral3"])
def test_mistral_4_rope_scaling_alone_is_read_as_transformers_reads_it(model_type):
    """mlx-lm's mistral4 reads rope_parameters only: it failed at its first token (a TypeError)
    or refused as unapplied the YaRN it ignored; transformers reads rope_scaling into them."""
    from transformers import Mistral4Config

    old = old_spelling(model_type)
    text = normalize_config(old).get("text_config", normalize_config(old))
    read = Mistral4Config(**old.get("text_config", old)).rope_parameters
    assert text["rope_parameters"] == without(read, "partial_rotary_factor")
    rope = {**old.get("text_config", old)["rope_scaling"], "rope_theta": 20000.0}
    new = tiny_config(model_type)
    if "text_config" in new:
        new = {**new, "text_config": {**new["text_config"], "rope_parameters": rope}}
    else:
        new = {**new, "rope_parameters": rope}
    assert mx.array_equal(logits(old), logits(new))


@pytest.mark.parametrize(
    "config, said",
    [
        (
            old_spelling("mistral4", "llama_4_scaling_beta"),
            "rope_scaling has no llama_4_scaling_beta: Mistral 4 scales its queries by them",
        ),
        (
            old_spelling("mistral3", "llama_4_scaling_beta", "original_max_position_embeddings"),
            "text_config.rope_scaling has no llama_4_scaling_beta or "
            "original_max_position_embeddings: Mistral 4 scales its queries by them",
        ),
        (
            tiny_config("mistral4", rope_parameters={"rope_type": "default", "rope_theta": 1e4}),
            "rope_parameters has no llama_4_scaling_beta or original_max_position_embeddings",
        ),
    ],
)
def test_mistral_4_rope_settings_without_its_query_scaling_are_refused(config, said):
    """Both transformers' model and mlx-lm's fail without them (mlx-lm's with a traceback)."""
    with pytest.raises(streamer.StreamerError, match=f"^c: {said}"):
        check_config(config, "c")


def flat_qwen3_5(*left_out: str, **given) -> dict:
    """A Qwen3.5 config without text_config: mlx-lm reads its fields as the text model's."""
    config = tiny_config("qwen3_5_moe")
    return {**without(config["text_config"], *left_out), "model_type": "qwen3_5_moe", **given}


def test_flat_qwen3_5_rope_theta_alone_is_its_rope_base():
    """As in its text_config: mlx-lm's default rope_parameters replaced it with base 100000."""
    assert rope_bases(flat_qwen3_5("rope_parameters", rope_theta=10_000_000)) == {10_000_000}
    with pytest.raises(streamer.StreamerError, match="^c: rope_parameters is left out: "):
        check_config(flat_qwen3_5("rope_parameters"), "c")


def test_qwen3_5_experts_per_token_left_out_are_transformers_8():
    """mlx-lm's qwen3_5 text args default to 0 experts a token: it ran with none routed."""
    config = normalize_config(text_left_out("qwen3_5_moe", "num_experts_per_tok"))
    assert config["text_config"]["num_experts_per_tok"] == 8
    flat = normalize_config(flat_qwen3_5("num_experts_per_tok"))
    assert flat["num_experts_per_tok"] == 8


@pytest.mark.parametrize("model_type", ["gemma4", "gemma4_text"])
def test_gemma4_without_its_experts_per_token_is_refused(model_type):
    """Neither transformers nor mlx-lm has a default: mlx-lm's None was a TypeError at the first
    token, after a repack."""
    config = tiny_config(model_type)
    if "text_config" in config:
        config, prefix = text_left_out(model_type, "top_k_experts"), "text_config."
    else:
        config, prefix = without(config, "top_k_experts"), ""
    with pytest.raises(
        streamer.StreamerError, match=re.escape(f"c: {prefix}top_k_experts is left out, but")
    ):
        check_config(config, "c")
