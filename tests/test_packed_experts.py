"""Experts published in packed formats stream exactly as mlx-lm loads them: Kimi K3's MXFP4
(compressed-tensors' `mxfp4-pack-quantized`, copied as they are), Kimi K2 Thinking's int4
(`pack-quantized`, each expert through mlx-lm's sanitize, which adds the zero points) and
DeepSeek-V4.1's FP4 experts beside FP8 projections, UE8M0-scaled (each expert through sanitize,
which reads them as MXFP4; the FP8 ones as MXFP8)."""

from __future__ import annotations

import contextlib
import io
import json
import shutil

import mlx.core as mx
import mlx_lm
import pytest
from conftest import reference_model
from test_parity import compare

import streamer
from fixtures import compressed_tensors, muse_spark, tiny_config, write_hf_checkpoint
from fixtures.hadamard_pack import write_hadamard_pack
from streamer.errors import StreamerError
from streamer.io.manifest import read_manifest
from streamer.plan.model import model_plan
from streamer.repack import Quantize, repack


@pytest.mark.parametrize(
    "model_type, fmt, mode",
    [
        ("kimi_k3", "mxfp4-pack-quantized", "mxfp4"),
        ("kimi_k2", "pack-quantized", "affine"),
        # Kimi K2.5 as published: its text model under `language_model.`, which its sanitize
        # needs to find (each expert's pack was converted without it: "tensor 'language_model'
        # is missing")
        ("kimi_k25", "pack-quantized", "affine"),
        ("deepseek_v41", "ue8m0", "mxfp4"),
    ],
)
def test_packed_experts_stream_as_mlx_lm_loads_them(tmp_path, model_type, fmt, mode):
    src = write_hf_checkpoint(tmp_path / "src", tiny_config(model_type), pack=fmt)
    repack(src, tmp_path / "dst", log=lambda _: None)
    layers = read_manifest(tmp_path / "dst").layers
    assert {q.get("mode", "affine") for layer in layers for q in layer.quantization.values()} == {
        mode
    }
    compare(tmp_path / "dst", reference_model(src), tolerance=0.0)


@pytest.mark.parametrize(
    "model_type, fmt",
    [
        ("kimi_k3", "mxfp4-pack-quantized"),
        ("kimi_k2", "pack-quantized"),
        ("kimi_k25", "pack-quantized"),
        ("deepseek_v41", "ue8m0"),
    ],
)
def test_quantize_of_packed_experts_equals_mlx_lm_convert(tmp_path, model_type, fmt):
    """--quantize on a checkpoint whose experts are published packed: as mlx_lm.convert
    --quantize makes it (the packed experts kept as mlx-lm reads them, the rest quantized)."""
    src = write_hf_checkpoint(tmp_path / "src", tiny_config(model_type), pack=fmt)
    assert_quantize_equals_mlx_lm_convert(src, tmp_path)


def test_quant_method_mxfp8_streams_as_mlx_lm_loads_it(checkpoints, tmp_path):
    """config.json's `quantization_config: {quant_method: mxfp8}` over MLX-packed weights, which
    mlx-lm's loader reads as its mxfp8 mode: repacked identical to mlx-lm, and --quantize as
    mlx_lm.convert --quantize makes it. Not in place, as for every config.json not mlx-lm's own."""
    src = tmp_path / "src"
    shutil.copytree(checkpoints.mlx("qwen3_moe", bits=8, group_size=32, mode="mxfp8"), src)
    config = json.loads((src / "config.json").read_text())
    config.pop("quantization")
    config["quantization_config"] = {"quant_method": "mxfp8"}
    (src / "config.json").write_text(json.dumps(config))
    repack(src, tmp_path / "dst", log=lambda _: None)
    compare(tmp_path / "dst", reference_model(src), tolerance=0.0)
    assert_quantize_equals_mlx_lm_convert(src, tmp_path)


def assert_quantize_equals_mlx_lm_convert(src, tmp_path) -> None:
    repack(src, tmp_path / "quantized", quantize=Quantize(4, 64), log=lambda _: None)
    with contextlib.redirect_stdout(io.StringIO()):
        mlx_lm.convert(str(src), str(tmp_path / "converted"), quantize=True, q_bits=4)
    compare(tmp_path / "quantized", reference_model(tmp_path / "converted"), tolerance=0.0)


def test_int4_packed_kimi_k3_is_refused_as_mlx_lm_cannot_load_it(tmp_path):
    src = write_hf_checkpoint(tmp_path / "src", tiny_config("kimi_k3"), pack="pack-quantized")
    with pytest.raises(StreamerError, match="no zero points .*mlx-lm cannot load"):
        repack(src, tmp_path / "dst", log=lambda _: None)
    assert not (tmp_path / "dst").exists()


@pytest.mark.parametrize(
    "setting, value",
    [
        ("num_bits", 8),
        ("symmetric", False),
        ("actorder", "group"),
        ("strategy", "channel"),
        ("group_size", 16),
    ],
)
def test_an_int_pack_mlx_lm_would_misread_is_refused(tmp_path, setting, value):
    """compressed-tensors' `pack-quantized` in settings other than Kimi K2 Thinking's: mlx-lm's
    sanitize reads every pack as 4-bit codes minus 8 in groups, so 8-bit codes, zero points
    (`weight_zero_point`), a `weight_g_idx` order or per-channel scales were repacked into wrong
    weights, and groups of 16 refused as a damaged config.json. Refused by repack and plan, naming
    the setting, before anything is written."""
    src = write_hf_checkpoint(tmp_path / "src", tiny_config("kimi_k2"), pack="pack-quantized")
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"]["config_groups"]["group_0"]["weights"][setting] = value
    (src / "config.json").write_text(json.dumps(config))
    refusal = (
        r"quantization_config \(compressed-tensors 'pack-quantized'\) is not supported, as "
        r"mlx-lm reads its packs as symmetric 4-bit integers in groups MLX quantizes with, not "
        rf"with {setting} {value!r}; repack the bf16"
    )
    with pytest.raises(StreamerError, match=refusal):
        repack(src, tmp_path / "dst", log=lambda _: None)
    assert not (tmp_path / "dst").exists()
    with pytest.raises(StreamerError, match=refusal):
        model_plan(src / "config.json", memory=16 << 30, quantize=None, dtype=None)


def test_an_int4_pack_of_a_family_whose_sanitize_leaves_it_is_refused(tmp_path):
    """An int4 `pack-quantized` Qwen3 MoE (the w4a16 re-releases), which mlx-lm's qwen3_moe does
    not unpack: refused by plan (and pull) from config.json alone, which planned it, and by
    repack naming the packed tensor, which said a converted expert gave nothing."""
    src = write_hf_checkpoint(tmp_path / "src", tiny_config("qwen3_moe"), pack="pack-quantized")
    with pytest.raises(StreamerError, match=r"0\.gate_proj\.weight_packed' is left unread by"):
        repack(src, tmp_path / "dst", log=lambda _: None)
    assert not (tmp_path / "dst").exists()
    with pytest.raises(StreamerError, match=r"int4 packs \(`weight_packed`\), .*not for qwen3_moe"):
        model_plan(src / "config.json", memory=16 << 30, quantize=None, dtype=None)


def test_zero_points_sanitize_leaves_unread_are_refused(tmp_path, monkeypatch):
    """An int4 pack whose experts carry `weight_zero_point`s that config.json does not declare
    (symmetric): mlx-lm's sanitize leaves them as they are and its loader refuses them; repack
    copied the codes and scales without them, silently wrong. Refused before anything is
    written, naming the tensor."""
    pack = compressed_tensors.pack

    def with_zero_points(name, weight, fmt):
        zero_points = mx.ones((weight.shape[0], weight.shape[1] // 32), mx.int8)
        return [
            *pack(name, weight, fmt),
            (name.removesuffix("weight") + "weight_zero_point", zero_points),
        ]

    monkeypatch.setattr(compressed_tensors, "pack", with_zero_points)
    src = write_hf_checkpoint(tmp_path / "src", tiny_config("kimi_k2"), pack="pack-quantized")
    with pytest.raises(
        StreamerError,
        match=r"tensor 'model\.layers\.\d+\.mlp\.experts\.\d+\.\w+_proj\.weight_zero_point' is "
        "left unread by mlx-lm's sanitize, so mlx-lm cannot load",
    ):
        repack(src, tmp_path / "dst", log=lambda _: None)
    assert not (tmp_path / "dst").exists() and not list(tmp_path.glob(".dst*"))


def test_a_hadamard_pack_streams_as_mlx_lm_loads_it(tmp_path):
    """Prism's 2-bit Qwen3.5 packs: stacked MLX experts (copied byte for byte) beside
    Hadamard-rotated resident layers, repacked and in place."""
    src = write_hadamard_pack(tmp_path / "src")
    repack(src, tmp_path / "dst", log=lambda _: None)
    assert {
        q["bits"]
        for layer in read_manifest(tmp_path / "dst").layers
        for q in layer.quantization.values()
    } == {2}
    reference = reference_model(src)
    compare(tmp_path / "dst", reference, tolerance=0.0)
    compare(src, reference, tolerance=0.0)


def test_an_nvfp4_pack_is_refused_naming_its_format(tmp_path):
    """compressed-tensors' NVFP4 pack carries global scales no mlx-lm sanitize reads."""
    src = write_hf_checkpoint(tmp_path / "src", tiny_config("kimi_k3"), pack="mxfp4-pack-quantized")
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"]["format"] = "nvfp4-pack-quantized"
    (src / "config.json").write_text(json.dumps(config))
    with pytest.raises(StreamerError, match="compressed-tensors 'nvfp4-pack-quantized'.*not"):
        repack(src, tmp_path / "dst", log=lambda _: None)
    assert not (tmp_path / "dst").exists()


def test_a_quantization_mlx_lm_converts_but_streamer_does_not_is_refused(tmp_path):
    """GPTQ, which mlx-lm's loader converts and streamer does not: refused naming the method,
    without saying that mlx-lm cannot read it."""
    src = write_hf_checkpoint(tmp_path / "src", tiny_config("qwen3_moe"))
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 128}
    (src / "config.json").write_text(json.dumps(config))
    with pytest.raises(StreamerError) as refused:
        repack(src, tmp_path / "dst", log=lambda _: None)
    assert "quantization_config (gptq) is not supported; repack the bf16" in str(refused.value)
    assert not (tmp_path / "dst").exists()
    # plan of its config.json alone refuses it too, rather than planning it as unquantized
    with pytest.raises(StreamerError, match=r"quantization_config \(gptq\) is not supported"):
        model_plan(src / "config.json", memory=16 << 30, quantize=None, dtype=None)
    # and a load of the download, which said to repack it with --quantize 4 (refused as above)
    with pytest.raises(StreamerError) as refused:
        streamer.load(src)
    assert "quantization_config (gptq) is not supported" in str(refused.value)
    assert "--quantize 4" not in str(refused.value)


@pytest.mark.parametrize("model_type", ["deepseek_v3", "qwen3_moe"])
def test_modelopt_nvfp4_is_refused_where_mlx_lm_s_sanitize_leaves_its_scales(tmp_path, model_type):
    """NVIDIA's NVFP4 exports of other families (DeepSeek-R1-FP4, Qwen3-30B-A3B-FP4: ModelOpt's
    `weight_scale` and `weight_scale_2` per expert), which only Muse Spark's sanitize reads:
    refused from config.json, by plan too (as pull refuses before the weights). Repack read the
    packed bytes as the weight and failed on its shape, as if config.json were another model's."""
    src = write_hf_checkpoint(tmp_path / "src", tiny_config(model_type))
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "modelopt",
        "quant_algo": "NVFP4",
        "group_size": 16,
        "exclude_modules": ["lm_head"],
    }
    (src / "config.json").write_text(json.dumps(config))
    refusal = (
        r"quantization_config \(modelopt\) is not supported, as no sanitize of mlx-lm .* but "
        r"muse_spark's reads its `weight_scale` and `weight_scale_2`, so mlx-lm cannot load it"
    )
    with pytest.raises(StreamerError, match=refusal):
        repack(src, tmp_path / "dst", log=lambda _: None)
    assert not (tmp_path / "dst").exists()
    with pytest.raises(StreamerError, match=refusal):
        model_plan(src / "config.json", memory=16 << 30, quantize=None, dtype=None)


@pytest.mark.usefixtures("global_scales_on_cpu")
def test_muse_spark_nvfp4_streams_as_mlx_lm_loads_it(tmp_path):
    """Muse Spark's NVFP4 checkpoint (ModelOpt's format: the experts of every MoE layer but the
    first and the last in NVFP4 with a global scale each, those two bf16), repacked; and
    mlx_lm.convert's MLX form of it (stacked global scales), in place and repacked."""
    src = write_hf_checkpoint(tmp_path / "src", tiny_config("muse_spark"), pack=muse_spark.FORMAT)
    repack(src, tmp_path / "dst", log=lambda _: None)
    nvfp4 = {"group_size": 16, "bits": 4, "mode": "nvfp4", "global_scale": True}
    assert [layer.quantization for layer in read_manifest(tmp_path / "dst").layers] == [
        dict.fromkeys(("gate_proj", "up_proj", "down_proj"), q) for q in (None, nvfp4, nvfp4, None)
    ]
    compare(tmp_path / "dst", reference_model(src), tolerance=0.0)
    with contextlib.redirect_stdout(io.StringIO()):
        mlx_lm.convert(str(src), str(tmp_path / "mlx"))
    reference = reference_model(tmp_path / "mlx")
    compare(tmp_path / "mlx", reference, tolerance=0.0)
    repack(tmp_path / "mlx", tmp_path / "mlx-dst", log=lambda _: None)
    compare(tmp_path / "mlx-dst", reference, tolerance=0.0)


@pytest.mark.usefixtures("global_scales_on_cpu")
def test_nvfp4_quantization_in_hf_quant_config_json(tmp_path):
    """ModelOpt's exports may keep their quantization in hf_quant_config.json instead of
    config.json: read there, as mlx-lm's loader reads it."""
    src = write_hf_checkpoint(tmp_path / "src", tiny_config("muse_spark"), pack=muse_spark.FORMAT)
    config = json.loads((src / "config.json").read_text())
    del config["quantization_config"]
    (src / "config.json").write_text(json.dumps(config))
    (src / "hf_quant_config.json").write_text(json.dumps(muse_spark.hf_quant_config(config)))
    repack(src, tmp_path / "dst", log=lambda _: None)
    modes = [layer.quantization["gate_proj"] for layer in read_manifest(tmp_path / "dst").layers]
    assert [q and q["mode"] for q in modes] == [None, "nvfp4", "nvfp4", None]
    compare(tmp_path / "dst", reference_model(src), tolerance=0.0)
