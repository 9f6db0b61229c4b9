"""What the LongCat-Flash and MiMo-V2-Flash checkpoints transformers writes exercise, and the
configs of theirs that streamer reads otherwise than mlx-lm would (test_transformers_written.py
streams each tiny checkpoint against transformers' logits)."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest
import torch
from mlx_lm.utils import quantize_model, save_model
from test_parity import PROMPT, assert_exactly_as
from test_transformers_written import assert_streams_as
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

import streamer
from fixtures import TINY_CONFIGS
from fixtures.tokenizer import write_tokenizer
from fixtures.transformers_families import FAMILIES
from fixtures.transformers_written import write_transformers_checkpoint
from streamer.errors import StreamerError
from streamer.families.architectures import build_model
from streamer.families.transformers.spellings import normalize_config
from streamer.io.checkpoint import Checkpoint
from streamer.repack import Quantize, repack
from streamer.repack.layouts import sanitizer


def _prompt(folder) -> torch.Tensor:
    return torch.tensor([AutoTokenizer.from_pretrained(folder).encode(PROMPT)])


def test_longcat_flash_routes_zero_experts_written_without_down_proj(tmp_path):
    """What the LongCat-Flash check exercises: transformers routes some of the prompt's choices
    to zero (identity) experts and some to routed ones, on corrected scores. Transformers before
    5.25 writes the zero experts' unused gate and up rows as `experts.{e}.gate_proj` / `up_proj`
    with no `down_proj` (which the repack drops: streamer/repack/layouts.py); 5.25 writes only the
    routed experts. Either layout is a published one, and test_transformers_written.py streams
    whichever the installed transformers writes."""
    oracle = write_transformers_checkpoint(tmp_path, "longcat_flash")
    routed, zero = oracle.config.n_routed_experts, oracle.config.zero_expert_num
    with Checkpoint(tmp_path) as ckpt:
        names = {n.split(".experts.")[1] for n in ckpt.tensors if ".layers.0.mlp.experts." in n}
    routed_rows = {f"{e}.{p}_proj.weight" for e in range(routed) for p in ("gate", "up", "down")}
    zero_rows = {
        f"{e}.{p}_proj.weight" for e in range(routed, routed + zero) for p in ("gate", "up")
    }
    assert names in (routed_rows, routed_rows | zero_rows)
    chosen = []
    for name, module in oracle.named_modules():
        if name.endswith("mlp.router"):
            assert module.e_score_correction_bias.abs().min() > 0
            module.register_forward_hook(lambda _m, _i, out: chosen.append(out[2].flatten()))
    with torch.no_grad():
        oracle(_prompt(tmp_path))
    chosen = torch.cat(chosen)
    assert (chosen >= routed).any() and (chosen < routed).any()


def test_mimo_v2_flash_window_and_sinks_change_what_transformers_computes(tmp_path):
    """What the MiMo-V2-Flash check exercises: the prompt is longer than the sliding window of 4
    keys and the sliding layers' sinks are nonzero, and each changes transformers' logits
    (so that streaming the same logits checks both)."""
    oracle = write_transformers_checkpoint(tmp_path, "mimo_v2_flash")
    prompt = _prompt(tmp_path)
    with torch.no_grad():
        logits = oracle(prompt).logits
        oracle.config.sliding_window = prompt.shape[1]  # every key in the window
        unwindowed = oracle(prompt).logits
        oracle.config.sliding_window = 4
        for module in oracle.modules():
            if getattr(module, "sinks", None) is not None:
                module.sinks.fill_(-torch.inf)  # no sink
        unsunk = oracle(prompt).logits
    assert (logits - unwindowed).abs().max() > 1e-2
    assert (logits - unsunk).abs().max() > 1e-2


def test_mimo_v2_flash_rope_mlx_lm_cannot_compute_is_refused(tmp_path):
    """transformers 5 keeps a RoPE per layer type; mlx-lm's model rotates one share of the head
    in every layer, so a config.json whose types rotate different shares is refused, by name."""
    write_transformers_checkpoint(tmp_path / "src", "mimo_v2_flash")
    path = tmp_path / "src" / "config.json"
    config = json.loads(path.read_text())
    config["rope_parameters"]["sliding_attention"]["partial_rotary_factor"] = 0.5
    path.write_text(json.dumps(config))
    with pytest.raises(StreamerError, match="rope_parameters.*one partial_rotary_factor"):
        repack(tmp_path / "src", tmp_path / "dst", log=lambda _: None)
    assert not (tmp_path / "dst").exists()


def test_mimo_v2_flash_of_one_attention_kind_is_refused(tmp_path, monkeypatch):
    """transformers runs a MiMo-V2-Flash whose layers all have full attention; mlx-lm's model
    cannot (it takes each kind's mask from its first layer of that kind): refused, naming it."""
    fields = {**FAMILIES["mimo_v2_flash"], "layer_types": ["full_attention"] * 4}
    monkeypatch.setitem(FAMILIES, "mimo_v2_flash", fields)
    write_transformers_checkpoint(tmp_path / "src", "mimo_v2_flash")
    with pytest.raises(StreamerError, match=r"layer_types \['full_attention'\].*needs both"):
        repack(tmp_path / "src", tmp_path / "dst", log=lambda _: None)
    assert not (tmp_path / "dst").exists()


def test_mimo_v2_flash_carrying_the_hub_fields_streams_what_transformers_computes(
    tmp_path, monkeypatch
):
    """A config transformers 5 makes from a published config.json keeps the hub's own fields
    (hybrid_layer_pattern, swa_*, rope_theta, sliding_window_size, ...), which its model does not
    read: it attends to sliding_window_size + 1 keys, rotates by its per-type rope_parameters and
    gives the sliding layers twice the KV heads. Here they disagree with its own fields, as they
    would once a published config is made smaller: transformers' own fields decide."""
    own = AutoConfig.for_model("mimo_v2_flash").to_dict()
    published = TINY_CONFIGS["mimo_v2_flash"]
    hub = {k: v for k, v in published.items() if k not in own and k != "torch_dtype"}
    monkeypatch.setitem(FAMILIES, "mimo_v2_flash", {**FAMILIES["mimo_v2_flash"], **hub})
    oracle = write_transformers_checkpoint(tmp_path / "src", "mimo_v2_flash")
    config = json.loads((tmp_path / "src" / "config.json").read_text())
    assert config["sliding_window"] == config["sliding_window_size"] + 1
    assert config["hybrid_layer_pattern"] == published["hybrid_layer_pattern"]
    assert_streams_as(oracle, tmp_path)


def mlx_quantized(src: Path, folder: Path) -> nn.Module:
    """`src` quantized as mlx_lm.convert quantizes (4 bits, group 64: mlx-lm's quantize_model and
    save_model, on mlx-lm's model of src's weights as streamer reads them) into `folder`, with
    transformers 5's config.json kept. Returns mlx-lm's resident model of it, in float32."""
    with Checkpoint(src) as ckpt:
        config = normalize_config(ckpt.config)
        reference = build_model(config, src)
        weights = sanitizer(reference, src, config)({n: ckpt.lazy(n) for n in ckpt.tensors})
        reference.load_weights(list(weights.items()))
        mx.eval(reference.parameters())
        published = dict(ckpt.config)
    with contextlib.redirect_stdout(io.StringIO()):  # its bits-per-weight line
        _, quantized = quantize_model(reference, config, 64, 4)
    save_model(folder, reference)
    for name in ("quantization", "quantization_config"):
        published[name] = quantized[name]
    (folder / "config.json").write_text(json.dumps(published))
    for path in src.glob("tokenizer*"):
        shutil.copy(path, folder)
    reference.set_dtype(mx.float32)
    return reference


@pytest.mark.parametrize(
    "model_type", ["longcat_flash", "mimo_v2_flash", "bailing_hybrid", "kimi_k25"]
)
def test_quantized_in_place_and_with_quantize_as_mlx_lm_quantizes(tmp_path, model_type):
    """The transformers-written checkpoint quantized as mlx_lm.convert would (were its config.json
    one mlx-lm reads) streams in place from its shards, and `--quantize` repacks the bf16
    checkpoint into the same model: both identical to mlx-lm's resident model of the quantized
    weights (logits to the bit, 24 greedy tokens)."""
    write_transformers_checkpoint(tmp_path / "src", model_type)
    reference = mlx_quantized(tmp_path / "src", tmp_path / "mlx")
    repack(tmp_path / "src", tmp_path / "dst", quantize=Quantize(4, 64), log=lambda _: None)
    for folder in (tmp_path / "mlx", tmp_path / "dst"):
        model, tokenizer = streamer.load(folder, memory_budget=0, dtype=mx.float32)
        assert_exactly_as(model, reference, mx.array(tokenizer.encode(PROMPT)), 24)
        model.streamer.close()


@pytest.mark.parametrize("model_type", ["longcat_flash", "mimo_v2_flash"])
def test_loaded_in_bf16_and_saved_again_streams_what_transformers_computes(tmp_path, model_type):
    """Loaded by transformers in bfloat16 (through its weight conversions) and saved again: its
    float32 modules (MiMo-V2-Flash's router, `_keep_in_fp32_modules_strict`) stay float32 in a
    bf16 checkpoint, and the bf16 copy of LongCat-Flash's correction bias rounds it."""
    oracle = write_transformers_checkpoint(tmp_path / "first", model_type)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "first", dtype=torch.bfloat16)
    loaded.save_pretrained(tmp_path / "src")
    write_tokenizer(tmp_path / "src")
    with Checkpoint(tmp_path / "src") as ckpt:
        wider = {n.rsplit(".", 1)[0] for n, info in ckpt.tensors.items() if info.dtype == "F32"}
    routers = {
        f"model.layers.{i}.mlp.gate"  # its weight and correction bias
        for i, kind in enumerate(getattr(oracle.config, "mlp_layer_types", ()))
        if kind == "sparse"
    }
    assert wider == routers
    assert_streams_as(oracle, tmp_path)


@pytest.mark.parametrize(
    "hub, transformers",
    [
        ("layernorm_epsilon", "rms_norm_eps"),
        ("sliding_window_size", "sliding_window"),
        ("hybrid_layer_pattern", "layer_types"),
        ("moe_layer_freq", "mlp_layer_types"),
    ],
)
def test_a_hub_mimo_config_without_a_field_names_both_spellings(hub, transformers):
    """A published (hub-form) MiMo-V2-Flash config.json without one of these was refused naming
    transformers 5's field alone ("config.json has no 'rms_norm_eps'"), a field it never has."""
    config = {k: v for k, v in TINY_CONFIGS["mimo_v2_flash"].items() if k != hub}
    with pytest.raises(
        StreamerError,
        match=rf"config.json has neither '{hub}' \(the published spelling\) nor '{transformers}'",
    ):
        normalize_config(config)


def test_mimo_rope_parameters_with_a_field_beside_the_layer_kinds_is_read():
    """transformers reads rope_parameters' entry per layer kind alone: a rope_type beside them was
    an AttributeError traceback ('str' object has no attribute 'get')."""
    rope = {"rope_type": "default", "partial_rotary_factor": 0.5}
    kinds = {
        "full_attention": {**rope, "rope_theta": 7e6},
        "sliding_attention": {**rope, "rope_theta": 3e4},
        "rope_type": "default",
    }
    config = {**TINY_CONFIGS["mimo_v2_flash"], "rope_parameters": kinds}
    del config["rope_theta"], config["swa_rope_theta"], config["partial_rotary_factor"]
    read = normalize_config(config)
    assert (read["rope_theta"], read["swa_rope_theta"], read["partial_rotary_factor"]) == (
        7e6,
        3e4,
        0.5,
    )
