"""config.json values of the wrong type or range, at repack and in a manifest at load: each
refused in one line naming the field, before anything is built (tests/test_fuzz_config.py drives
random ones)."""

from __future__ import annotations

import json

import mlx.core as mx
import pytest
from bad_checkpoints import assert_refused, copy_checkpoint
from hostile_files import edited_copy

import streamer
from fixtures import tiny_config, write_hf_checkpoint
from streamer.errors import StreamerError
from streamer.families.model_types import mlx_lm_classes
from streamer.repack import repack

BAD_CONFIG_VALUES = [
    ("num_experts", 0, "num_experts is 0"),
    ("num_experts_per_tok", 17, "num_experts_per_tok is 17, expected an integer from 1 to the 16"),
    ("num_experts_per_tok", 0, "num_experts_per_tok is 0"),
    ("num_attention_heads", 0, "num_attention_heads is 0"),
    ("moe_intermediate_size", -64, "moe_intermediate_size is -64"),
    ("model_type", 3, "model_type is 3, expected a string"),
    ("num_hidden_layers", 10**9, "num_hidden_layers is 1000000000"),
    ("hidden_size", 1 << 40, "hidden_size is 1099511627776"),
    ("rms_norm_eps", "tiny", "rms_norm_eps is 'tiny', expected a finite number"),
    ("quantization", {"bits": 4, "group_size": "64"}, "quantization.group_size is '64'"),
    ("quantization", {"bits": 4, "group_size": 7}, "quantization.group_size is 7, expected what"),
    ("quantization", {"bits": 4, "group_size": 64, "mode": "foo"}, "quantization.mode is 'foo'"),
]


def repacked_with_config(checkpoints, tmp_path, fields: dict):
    """A copy of the repacked qwen3_moe whose manifest's config has `fields` changed."""
    repacked = checkpoints.repacked(checkpoints.hf("qwen3_moe"))
    return edited_copy(repacked, tmp_path / "model", lambda m: m["config"].update(fields))


@pytest.mark.parametrize("field,value,message", BAD_CONFIG_VALUES)
def test_config_values_are_checked_at_repack(checkpoints, tmp_path, field, value, message):
    src = copy_checkpoint(checkpoints.hf("qwen3_moe"), tmp_path)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, field: value}))
    assert_refused(src, tmp_path, "config.json", message)


@pytest.mark.parametrize("field,value,message", BAD_CONFIG_VALUES)
def test_manifest_config_values_are_checked_at_load(checkpoints, tmp_path, field, value, message):
    folder = repacked_with_config(checkpoints, tmp_path, {field: value})
    with pytest.raises(StreamerError, match="manifest.json") as err:
        streamer.load(folder)
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("field", ["num_experts_per_tok", "rope_theta"])
def test_null_where_the_model_needs_a_number(checkpoints, tmp_path, field):
    """A null here passed the checks and reached the model (a TypeError or MLX's ValueError in
    generate and plan); a repack wrote it into the manifest."""
    src = copy_checkpoint(checkpoints.hf("qwen3_moe"), tmp_path)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, field: None}))
    assert_refused(src, tmp_path, "config.json", f"{field} is None")
    folder = repacked_with_config(checkpoints, tmp_path, {field: None})
    with pytest.raises(StreamerError, match=f"manifest.json: config field {field} is None"):
        streamer.load(folder)


# Values a family's mlx-lm model builds with and raises on only when it routes a token (mid-
# generation, a traceback, after a repack wrote them): model_type, field, value.
ROUTING_VALUES = [
    ("laguna", "moe_router_score_func", "softmax"),
    ("kimi_linear", "moe_router_activation_func", "tanh"),
    ("longcat_flash", "zero_expert_type", "drop"),
    ("bailing_moe", "n_group", 3),  # 16 experts (num_experts) in 3 groups: a failed reshape
    ("afmoe", "n_group", 3),
    ("afmoe", "n_group", 16),  # groups of one expert: a top-2 of one (the router's group score)
    ("deepseek_v3", "n_group", 16),
    ("glm4_moe", "n_group", 16),
]


@pytest.mark.parametrize("arch,field,value", ROUTING_VALUES)
def test_values_mlx_lm_refuses_only_when_routing(checkpoints, tmp_path, arch, field, value):
    config = {**tiny_config(arch), field: value}
    model_class, args_class = mlx_lm_classes(config)
    with pytest.raises((ValueError, AssertionError)):  # mlx-lm's own, at the first token
        mx.eval(model_class(args_class.from_dict(config))(mx.array([[1, 2, 3]])))
    src = copy_checkpoint(checkpoints.hf(arch), tmp_path)
    hf_config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**hf_config, field: value}))
    assert_refused(src, tmp_path, "config.json", f"config field {field} is {value!r}")
    repacked = checkpoints.repacked(checkpoints.hf(arch))
    folder = edited_copy(repacked, tmp_path / "model", lambda m: m["config"].update({field: value}))
    with pytest.raises(StreamerError, match="manifest.json") as err:
        streamer.load(folder)
    assert f"{field} is {value!r}" in str(err.value) and "\n" not in str(err.value)


def _logits(config: dict, weights: dict | None = None) -> tuple[mx.array, dict]:
    """mlx-lm's logits for `config` (as streamer reads it), with `weights` where given, and the
    weights it computed with."""
    from streamer.families.architectures import build_model
    from streamer.families.transformers.spellings import normalize_config

    model = build_model(normalize_config(config), "config.json")
    if weights is not None:
        model.update(weights)
    return model(mx.array([[1, 2, 3]])), model.parameters()


@pytest.mark.parametrize(
    "arch, changed",
    [
        ("bailing_moe", {"n_group": 1, "topk_group": 4}),  # mlx-lm's own defaults for Ling 2.0
        ("bailing_moe", {"n_group": 1, "topk_group": 4, "moe_router_enable_expert_bias": False}),
        ("deepseek_v3", {"n_group": 1, "topk_group": 4}),
        ("bailing_hybrid", {"n_group": 4, "topk_group": 6}),  # it drops no group
        ("bailing_hybrid", {"n_group": 16, "topk_group": 16}),
        ("dots1", {"n_group": 16, "topk_group": 16}),  # it groups where they differ
        ("deepseek_v2", {"topk_method": "greedy", "n_group": 3, "topk_group": 5}),  # unread
    ],
)
def test_groups_mlx_lm_does_not_apply_are_taken(arch, changed):
    """Where mlx-lm's router keeps every group (one group, or topk_group at or past n_group in the
    routers that test it) it computes as without groups: these were refused (topk_group past
    n_group, groups of one, or not dividing the experts)."""
    config = {**tiny_config(arch), **changed}
    expected, weights = _logits({**config, "n_group": 1, "topk_group": 1})
    got, _ = _logits(config, weights)
    assert mx.array_equal(got, expected)


@pytest.mark.parametrize(
    "arch, changed, said",
    [
        ("dots1", {"n_group": 1, "topk_group": 4}, "topk_group is 4, expected at most n_group"),
        ("deepseek_v3", {"n_group": 4, "topk_group": 6}, "topk_group is 6, expected at most"),
        ("bailing_moe_v3", {"n_group": 16, "topk_group": 16}, "n_group is 16, expected at most 8"),
        ("deepseek_v2", {"n_group": 1, "topk_group": 4}, "topk_group is 4, expected at most"),
        ("bailing_hybrid", {"n_group": 16, "topk_group": 8}, "n_group is 16, expected at most 8"),
    ],
)
def test_groups_mlx_lm_routes_wrongly_or_fails_on_are_refused(arch, changed, said):
    """topk_group past n_group where the router groups drops groups it should keep (or fails at
    its argpartition); groups of one fail at its top-2 of each group."""
    from streamer.families.config import check_config

    with pytest.raises(StreamerError, match=f"config.json: config field {said}"):
        check_config({**tiny_config(arch), **changed}, "config.json")


@pytest.mark.parametrize(
    "arch, field",
    [
        ("deepseek_v3", "n_group"),
        ("deepseek_v3", "topk_group"),  # its fixture's 4 groups
        ("glm4_moe", "routed_scaling_factor"),
        ("bailing_moe", "topk_group"),
        ("dots1", "n_group"),
        ("deepseek_v2", "n_group"),  # under group_limited_greedy
    ],
)
def test_a_null_router_number_is_refused(arch, field):
    """A null replaces mlx-lm's default for these and reached its router's arithmetic: a
    TypeError (DeepSeek-V2's: MLX's RuntimeError) at the first token, after a repack wrote it."""
    from streamer.families.config import check_config

    config = {**tiny_config(arch), field: None}
    model_class, args_class = mlx_lm_classes(config)
    with pytest.raises((TypeError, RuntimeError)):
        mx.eval(model_class(args_class.from_dict(config))(mx.array([[1, 2, 3]])))
    with pytest.raises(StreamerError, match=f"config.json: config field {field} is None, expected"):
        check_config(config, "config.json")


@pytest.mark.parametrize(
    "arch, changed",
    [
        ("mimo_v2_flash", {"routed_scaling_factor": None}),  # the published config's: 1.0
        ("deepseek_v2", {"topk_method": "greedy", "n_group": None, "topk_group": None}),
        ("deepseek_v3", {"n_group": 1, "topk_group": None}),  # one group: unread
    ],
)
def test_a_null_router_number_mlx_lm_computes_with_is_taken(arch, changed):
    config = {**tiny_config(arch), **changed}
    logits, _ = _logits(config)
    assert mx.isfinite(logits).all().item()


def test_layer_count_beyond_the_tensors_present(checkpoints, tmp_path):
    src = copy_checkpoint(checkpoints.hf("qwen3_moe"), tmp_path)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 900}))
    assert_refused(src, tmp_path, "config.json")


def test_manifest_layer_count_beyond_its_layers(checkpoints, tmp_path):
    folder = repacked_with_config(checkpoints, tmp_path, {"num_hidden_layers": 900})
    with pytest.raises(StreamerError, match="num_hidden_layers is 900 but the weights hold"):
        streamer.load(folder)


PLAN_ONLY_VALUES = [  # fields plan reads from a repacked folder's config without mlx-lm
    ("num_key_value_heads", "2", "num_key_value_heads is '2'"),
    ("head_dim", -1, "head_dim is -1"),
    ("text_config", 5, "text_config is 5, expected an object"),
    ("torch_dtype", ["bfloat16"], "torch_dtype is ['bfloat16']"),
]


@pytest.mark.parametrize("field,value,message", BAD_CONFIG_VALUES + PLAN_ONLY_VALUES)
def test_manifest_config_values_are_checked_by_plan(checkpoints, tmp_path, field, value, message):
    """plan reads a repacked folder from its files, without building mlx-lm's model: the
    manifest's config is checked all the same."""
    from streamer.plan import plan

    folder = repacked_with_config(checkpoints, tmp_path, {field: value})
    with pytest.raises(StreamerError, match="manifest.json") as err:
        plan(folder, 8 << 30)
    named = message.split(", expected")[0]  # the field and its value (ranges word the want)
    assert named in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("changed", [{"group_size": 7}, {"mode": "foo"}, {"bits": 7}])
def test_plan_of_a_config_json_refuses_what_mlx_cannot_quantize(tmp_path, changed):
    """These reached MLX's ValueError while plan built the model (a traceback)."""
    from streamer.plan import plan

    config = tmp_path / "config.json"
    quantization = {"group_size": 64, "bits": 4, **changed}
    config.write_text(json.dumps({**tiny_config("qwen3_moe"), "quantization": quantization}))
    ((field, value),) = changed.items()
    with pytest.raises(StreamerError) as err:
        plan(config, 8 << 30)
    assert f"config.json: config field quantization.{field} is {value!r}" in str(err.value)
    assert "expected what MLX quantizes with ([quantize]" in str(err.value)


@pytest.mark.parametrize("field", ["num_experts_per_tok", "num_experts"])
def test_plan_and_info_refuse_a_null_top_k_or_expert_count_in_the_manifest(
    checkpoints, tmp_path, field
):
    """plan and info read the manifest without mlx-lm's args classes: a null here was planned
    (top-k 0: no expert bytes per token) where load refuses it."""
    from streamer.cli import main
    from streamer.plan import plan

    folder = repacked_with_config(checkpoints, tmp_path, {field: None})
    with pytest.raises(StreamerError, match=f"manifest.json: config field {field} is None"):
        plan(folder, 8 << 30)
    assert main(["info", str(folder)]) == 2  # info said "16 per layer, 0 routed per token"


def test_load_refuses_an_expert_count_the_layers_do_not_hold(checkpoints, tmp_path):
    """The model's count, family by family (LongCat's config counts zero experts no layer holds),
    against each layer's: load's check. plan takes its figures from the layers themselves."""
    folder = repacked_with_config(checkpoints, tmp_path, {"num_experts": 17})
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "num_experts": 17}))  # agreeing
    message = r"manifest.json: MoE layer 0 .* holds 16 experts but the model expects 17"
    with pytest.raises(StreamerError, match=message):
        streamer.load(folder)


@pytest.mark.parametrize("field", ["num_experts_per_tok", "num_experts"])
@pytest.mark.parametrize("value", [None, 0, -1, "4", 2.5, 4.0, True, 2, 17])
def test_a_repacked_folders_config_json_edited(checkpoints, tmp_path, field, value):
    """The model is built from the manifest's config, the tokenizer from config.json: a wrong
    type failed in transformers, blamed on tokenizer.json; a valid edit (top-k 2) was ignored
    by the model, and plan passed all of them."""
    from streamer.cli import main
    from streamer.plan import plan

    folder = repacked_with_config(checkpoints, tmp_path, {})
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, field: value}))
    for run in (lambda: plan(folder, 8 << 30), lambda: streamer.load(folder)):
        with pytest.raises(StreamerError, match="config.json") as err:
            run()
        text = str(err.value)
        assert f"{folder / 'config.json'}: " in text and "\n" not in text
        assert "repack the model" in text and "tokenizer" not in text
    assert main(["plan", str(folder)]) == 2


def test_a_value_transformers_config_class_refuses_names_config_json(tmp_path):
    """transformers builds the model's config class to load the tokenizer: its refusal of
    `n_shared_experts: null` read "cannot load the tokenizer ...; check tokenizer.json"."""
    src = write_hf_checkpoint(tmp_path / "src", tiny_config("deepseek_v3", n_shared_experts=None))
    repack(src, tmp_path / "out", log=lambda _: None)
    with pytest.raises(StreamerError) as err:
        streamer.load(tmp_path / "out")
    text = str(err.value)
    assert text.startswith(f"{tmp_path / 'out' / 'config.json'}: n_shared_experts is refused by")
    assert "expected int, got NoneType" in text and "tokenizer.json" not in text, text
    assert "\n" not in text
