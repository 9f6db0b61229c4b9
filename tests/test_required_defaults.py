"""A config.json that leaves out a field mlx-lm's ModelArgs requires but transformers' config class
defaults: filled with that default (streamer/families/transformers/required_defaults.py), where
mlx-lm refused to build the model; a size left out stays refused in one line."""

from __future__ import annotations

import dataclasses
import json
import shutil

import mlx.core as mx
import pytest

import streamer
from fixtures import TINY_CONFIGS, write_hf_checkpoint
from streamer.errors import StreamerError
from streamer.families.config import check_config
from streamer.families.mlx_lm_models import model_file
from streamer.families.model_types import mlx_lm_classes
from streamer.families.transformers.defaults import own_model_type, text_model_type
from streamer.families.transformers.required_defaults import REQUIRED_FILLED
from streamer.families.transformers.spellings import normalize_config
from streamer.plan import plan
from streamer.repack import repack

# vision-language model_type -> the mlx-lm module and args class its text_config is built with
TEXT_ARGS = {
    "gemma4": ("gemma4_text", "ModelArgs"),
    "kimi_k25": ("deepseek_v3", "ModelArgs"),
    "llama4": ("llama4", "TextArgs"),
    "minimax_m3_vl": ("minimax_m3_vl", "TextArgs"),
    "mistral3": ("mistral4", "ModelArgs"),
    "muse_spark": ("muse_spark", "TextArgs"),
    "qwen3_5_moe": ("qwen3_5", "TextModelArgs"),
    "qwen3_vl_moe": ("qwen3_moe", "ModelArgs"),
}
# Kinds of field left required (the module's docstring says why): sizes, counts, the context,
# layer layouts, and fields whose default is another section's (qwen3_vl_moe's text model ties its
# embeddings as the top-level config says, not as its own class's default)
LEFT_REQUIRED = {
    *"hidden_size d_model intermediate_size moe_intermediate_size ffn_hidden_size".split(),
    *"expert_ffn_hidden_size intermediate_size_mlp moe_hidden_size vocab_size".split(),
    *"shared_expert_intermediate_size shared_intermediate_size head_dim v_head_dim".split(),
    *"qk_rope_head_dim qk_nope_head_dim kv_lora_rank q_lora_rank index_head_dim".split(),
    *"num_attention_heads n_heads num_key_value_heads num_attention_groups index_n_heads".split(),
    *"num_hidden_layers num_layers n_layers first_k_dense_replace num_dense_layers".split(),
    *"num_experts n_routed_experts num_local_experts n_shared_experts num_shared_experts".split(),
    *"zero_expert_num moe_num_experts num_experts_per_tok moe_topk".split(),
    *"max_position_embeddings model_max_length".split(),
    *"mamba_num_heads mamba_head_dim mamba_d_state mamba_d_conv mamba_expand".split(),
    *"ssm_state_size conv_kernel n_groups conv_L_cache".split(),
    *"linear_num_value_heads linear_num_key_heads linear_key_head_dim".split(),
    *"linear_value_head_dim linear_conv_kernel_dim".split(),
    *"layer_types layer_rope_theta decoder_sparse_step mlp_only_layers layer_group_size".split(),
    *"attn_layer_offset attn_layer_period expert_layer_offset expert_layer_period".split(),
    *"interleave_moe_layer_step text_config ffn_config attn_config".split(),
    "qwen3_vl_moe_text.tie_word_embeddings",
}
SIZES = ["hidden_size", "num_hidden_layers", "num_experts", "moe_intermediate_size", "vocab_size"]


def families() -> list[tuple[str, str, type, bool]]:
    """(fixture, transformers' model_type, mlx-lm's args class, in text_config) for each family."""
    found = []
    for name, config in TINY_CONFIGS.items():
        if isinstance(config.get("text_config"), dict):
            module, args = TEXT_ARGS[config["model_type"]]
            found.append((name, text_model_type(config), getattr(model_file(module), args), True))
        else:
            found.append((name, own_model_type(config), mlx_lm_classes(config)[1], False))
    return found


def transformers_default(model_type: str, field: str) -> object:
    from transformers import CONFIG_MAPPING

    config = CONFIG_MAPPING[model_type]()  # its attribute_map too (bailing_hybrid's n_group)
    if hasattr(config, field):
        return getattr(config, field)
    return (getattr(config, "rope_parameters", None) or {})[
        field
    ]  # where transformers 5 keeps RoPE


def required(args: type) -> set[str]:
    return {
        f.name
        for f in dataclasses.fields(args)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    } - {"model_type"}


def mlx_lm_default(args: type, field: str) -> object:
    found = next(f for f in dataclasses.fields(args) if f.name == field)
    return found.default_factory() if found.default is dataclasses.MISSING else found.default


def left_out(config: dict, field: str, in_text: bool) -> dict:
    """`config` without `field` (in its text_config), in rope_parameters too."""
    values = config["text_config"] if in_text else config
    values = {k: v for k, v in values.items() if k != field}
    if isinstance(values.get("rope_parameters"), dict) and field != "rope_parameters":
        values["rope_parameters"] = {
            k: v for k, v in values["rope_parameters"].items() if k != field
        }
    return {**config, "text_config": values} if in_text else values


FILLS = [(t, f, v) for t, fields in REQUIRED_FILLED.items() for f, v in fields.items()]


@pytest.mark.parametrize("model_type, field, value", FILLS)
def test_each_fill_is_transformers_default_where_mlx_lm_requires_the_field(
    model_type, field, value
):
    assert transformers_default(model_type, field) == value
    readers = [args for _, kind, args, _ in families() if kind == model_type]
    assert any(field in required(args) for args in readers), "mlx-lm has a default: FILLED's"
    for args in readers:  # Ling 3's bailing_moe_v3 defaults what Ling 2.5's requires: alike
        assert field in required(args) or mlx_lm_default(args, field) == value, args


def test_every_family_fills_each_required_field_transformers_defaults():
    """What a streaming family's mlx-lm args require, transformers defaults, and is not a size,
    count or layout, is filled when left out (here, by FILLED or by normalize_config's spellings),
    or refused with why: a field mlx-lm adds, or a family added, shows here."""
    from transformers import CONFIG_MAPPING

    unfilled = set()
    for name, kind, args, in_text in families():
        if kind not in CONFIG_MAPPING:
            continue  # no reference default: it stays required (Klear, hunyuan, ...)
        for field in sorted(required(args) - LEFT_REQUIRED):
            try:
                transformers_default(kind, field)
            except KeyError:
                continue  # transformers has no such field: no reference default
            if f"{kind}.{field}" in LEFT_REQUIRED:
                continue
            try:
                filled = normalize_config(
                    check_config(left_out(TINY_CONFIGS[name], field, in_text), "c")
                )
            except StreamerError:
                continue  # refused with why
            if field not in (filled["text_config"] if in_text else filled):
                unfilled.add(f"{name}: {kind}.{field}")
    assert not unfilled


@pytest.mark.parametrize("model_type, field, value", FILLS)
def test_a_config_leaving_out_a_filled_field_plans_with_the_default(
    tmp_path, model_type, field, value
):
    name, _, _, in_text = next(f for f in families() if f[1] == model_type)
    config = left_out(TINY_CONFIGS[name], field, in_text)
    filled = normalize_config(check_config(config, "config.json"))
    assert (filled["text_config"] if in_text else filled)[field] == value
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert plan(tmp_path / "config.json", 1 << 30).expert_bytes > 0  # it was refused


@pytest.mark.parametrize("field", SIZES)
def test_a_size_left_out_is_refused_in_one_line(tmp_path, field):
    config = {k: v for k, v in TINY_CONFIGS["qwen3_moe"].items() if k != field}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(StreamerError, match=f"required positional argument: '{field}'") as e:
        plan(tmp_path / "config.json", 1 << 30)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "family, field", [("qwen3_moe", "rms_norm_eps"), ("glm4_moe", "partial_rotary_factor")]
)
def test_a_repack_leaving_out_a_filled_field_loads_and_computes_as_the_default(
    tmp_path, family, field
):
    written = {**TINY_CONFIGS[family], field: REQUIRED_FILLED[family][field]}
    base = write_hf_checkpoint(tmp_path / "base", written)
    logits = []
    for name, config in (("given", written), ("left-out", left_out(written, field, False))):
        shutil.copytree(base, tmp_path / name)
        (tmp_path / name / "config.json").write_text(json.dumps(config))
        repack(tmp_path / name, tmp_path / f"{name}-out", log=lambda _: None)
        model, tokenizer = streamer.load(tmp_path / f"{name}-out", memory_budget=0)
        logits.append(model(mx.array(tokenizer.encode("hello"))[None]))
        mx.eval(logits[-1])  # while its model is loaded
    assert mx.array_equal(logits[0], logits[1])


def test_a_default_rope_parameters_takes_the_config_s_own_rope_theta():
    """transformers reads a transformers 4 rope_theta into its default rope_parameters; mlx-lm's
    glm_moe_dsa reads the base from rope_parameters alone: the default's 10000 would replace it."""
    config = {**left_out(TINY_CONFIGS["glm_moe_dsa"], "rope_parameters", False), "rope_theta": 5e5}
    filled = normalize_config(check_config(config, "config.json"))
    assert filled["rope_parameters"] == {"rope_theta": 5e5, "rope_type": "default"}
