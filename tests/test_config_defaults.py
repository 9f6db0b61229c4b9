"""Fields a config leaves out where transformers' default is not mlx-lm's: filled as transformers
fills them (streamer/families/transformers/defaults.py); Nemotron-H's layer pattern as a string."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil

import mlx.core as mx
import pytest
from conftest import reference_model
from test_parity import PROMPT

import streamer
from fixtures import tiny_config, write_hf_checkpoint
from streamer.families.architectures import build_model
from streamer.families.config import check_config
from streamer.families.mlx_lm_models import model_file
from streamer.families.transformers.defaults import FILLED
from streamer.families.transformers.left_out import left_out_hint
from streamer.families.transformers.spellings import normalize_config
from streamer.repack import repack

FILLS = [(t, f, v) for t, fields in FILLED.items() for f, v in fields.items()]
# transformers' text model types -> mlx-lm's text model args for them
TEXT_ARGS = {
    "minimax_m3_vl_text": ("minimax_m3_vl", "TextArgs"),
    "qwen3_5_moe_text": ("qwen3_5", "TextModelArgs"),
}


def mlx_lm_args(model_type: str) -> type:
    module, name = TEXT_ARGS.get(model_type, (model_type, "ModelArgs"))
    return getattr(model_file(module), name)


MIMO_ROPE = ("rope_theta", "swa_rope_theta", "partial_rotary_factor")


def transformers_default(model_type: str, field: str):
    from transformers import CONFIG_MAPPING

    values = CONFIG_MAPPING[model_type]().to_dict()
    if field == "rope_scaling":  # transformers 5 keeps it in rope_parameters, with rope_theta
        return {k: v for k, v in values["rope_parameters"].items() if k != "rope_theta"}
    if model_type == "mimo_v2_flash" and field in MIMO_ROPE:  # one RoPE per layer kind
        kind = "sliding_attention" if field == "swa_rope_theta" else "full_attention"
        return values["rope_parameters"][kind][field.removeprefix("swa_")]
    if field == "rope_theta":
        return values["rope_parameters"]["rope_theta"]
    return values[field]


def assert_streams_as(src, written: dict, reference, out) -> None:
    """`written` as src's config.json, repacked to `out` and loaded, computes `reference`'s
    logits (mlx-lm's model with transformers' values written out)."""
    (src / "config.json").write_text(json.dumps(written))
    repack(src, out, log=lambda _: None)
    model, tokenizer = streamer.load(out, memory_budget=0, dtype=mx.float32)
    prompt = mx.array(tokenizer.encode(PROMPT))[None]
    assert mx.abs(model(prompt) - reference(prompt)).max().item() <= 1e-4


# what transformers derives from other fields into its RoPE default, unread by mlx-lm's model
DERIVED = {"max_position_embeddings", "partial_rotary_factor", "rope_type"}


@pytest.mark.parametrize("model_type, field, value", FILLS)
def test_each_fill_is_transformers_default_and_not_mlx_lms(model_type, field, value):
    wanted = transformers_default(model_type, field)
    if isinstance(value, dict):  # Mistral 4's RoPE: all but what transformers derives
        assert value.items() <= wanted.items() and set(wanted) - set(value) <= DERIVED, wanted
    else:
        assert value == wanted or (isinstance(value, list) and list(wanted) == value), wanted
    args = {f.name: f for f in dataclasses.fields(mlx_lm_args(model_type))}
    assert field in args, f"mlx-lm's {model_type} does not read {field}"
    default = args[field].default
    assert default != value and not (isinstance(default, tuple) and list(default) == value), (
        "mlx-lm fills it alike: nothing to fill"
    )


def test_gpt_oss_without_rope_scaling_is_yarn_as_transformers_computes_it():
    config = {k: v for k, v in tiny_config("gpt_oss").items() if k != "rope_scaling"}
    config.pop("rope_parameters", None)
    ropes = [
        type(m).__name__ for _, m in build_model(normalize_config(config), "c").named_modules()
    ]
    assert any("Yarn" in name for name in ropes), ropes  # mlx-lm's own default: nn.RoPE
    assert math.isclose(normalize_config(config)["rope_scaling"]["factor"], 32.0)
    given = {**config, "rope_scaling": {"rope_type": "yarn", "factor": 8.0}}
    assert normalize_config(given)["rope_scaling"]["factor"] == 8.0  # what a config says stays


def test_nemotron_h_pattern_as_a_string_streams_as_the_list(checkpoints, tmp_path):
    """NVIDIA's configs and transformers write "ME*EME"; mlx-lm iterates it, a letter a layer."""
    src = tmp_path / "src"
    shutil.copytree(checkpoints.hf("nemotron_h"), src)
    config = json.loads((src / "config.json").read_text())
    listed = config["hybrid_override_pattern"]
    (src / "config.json").write_text(
        json.dumps({**config, "hybrid_override_pattern": "".join(listed)})
    )
    assert (
        check_config(json.loads((src / "config.json").read_text()), "c")["hybrid_override_pattern"]
        == listed
    )
    repack(src, tmp_path / "string", log=lambda _: None)
    as_list = checkpoints.repacked(checkpoints.hf("nemotron_h"))
    texts = [
        streamer.generate(*streamer.load(f), "hello", max_tokens=8)
        for f in (tmp_path / "string", as_list)
    ]
    assert texts[0] == texts[1]
    with pytest.raises(streamer.StreamerError, match="hybrid_override_pattern is 'MX"):
        check_config({**config, "hybrid_override_pattern": "MX"}, "config.json")


@pytest.mark.parametrize(
    "fields, said",
    [
        ({"sliding_window": None}, "layers 1 are sliding_attention: a sliding layer needs"),
        (
            {"sliding_window": None, "layer_types": None, "num_hidden_layers": 12},
            "layers 0, 2, 4, 6 ... (6 layers) are sliding_attention (mlx-lm slides every even",
        ),
    ],
)
def test_step3p5_without_a_window_for_its_sliding_layers_is_refused(fields, said):
    """transformers' default window is null, which its model raises on and mlx-lm's cannot cache
    (a TypeError at the first token, before)."""
    config = {**tiny_config("step3p5"), **fields}
    with pytest.raises(
        streamer.StreamerError, match=re.escape(f"c: sliding_window is null, but {said}")
    ):
        check_config(config, "c")


@pytest.mark.parametrize(
    "left_out, said",
    [
        (
            ("sliding_window",),
            "sliding_window is left out, but layers 1 are sliding_attention: a sliding layer "
            "needs its window (transformers' step3p5 then has none and its model raises, mlx-lm "
            "slides over 512 tokens, the published config.json's window)",
        ),
        (
            ("sliding_window", "layer_types"),
            "sliding_window is left out, but layers 0, 2 are sliding_attention (mlx-lm slides "
            "every even layer without layer_types)",
        ),
        (
            ("layer_types",),
            "layer_types is left out: transformers' step3p5 then makes every layer full "
            "attention, mlx-lm slides every even layer, the published models 3 layers of 4",
        ),
    ],
)
def test_step3p5_window_or_layer_kinds_left_out_is_refused(left_out, said):
    """Left out, transformers' default is not mlx-lm's (no window and no sliding layer to it):
    mlx-lm streamed its own 512 and its even layers sliding, silently."""
    config = {k: v for k, v in tiny_config("step3p5").items() if k not in left_out}
    with pytest.raises(streamer.StreamerError, match=f"^c: {re.escape(said)}"):
        check_config(config, "c")
    full = ["full_attention"] * config["num_hidden_layers"]
    if "layer_types" not in left_out:  # no layer slides: neither model reads the window
        check_config({**config, "layer_types": full}, "c")


def test_step3p5_without_a_window_and_no_sliding_layer_streams_as_with_one(checkpoints, tmp_path):
    """No layer reads the window when none slides: a null one streams what any window gives."""
    texts = []
    for window in (None, 8):
        src = tmp_path / f"src{window}"
        shutil.copytree(checkpoints.hf("step3p5"), src)
        config = json.loads((src / "config.json").read_text())
        layers = ["full_attention"] * config["num_hidden_layers"]
        config.update(sliding_window=window, layer_types=layers)
        (src / "config.json").write_text(json.dumps(config))
        repack(src, tmp_path / f"repacked{window}", log=lambda _: None)
        texts.append(
            streamer.generate(*streamer.load(tmp_path / f"repacked{window}"), "hi", max_tokens=8)
        )
    assert texts[0] == texts[1]


@pytest.mark.parametrize("scale", [0.707, 0.5, None])
def test_mimo_value_scale_is_read_where_given_and_refused_where_left_out(scale):
    """transformers' default (0.707, the published value) is not MiMo's own code's nor mlx-lm's
    (no scaling) where the field is left out: no fill is right for both, so it is refused."""
    config = {**tiny_config("mimo_v2_flash"), "attention_value_scale": scale}
    assert check_config(config, "c")["attention_value_scale"] == scale  # both compute it
    left_out = {k: v for k, v in config.items() if k != "attention_value_scale"}
    with pytest.raises(
        streamer.StreamerError, match=r"c: attention_value_scale is left out: .*0\.707"
    ):
        check_config(left_out, "c")


@pytest.mark.parametrize(
    "field, value",
    [
        ("rope_theta", 5e6),
        ("swa_rope_theta", 1e4),
        ("partial_rotary_factor", 0.334),
        ("num_experts_per_tok", 8),
        ("n_group", 1),
        ("routed_scaling_factor", 1.0),
    ],
)
def test_mimo_hub_field_left_out_computes_as_transformers_default(tmp_path, field, value):
    """A hub-form MiMo-V2-Flash config.json (no rope_parameters) without one of these: mlx-lm's
    model args require each, and it was refused as 'rope_parameters has no full_attention entry'
    (the RoPE's) or as a model mlx-lm cannot build (the router's); transformers computes with its
    defaults (the published values)."""
    src = write_hf_checkpoint(tmp_path / "src", tiny_config("mimo_v2_flash", **{field: value}))
    reference = reference_model(src)
    config = json.loads((src / "config.json").read_text())
    del config[field]
    assert_streams_as(src, config, reference, tmp_path / "out")


@pytest.mark.parametrize("field", ["rope_theta", "swa_rope_theta", "partial_rotary_factor"])
def test_mimo_rope_in_rope_parameters_is_not_replaced_by_the_fill(field):
    """A transformers 5 config's own RoPE, in its per-layer-kind rope_parameters, is computed."""
    config = {k: v for k, v in tiny_config("mimo_v2_flash").items() if k != field}
    kinds = {
        "full_attention": {"rope_type": "default", "rope_theta": 7e6, "partial_rotary_factor": 0.5},
        "sliding_attention": {
            "rope_type": "default",
            "rope_theta": 3e4,
            "partial_rotary_factor": 0.5,
        },
    }
    own = {"rope_theta": 7e6, "swa_rope_theta": 3e4, "partial_rotary_factor": 0.5}[field]
    assert normalize_config({**config, "rope_parameters": kinds})[field] == own


@pytest.mark.parametrize("null", [False, True])
def test_hunyuan_without_rope_scaling_is_refused_with_the_field(null):
    """mlx-lm's hunyuan reads its NTK alpha from rope_scaling: without one it failed to build
    ('NoneType' object is not subscriptable, no field named); transformers' hunyuan_v1_moe then
    computes plain RoPE, the published Hunyuan-A13B alpha 1000: no fill is both's."""
    config = tiny_config("hunyuan")
    if null:
        config["rope_scaling"] = None
    else:
        del config["rope_scaling"]
    said = "null" if null else "left out"
    with pytest.raises(streamer.StreamerError, match=f"^c: rope_scaling is {said}: .*alpha"):
        check_config(config, "c")


@pytest.mark.parametrize("null", ["rope_scaling", "rope_parameters"])
def test_gpt_oss_with_a_null_rope_scaling_is_yarn_as_left_out(null):
    """`"rope_scaling": null` written out: transformers fills YaRN as for a missing field (its RoPE
    standardization, in every config class), so streamer does; it computed plain RoPE."""
    from transformers import CONFIG_MAPPING

    config = {k: v for k, v in tiny_config("gpt_oss").items() if k != "rope_scaling"}
    config.pop("rope_parameters", None)
    assert CONFIG_MAPPING["gpt_oss"](**{null: None}).rope_parameters["rope_type"] == "yarn"
    filled = normalize_config({**config, null: None})
    assert filled["rope_scaling"] == normalize_config(config)["rope_scaling"]
    ropes = [type(m).__name__ for _, m in build_model(filled, "c").named_modules()]
    assert any("Yarn" in name for name in ropes), ropes


def test_a_null_transformers_keeps_is_not_filled():
    """deepseek_v3's `n_group: null` is None to transformers too: not filled with its default."""
    from streamer.families.transformers.defaults import fill_defaults

    assert fill_defaults({"model_type": "deepseek_v3", "n_group": None})["n_group"] is None


@pytest.mark.parametrize("model_type", ["granitemoe", "granitemoehybrid", "jamba", "olmoe"])
def test_untied_checkpoint_leaving_out_tie_word_embeddings_computes_with_its_lm_head(
    tmp_path, model_type
):
    """Left out, tie_word_embeddings is false to transformers (its model computes with the saved
    lm_head) and true to mlx-lm's model for these families, which dropped the lm_head and
    computed with the embeddings (granitemoehybrid: 37 logits apart)."""
    src = write_hf_checkpoint(tmp_path / "src", tiny_config(model_type, tie_word_embeddings=False))
    untied = reference_model(src)  # mlx-lm's model as config.json said it
    config = json.loads((src / "config.json").read_text())
    del config["tie_word_embeddings"]
    (src / "config.json").write_text(json.dumps(config))
    repack(src, tmp_path / "out", log=lambda _: None)
    model, tokenizer = streamer.load(tmp_path / "out", memory_budget=0, dtype=mx.float32)
    prompt = mx.array(tokenizer.encode(PROMPT))[None]
    assert mx.abs(model(prompt) - untied(prompt)).max().item() <= 1e-4


@pytest.mark.parametrize(
    "model_type, field, value",
    [
        ("deepseek_v3", "num_experts_per_tok", 8),
        ("ernie4_5_moe", "moe_k", 6),
        ("nemotron_h", "n_group", 1),
    ],
)
def test_routing_left_out_computes_as_transformers_default(tmp_path, model_type, field, value):
    """No weight shape shows how many experts a token routes to: left out, mlx-lm routed
    DeepSeek-V3 and ERNIE tokens to 1 expert (transformers: 8 and 6) and Nemotron-H's router
    raised a TypeError at the first token; now filled as transformers fills them."""
    src = write_hf_checkpoint(tmp_path / "src", tiny_config(model_type, **{field: value}))
    reference = reference_model(src)  # mlx-lm's model with transformers' default written out
    config = json.loads((src / "config.json").read_text())
    del config[field]
    assert_streams_as(src, config, reference, tmp_path / "out")


def _gemma4(model_type: str, **text) -> dict:
    """A tiny Gemma 4 config (gemma4's: its text_config) with `text` over the text model's."""
    if model_type == "gemma4":
        config = tiny_config("gemma4")
        return {**config, "text_config": {**config["text_config"], **text}}
    return tiny_config("gemma4_text", **text)


def _text(config: dict) -> dict:
    return config.get("text_config", config)


# Gemma 4 built as transformers computes it where these are left out (or null): no layer shares
# another's keys and values (mlx-lm: the last 20 do), and every 6th layer and the last are full
# attention (mlx-lm: every 5th); the global heads as wide as the sliding ones, as no shape shows it
GEMMA4_AS_TRANSFORMERS = {
    "num_kv_shared_layers": {
        "num_hidden_layers": 24,
        "layer_types": ["sliding_attention", "full_attention"] * 12,
        "num_kv_shared_layers": 0,
    },
    "layer_types": {
        "num_hidden_layers": 7,
        "layer_types": ["sliding_attention"] * 5 + ["full_attention"] * 2,
        "global_head_dim": 32,
    },
}


@pytest.mark.parametrize("model_type", ["gemma4_text", "gemma4"])
@pytest.mark.parametrize(  # a null count is transformers' refusal, not a field left out
    "field,null", [("num_kv_shared_layers", False), ("layer_types", False), ("layer_types", True)]
)
def test_gemma4_left_out_computes_as_transformers_default(tmp_path, model_type, field, null):
    """mlx-lm's defaults shared the last 20 layers' keys and values (48 logits apart on 24 layers)
    and made every 5th layer full attention (15 apart): now filled as transformers fills them."""
    config = _gemma4(model_type, **GEMMA4_AS_TRANSFORMERS[field])
    src = write_hf_checkpoint(tmp_path / "src", config)
    reference = reference_model(src)  # mlx-lm's model with transformers' values written out
    config = json.loads((src / "config.json").read_text())
    if null:
        _text(config)[field] = None
    else:
        del _text(config)[field]
    assert_streams_as(src, config, reference, tmp_path / "out")


@pytest.mark.parametrize("model_type", ["gemma4_text", "gemma4"])
def test_gemma4_last_layer_sliding_is_refused(model_type):
    """transformers' gemma4 makes the last layer full attention whatever layer_types says (with
    a warning), mlx-lm computed it sliding."""
    config = _gemma4(model_type, layer_types=["full_attention", "sliding_attention"])
    prefix = "text_config." if model_type == "gemma4" else ""
    with pytest.raises(
        streamer.StreamerError, match=f"^c: {prefix}layer_types ends in 'sliding_attention': "
    ):
        check_config(config, "c")


@pytest.mark.parametrize(
    "model_type, given",
    [
        ("exaone_moe", {"rope_theta": 1e4}),
        ("glm4_moe_lite", {"rope_theta": 1e4}),
        ("qwen2_moe", {"rope_theta": 1e4}),
        ("phimoe", {"rope_theta": 1e6}),
        # mlx-lm's ModelArgs require one: these were refused as models it cannot build
        ("dots1", {"rope_theta": 1e4}),
        ("ernie4_5_moe", {"rope_theta": 5e5}),
        ("glm4_moe", {"rope_theta": 1e4}),
        ("granitemoe", {"rope_theta": 1e4}),
        ("longcat_flash", {"rope_theta": 1e7}),
        ("minimax", {"rope_theta": 1e6}),
        ("qwen3_moe", {"rope_theta": 1e4}),
        ("qwen3_next", {"rope_theta": 1e4}),
        (
            "mellum",
            {
                "rope_parameters": {
                    "full_attention": {"rope_type": "default", "rope_theta": 5e5},
                    "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                }
            },
        ),
    ],
)
def test_rope_left_out_computes_as_transformers_default(tmp_path, model_type, given):
    """Without rope_theta (or rope_parameters' own), mlx-lm's base was 1e6 where transformers'
    is 1e4 (phimoe: 1e4 where it is 1e6): 1.3 to 3.3 logits apart; where mlx-lm's ModelArgs
    require one (dots1 to qwen3_next), and Mellum without rope_parameters, the config was
    refused as a model mlx-lm cannot build. Now filled as transformers fills them. A base given in
    rope_parameters (transformers 5's spelling) is the one computed."""
    src = write_hf_checkpoint(tmp_path / "src", tiny_config(model_type, **given))
    reference = reference_model(src)
    config = json.loads((src / "config.json").read_text())
    left_out = {k: v for k, v in config.items() if k not in ("rope_theta", "rope_parameters")}
    assert_streams_as(src, left_out, reference, tmp_path / "out")
    if "rope_theta" in given:
        base = {**left_out, "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}
        assert normalize_config(base)["rope_theta"] == 5e5


@pytest.mark.parametrize(
    "model_type, field, value, said",
    [
        ("afmoe", "num_dense_layers", 1, "num_dense_layers (transformers: 1, mlx-lm: 2)"),
        ("ernie4_5_moe", "moe_num_shared_experts", 2, "moe_num_shared_experts (transformers: 2"),
        ("deepseek_v3", "n_shared_experts", 1, "n_shared_experts (transformers: 1, mlx-lm: None)"),
    ],
)
def test_a_count_left_out_is_named_where_the_weights_refuse_it(
    tmp_path, model_type, field, value, said
):
    """Counts the weights' names and shapes show are not filled: left out, the checkpoint is
    refused, and the message named no field ("config.json belongs to another model")."""
    src = write_hf_checkpoint(tmp_path / "src", tiny_config(model_type, **{field: value}))
    config = json.loads((src / "config.json").read_text())
    del config[field]
    (src / "config.json").write_text(json.dumps(config))
    with pytest.raises(streamer.StreamerError, match=f"config.json leaves out .*{re.escape(said)}"):
        repack(src, tmp_path / "out", log=lambda _: None)


MELLUM_ROPE = {
    "full_attention": {"rope_type": "default", "rope_theta": 2e5},
    "sliding_attention": {"rope_type": "default", "rope_theta": 3e4},
}


@pytest.mark.filterwarnings("ignore:`rope_scaling` is deprecated:FutureWarning")  # its subject
def test_mellum_rope_scaling_alone_is_its_rope_parameters(tmp_path):
    """transformers reads Mellum's rope_scaling (transformers 4's spelling) as its
    rope_parameters, as given; mlx-lm's mellum reads rope_parameters alone: it was refused as a
    model mlx-lm cannot build (KeyError: 'sliding_attention')."""
    src = write_hf_checkpoint(tmp_path / "src", tiny_config("mellum", rope_parameters=MELLUM_ROPE))
    reference = reference_model(src)
    config = json.loads((src / "config.json").read_text())
    del config["rope_parameters"]
    assert_streams_as(src, {**config, "rope_scaling": MELLUM_ROPE}, reference, tmp_path / "out")


@pytest.mark.parametrize("given", ["rope_scaling", "rope_parameters"])
def test_mellum_rope_without_an_entry_per_layer_kind_is_refused(given):
    """A flat RoPE (transformers 4's {"rope_type": ..., "factor": ...}) has no entry per layer
    kind: transformers' model and mlx-lm's fail on it (a KeyError)."""
    config = {k: v for k, v in tiny_config("mellum").items() if k != "rope_parameters"}
    config[given] = {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e4}
    with pytest.raises(
        streamer.StreamerError,
        match=f"^c: {given} has no 'full_attention' or 'sliding_attention' entry with a rope_theta",
    ):
        check_config(config, "c")


def test_mellum_linear_rope_with_a_factor_is_refused():
    """mlx-lm's mellum computes rope_type "linear" as plain RoPE (its _rope_for), transformers
    divides the positions by the factor: refused, a factor of 1 (the same in both) not."""
    config = tiny_config("mellum")
    rope = {k: dict(v) for k, v in config["rope_parameters"].items()}
    rope["full_attention"].update(rope_type="linear", factor=1.0)
    check_config({**config, "rope_parameters": rope}, "c")
    rope["full_attention"]["factor"] = 4.0
    with pytest.raises(
        streamer.StreamerError,
        match="^c: rope_parameters's 'full_attention' entry is linear RoPE with factor 4.0",
    ):
        check_config({**config, "rope_parameters": rope}, "c")


@pytest.mark.parametrize(
    "model_type, field",
    [
        ("nemotron_h", "n_routed_experts"),
        ("ernie4_5_moe", "moe_num_shared_experts"),
        ("gemma4_text", "intermediate_size"),
    ],
)
def test_the_left_out_hint_names_only_fields_that_change_the_weights(model_type, field):
    """Left out too, Nemotron-H's layers_block_type and time_step_*, ERNIE's
    moe_layer_end_index and Gemma 4's rope_parameters default differently in the two libraries
    but change no weight mlx-lm builds: they were named beside the field that did."""
    hint = left_out_hint({k: v for k, v in tiny_config(model_type).items() if k != field})
    assert re.fullmatch(rf" config\.json leaves out {field} \([^()]*\), which .*", hint), hint
