"""What the MoE families need beyond the common parity tests (test_parity.py runs every family in
both conventions): mixed per-module bits, dense layers between MoE layers, fused HF expert tensors,
FP8 downloads."""

from __future__ import annotations

import contextlib
import io
import json

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from conftest import reference_model
from repack_checks import assert_same_model
from test_parity import compare

import streamer
from fixtures import TINY_CONFIGS, VOCAB_SIZE, tiny_config, write_hf_checkpoint
from streamer.errors import StreamerError
from streamer.families.architectures import build_model
from streamer.families.model_types import mlx_lm_model_type
from streamer.families.transformers.spellings import normalize_config
from streamer.io.checkpoint import Checkpoint
from streamer.io.manifest import read_manifest
from streamer.plan.model import model_plan
from streamer.repack import Quantize, repack


def test_every_tiny_config_is_its_family_at_the_tokenizer_s_vocabulary():
    for model_type, config in TINY_CONFIGS.items():
        # named by its model_type, or by the mlx-lm file it runs on (Ling 2.5's bailing_hybrid
        # with BailingMoeV3ForCausalLM runs on bailing_moe_v3)
        assert model_type in (config["model_type"], mlx_lm_model_type(config))
        text = config.get("text_config", config)
        assert text.get("vocab_size", text.get("num_vocab")) == VOCAB_SIZE  # the tokenizer's


def test_mixed_bits_per_module(checkpoints):
    """mlx-lm's mixed recipes record per-module bits in config.json; each layer streams with its
    own."""
    src = checkpoints.mlx("deepseek_v3", recipe="mixed_3_6")
    folder = checkpoints.repacked(src)
    bits = [
        {p: q["bits"] for p, q in layer.quantization.items()}
        for layer in read_manifest(folder).layers
    ]
    assert bits == [
        {"gate_proj": 3, "up_proj": 3, "down_proj": 3},
        {"gate_proj": 3, "up_proj": 3, "down_proj": 6},
    ]
    reference = reference_model(src)
    compare(folder, reference, tolerance=0.0)
    compare(src, reference, tolerance=0.0)  # in place: each layer's own bits from config.json


def test_mixed_recipe_without_a_group_size(checkpoints):
    """`mlx_lm.convert --quant-predicate mixed_2_6` without --q-group-size (its default) writes
    every per-module entry with group_size null, which MLX reads as 64: refused before as a
    damaged config.json."""
    src = checkpoints.mlx("qwen3_moe", recipe="mixed_2_6", group_size=None)
    entries = json.loads((src / "config.json").read_text())["quantization"]
    assert entries["model.embed_tokens"]["group_size"] is None
    reference = reference_model(src)
    compare(checkpoints.repacked(src), reference, tolerance=0.0)
    compare(src, reference, tolerance=0.0)  # in place


def test_experts_in_other_modes_than_the_default(checkpoints, tmp_path):
    """A quant_predicate that saves experts in MX/NV-FP modes (no zero points) under an affine
    default, each named in config.json: refused before as a checkpoint mlx-lm cannot load."""
    modes = {
        "down_proj": {"group_size": 32, "bits": 8, "mode": "mxfp8"},
        "gate_proj": {"group_size": 16, "bits": 4, "mode": "nvfp4"},
        "up_proj": {"group_size": 32, "bits": 4, "mode": "mxfp4"},
    }

    def predicate(path, module):
        proj = path.rsplit(".", 1)[-1]
        return modes[proj] if "switch_mlp" in path and ".1." in path else True

    src = tmp_path / "mlx"
    with contextlib.redirect_stdout(io.StringIO()):
        mlx_lm.convert(
            str(checkpoints.hf("qwen3_moe")), str(src), quantize=True, quant_predicate=predicate
        )
    folder = tmp_path / "repacked"
    repack(src, folder, log=lambda _: None)
    layers = read_manifest(folder).layers
    assert [q["mode"] for q in layers[1].quantization.values()] == ["nvfp4", "mxfp4", "mxfp8"]
    assert {q["mode"] for q in layers[0].quantization.values()} == {"affine"}
    reference = reference_model(src)
    compare(folder, reference, tolerance=0.0)
    compare(src, reference, tolerance=0.0)  # in place


def test_dense_layers_between_moe_layers(tmp_path):
    config = tiny_config(
        "qwen3_moe", num_hidden_layers=6, decoder_sparse_step=2, mlp_only_layers=[3]
    )
    src = write_hf_checkpoint(tmp_path / "src", config)
    folder = tmp_path / "out"
    repack(src, folder, log=lambda _: None)
    assert [layer.module for layer in read_manifest(folder).layers] == [
        "model.layers.1.mlp.switch_mlp",
        "model.layers.5.mlp.switch_mlp",
    ]
    compare(folder, reference_model(src), tolerance=1e-4)


@pytest.mark.parametrize("arch", ["gpt_oss", "qwen3_5_moe", "dbrx"])
def test_fused_hf_experts_become_what_mlx_lm_sanitize_makes(checkpoints, arch):
    """Each expert record holds exactly that expert's slice of mlx-lm's sanitized stacked
    tensors."""
    src = checkpoints.hf(arch)
    folder = checkpoints.repacked(src)
    with Checkpoint(src) as ckpt:
        model = build_model(normalize_config(ckpt.config), src)
        sanitized = model.sanitize({name: ckpt.lazy(name) for name in ckpt.tensors})
    for layer in read_manifest(folder).layers:
        data = (folder / layer.file).read_bytes()
        for tensor in layer.tensors:
            stacked = sanitized[f"{layer.module}.{tensor.name}"]
            for e, offset in enumerate(layer.expert_offsets):
                start = offset + tensor.offset
                expected = bytes(memoryview(mx.contiguous(stacked[e])).cast("B"))
                assert data[start : start + tensor.nbytes] == expected, (
                    layer.module,
                    tensor.name,
                    e,
                )


@pytest.mark.parametrize(
    "arch", ["deepseek_v3", "kimi_k2", "kimi_k25", "deepseek_v32", "minimax", "mimo_v2_flash"]
)
def test_fp8_download_is_dequantized_as_mlx_lm_does(tmp_path, arch):
    """The official DeepSeek / Kimi / MiniMax-M2 / MiMo-V2-Flash checkpoints: FP8 weights with
    128x128 block scales (experts included); Kimi K2.5's under `language_model.`."""
    src = write_hf_checkpoint(tmp_path / "src", tiny_config(arch), fp8=True)
    repack(src, tmp_path / "bf16", log=lambda _: None)
    compare(tmp_path / "bf16", reference_model(src), tolerance=1e-4)
    with contextlib.redirect_stdout(io.StringIO()):
        mlx_lm.convert(str(src), str(tmp_path / "mlx"), quantize=True, q_bits=4, q_group_size=64)
    repack(src, tmp_path / "q4", quantize=Quantize(4, 64), log=lambda _: None)
    compare(tmp_path / "q4", reference_model(tmp_path / "mlx"), tolerance=0.0)


def test_fp8_experts_are_the_published_formula_bit_for_bit(tmp_path):
    """Each repacked expert is its E4M3 values times its 128x128 block's float32 scale, rounded
    once to bf16 (transformers' Fp8Dequantize), with partial blocks at the edges (200 rows)."""
    config = tiny_config("deepseek_v3", moe_intermediate_size=200)
    src = write_hf_checkpoint(tmp_path / "src", config, fp8=True)
    repack(src, tmp_path / "bf16", log=lambda _: None)
    with Checkpoint(src) as ckpt:
        for layer in read_manifest(tmp_path / "bf16").layers:
            data = (tmp_path / "bf16" / layer.file).read_bytes()
            source = layer.module.replace("switch_mlp", "experts")
            for e, offset in enumerate(layer.expert_offsets):
                for tensor in layer.tensors:
                    name = f"{source}.{e}.{tensor.name}"
                    codes = np.array(ckpt.lazy(name))
                    scales = np.array(ckpt.lazy(f"{name}_scale_inv"))
                    blocks = scales.repeat(128, 0)[: codes.shape[0]].repeat(128, 1)
                    expected = bf16_bits(e4m3(codes) * blocks[:, : codes.shape[1]])
                    start = offset + tensor.offset
                    got = np.frombuffer(data[start : start + tensor.nbytes], np.uint16)
                    assert np.array_equal(got, expected.ravel()), name


def e4m3(codes: np.ndarray) -> np.ndarray:
    """float32 values of E4M3 (fn) bytes: bias 7, subnormals below exponent 1, NaN at S.1111.111."""
    exponent, mantissa = (codes >> 3) & 15, (codes & 7) / np.float32(8)
    value = np.where(exponent == 0, mantissa * 2.0**-6, (1 + mantissa) * 2.0 ** (exponent - 7.0))
    value = np.where((exponent == 15) & (mantissa == 7 / 8), np.nan, value)
    return np.where(codes >> 7, -value, value).astype(np.float32)


def bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bf16 bits, rounded to nearest even (finite values)."""
    bits = values.astype(np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def test_fp8_with_a_null_block_size_is_dequantized_as_without_one(tmp_path):
    """`weight_block_size: null` was a TypeError traceback; mlx-lm's sanitize reads no size."""
    config = tiny_config("deepseek_v3")
    src = write_hf_checkpoint(tmp_path / "src", config, fp8=True)
    repack(src, tmp_path / "absent", log=lambda _: None)
    config_file = src / "config.json"
    written = json.loads(config_file.read_text())
    written["quantization_config"]["weight_block_size"] = None
    config_file.write_text(json.dumps(written))
    repack(src, tmp_path / "null", log=lambda _: None)
    assert_same_model(tmp_path / "null", tmp_path / "absent")


def test_per_tensor_fp8_is_refused_where_mlx_lm_reads_block_scales_only(tmp_path):
    """One scale for each tensor (null weight_block_size, scales of shape (1,)): DeepSeek's
    sanitize failed on them ("Too many indices") and repack said to download the model again.
    Refused naming the format by repack and plan from the headers, by plan from config.json
    alone and by pull before the weights, with nothing written."""
    from streamer.io.safetensors import write_safetensors
    from streamer.pulled_files import refuse_unstreamable

    src = write_hf_checkpoint(tmp_path / "src", tiny_config("deepseek_v3"), fp8=True)
    with Checkpoint(src) as ckpt:
        fp8 = {n: i.dtype for n, i in ckpt.tensors.items() if i.dtype.startswith("F8")}
    for shard in src.glob("*.safetensors"):
        tensors = mx.load(str(shard))
        tensors = {n: mx.ones((1,)) if n.endswith("_scale_inv") else t for n, t in tensors.items()}
        mx.eval(tensors)  # read before the shard is written over
        write_safetensors(shard, list(tensors.items()), {"format": "pt"}, fp8)
    refusal = r"per-tensor FP8 .*deepseek_v3 cannot dequantize .*block-FP8 release"
    with pytest.raises(StreamerError, match=refusal):  # the headers: config.json names blocks
        repack(src, tmp_path / "out", log=lambda _: None)
    assert not (tmp_path / "out").exists()
    with pytest.raises(StreamerError, match=refusal):
        model_plan(src, memory=16 << 30, quantize=None, dtype=None)
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"]["weight_block_size"] = None
    alone = tmp_path / "alone" / "config.json"
    alone.parent.mkdir()
    alone.write_text(json.dumps(config))
    with pytest.raises(StreamerError, match=refusal):
        model_plan(alone, memory=16 << 30, quantize=None, dtype=None)
    with pytest.raises(StreamerError, match=refusal + ".*nothing but org/m's small files"):
        refuse_unstreamable("org/m", alone)


def test_fp8_in_blocks_other_than_128_is_refused(tmp_path):
    """FP8 in 64x64 blocks: mlx-lm's sanitizes take every scale for a 128x128 block's, so repack
    failed saying to download the model again (and plan accepted it). Refused by both, naming
    the block size, before anything is written."""
    config = tiny_config("deepseek_v3")
    src = write_hf_checkpoint(tmp_path / "src", config, fp8=True, fp8_block=(64, 64))
    refusal = (
        r"quantization_config \(fp8\) is not supported, as mlx-lm dequantizes FP8 in 128x128 "
        r"blocks .*not weight_block_size \[64, 64\]; repack the bf16"
    )
    with pytest.raises(StreamerError, match=refusal):
        repack(src, tmp_path / "out", log=lambda _: None)
    assert not (tmp_path / "out").exists()
    with pytest.raises(StreamerError, match=refusal):
        model_plan(src / "config.json", memory=16 << 30, quantize=None, dtype=None)


def test_fp8_is_refused_where_mlx_lm_does_not_dequantize_it(tmp_path):
    """By repack from the tensors, by plan from config.json alone (it planned the model), and by
    a load of the download (it said to repack it with --quantize 4, which repack refuses)."""
    src = write_hf_checkpoint(tmp_path / "src", tiny_config("qwen3_moe"), fp8=True)
    with pytest.raises(StreamerError, match="FP8 weights.*not for qwen3_moe"):
        repack(src, tmp_path / "out", log=lambda _: None)
    assert not (tmp_path / "out").exists()
    with pytest.raises(StreamerError, match="FP8 weights.*not for qwen3_moe"):
        model_plan(src / "config.json", memory=16 << 30, quantize=None, dtype=None)
    with pytest.raises(StreamerError, match="FP8 weights.*not for qwen3_moe"):
        streamer.load(src)


def test_dbrx_as_published_loads_its_tokenizer(tmp_path):
    """DBRX's own config.json writes moe_normalize_expert_weights as the integer 1, which
    transformers 5's strict DbrxConfig refuses while the tokenizer loads: the repacked
    config.json holds it as a float, and the model loads and generates."""
    import streamer

    config = tiny_config("dbrx")
    config["ffn_config"]["moe_normalize_expert_weights"] = 1
    src = write_hf_checkpoint(tmp_path / "src", config)
    repack(src, tmp_path / "dst", log=lambda _: None)
    model, tokenizer = streamer.load(tmp_path / "dst")
    assert model.streamer.manifest.config["ffn_config"]["moe_normalize_expert_weights"] == 1.0
    assert streamer.generate(model, tokenizer, "hello", max_tokens=2)


def test_muse_spark_is_refused_where_its_metal_kernels_do_not_run(checkpoints, monkeypatch):
    """mlx-lm's Muse Spark computes with Metal kernels only: off Apple silicon (conftest gives the
    other tests stand-ins) a repacked folder and a download in place are refused at load, and its
    plan, which runs the model lazily, too (of a download's folder it was MLX's traceback); the
    repack itself needs no kernel."""
    from mlx_lm import kernels
    from mlx_lm.models import muse_spark

    import streamer
    from streamer.plan import plan

    if mx.metal.is_available():
        pytest.skip("Metal runs mlx-lm's kernels")
    for name in kernels.__all__:
        monkeypatch.setattr(muse_spark, name, getattr(kernels, name))
    refused = "muse_spark model computes with Metal kernels .*stream it on a Mac"
    for folder in (
        checkpoints.repacked(checkpoints.hf("muse_spark")),
        checkpoints.mlx("muse_spark"),
    ):
        with pytest.raises(StreamerError, match=refused):
            streamer.load(folder, memory_budget=0)
    for source in (checkpoints.hf("muse_spark") / "config.json", checkpoints.hf("muse_spark")):
        with pytest.raises(StreamerError, match=refused):
            plan(source, 1 << 34)
