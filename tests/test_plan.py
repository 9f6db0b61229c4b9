"""`streamer plan` against what repack writes and what generation allocates."""

from __future__ import annotations

import contextlib
import io
import json

import mlx.core as mx
import mlx_lm
import pytest
from mlx_lm.models.cache import make_prompt_cache

import streamer
from fixtures import TINY_CONFIGS, tiny_config, write_hf_checkpoint
from streamer.cli import main
from streamer.errors import StreamerError
from streamer.families.architectures import build_model
from streamer.families.config import experts_per_token
from streamer.families.transformers.spellings import normalize_config
from streamer.io.manifest import read_manifest
from streamer.io.sizes import size_text
from streamer.plan import plan
from streamer.plan.model import _kv_bytes, model_plan
from streamer.plan.repacked import KV_LAYOUT, kv_bytes_per_token, repacked_plan
from streamer.repack import Quantize, repack

GB = 1 << 30


@pytest.mark.parametrize("arch", ["qwen3_moe", "gpt_oss"])
def test_the_plan_of_a_download_is_what_repack_writes(checkpoints, arch):
    src = checkpoints.hf(arch)
    dst = checkpoints.repacked(src)
    before, after = plan(src, 16 * GB), plan(dst, 16 * GB)
    manifest = read_manifest(dst)
    assert before.expert_bytes == after.expert_bytes == manifest.expert_file_bytes
    top_k = manifest.config["num_experts_per_tok"]
    assert before.expert_bytes_per_token == top_k * sum(x.record_bytes for x in manifest.layers)
    # the resident file adds only its safetensors header to the weights
    assert 0 <= after.resident_bytes - before.resident_bytes < 64 << 10
    assert (before.download_bytes, after.download_bytes) == (
        before.download_bytes,
        None,
    ) and before.download_bytes > 0
    assert plan(src / "config.json", 16 * GB).expert_bytes == before.expert_bytes


@pytest.mark.parametrize("quantize", [None, (4, 64)])
def test_gpt_oss_s_mxfp4_config_json_is_planned_as_its_download(checkpoints, quantize):
    """gpt-oss's published config.json (quant_method mxfp4, its attention, router, embedding and
    head in modules_to_not_convert) planned alone had every layer quantized in MXFP4: 7x too few
    resident bytes (1.05 GiB for gpt-oss-120b, whose repack holds 7.93 GiB), --quantize ignored."""
    src = checkpoints.hf("gpt_oss")
    alone = plan(src / "config.json", GB, quantize=quantize)
    download = plan(src, GB, quantize=quantize)
    assert alone.resident_bytes == download.resident_bytes
    assert alone.disk_bytes == download.disk_bytes


def test_quantized_plans_match_quantized_repacks(checkpoints):
    src = checkpoints.hf("qwen3_moe")
    quantized = checkpoints.repacked(src, quantize=streamer.repack.Quantize(4))
    want = read_manifest(quantized).expert_file_bytes
    assert plan(src, GB, quantize=(4, 64)).expert_bytes == want
    for q in ((4, 16, "nvfp4"), (8, 32, "mxfp8")):  # and with --q-mode, from the download or
        want = read_manifest(checkpoints.repacked(src, quantize=Quantize(*q))).expert_file_bytes
        assert plan(src, GB, quantize=q).expert_bytes == want  # from its config.json alone
        assert plan(src / "config.json", GB, quantize=q).expert_bytes == want
    mlx = checkpoints.mlx("qwen3_moe")  # an mlx_lm.convert download: config.json says how
    want = read_manifest(checkpoints.repacked(mlx)).expert_file_bytes
    assert plan(mlx, GB).expert_bytes == want
    with pytest.raises(StreamerError, match="repacked already"):
        plan(quantized, GB, quantize=(4, 64))


def test_the_plan_of_a_config_json_leaves_unquantized_what_mlx_lm_convert_does(tmp_path):
    """Experts 40 wide: mlx_lm.convert leaves their down_proj unquantized at group size 64. Planned
    from the MLX download's config.json alone, that was refused as a damaged config (MLX's
    group-size error); from the HF one with --quantize at a group size the router cannot take
    (width 96, group 32: qwen3_moe's router at 64), a traceback."""
    config = tiny_config("qwen3_moe", moe_intermediate_size=40, num_experts=4, num_hidden_layers=1)
    src = write_hf_checkpoint(tmp_path / "src", config)
    mlx = tmp_path / "mlx"
    with contextlib.redirect_stdout(io.StringIO()):
        mlx_lm.convert(str(src), str(mlx), quantize=True)
    want = repack(mlx, tmp_path / "out", log=lambda _: None).expert_file_bytes
    assert plan(mlx, GB).expert_bytes == plan(mlx / "config.json", GB).expert_bytes == want
    assert plan(src / "config.json", GB, quantize=(4, 64)).expert_bytes == want
    wide = write_hf_checkpoint(tmp_path / "wide", {**config, "hidden_size": 96})
    with pytest.raises(StreamerError, match="mlx_lm.convert fails alike"):
        plan(wide / "config.json", GB, quantize=(4, 32))


@pytest.mark.parametrize("arch", ["kimi_k3", "bailing_moe_v3", "bailing_hybrid"])
def test_the_plan_of_a_config_json_leaves_unquantized_what_the_model_s_recipe_does(
    checkpoints, arch
):
    """mlx_lm.convert keeps the layers its model's quant_predicate refuses unquantized, and
    config.json does not say so: planned from it alone, Kimi K3's attention residual projections
    were quantized and its forward pass failed (MLX's traceback), Ling's MLA projections counted
    at 4 bits (its resident bytes 43% short)."""
    mlx = checkpoints.mlx(arch)
    download, alone = plan(mlx, GB), plan(mlx / "config.json", GB)
    assert (alone.resident_bytes, alone.expert_bytes) == (
        download.resident_bytes,
        download.expert_bytes,
    )


@pytest.mark.parametrize(
    "arch, pack",
    [("gpt_oss", None), ("kimi_k2", "pack-quantized"), ("kimi_k25", "pack-quantized")],
)
def test_the_plan_of_a_config_json_leaves_unquantized_what_its_quantization_config_does(
    tmp_path, arch, pack
):
    """gpt-oss's MXFP4 and Kimi's compressed-tensors packs quantize the routed experts alone,
    their quantization_config listing the modules left out (`modules_to_not_convert`, `ignore`):
    planned from config.json alone, every layer was taken as quantized, the resident weights
    counted 3-4 times short."""
    src = write_hf_checkpoint(tmp_path / "src", tiny_config(arch), pack=pack)
    download, alone = plan(src, GB), plan(src / "config.json", GB)
    assert (alone.resident_bytes, alone.expert_bytes) == (
        download.resident_bytes,
        download.expert_bytes,
    )


def test_kv_bytes_and_context_from_mlx_lm_caches(checkpoints):
    dst = checkpoints.repacked(checkpoints.hf("qwen3_moe"))
    model, tokenizer = streamer.load(dst)
    cache = make_prompt_cache(model)
    model(mx.zeros((1, 1024), dtype=mx.int32), cache=cache)
    measured = sum(c.nbytes for c in cache)  # float32 on this CPU, 1024 tokens
    result = plan(dst, 16 * GB, dtype=mx.float32)
    assert result.kv_bytes_per_1k_tokens * 1024 == measured * 1000
    memory = result.resident_bytes + 100 * result.kv_bytes_per_1k_tokens // 1000
    small = plan(dst, memory, dtype=mx.float32)
    assert small.longest_context in range(99, 102) and not small.runs
    assert result.longest_context == result.context_length and result.runs


def test_cli_plan_text_and_json(checkpoints, capsys):
    src = checkpoints.hf("qwen3_moe")
    assert main(["plan", str(src), "--memory", "16G"]) == 0
    text = capsys.readouterr().out
    assert "repack disk" in text and "runs               yes" in text
    assert main(["plan", str(src), "--json", "--memory", "1K"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["runs"] is False and report["memory_bytes"] == 1024
    assert main(["plan", str(src / "nothing.json")]) == 2
    assert "is not a folder" in capsys.readouterr().err


def _text_model_type(config: dict) -> str:
    return (config.get("text_config") or config).get("model_type", config["model_type"])


def test_kv_from_the_config_is_what_mlx_lm_caches():
    """Every family planned without mlx-lm: its config's KV bytes per token are those of mlx-lm's
    own caches, with no fixed state; each KV_LAYOUT entry has a family that checks it."""
    checked = set()
    for arch, config in TINY_CONFIGS.items():
        if _text_model_type(config) not in KV_LAYOUT:
            continue
        model = build_model(normalize_config(config), arch)
        assert _kv_bytes(model, mx.float32) == (kv_bytes_per_token(config, 4), 0), arch
        checked.add(_text_model_type(config))
    assert checked == set(KV_LAYOUT)


def test_experts_per_token_under_every_name():
    want = {
        "qwen3_vl_moe": 4,
        "hunyuan": 2,
        "gemma4": 4,
        "ernie4_5_moe": 4,
        "step3p5": 4,
        "dbrx": 4,
    }
    assert {arch: experts_per_token(TINY_CONFIGS[arch]) for arch in want} == want


@pytest.mark.parametrize("arch", ["qwen3_moe", "deepseek_v3"])
def test_a_repacked_folder_is_planned_from_its_files_as_from_its_model(checkpoints, arch):
    src = checkpoints.hf(arch)
    for folder in (checkpoints.repacked(src), checkpoints.repacked(checkpoints.mlx(arch))):
        for dtype in (None, mx.float32):
            fast = repacked_plan(folder, 16 * GB, dtype)
            assert fast == model_plan(folder, 16 * GB, None, dtype), (folder, dtype)
            assert fast.experts_per_token == 4 and fast.expert_bytes_per_token > 0
    assert repacked_plan(checkpoints.repacked(checkpoints.hf("gpt_oss")), GB, None) is None


def test_plan_says_what_streaming_a_download_in_place_costs(checkpoints, capsys):
    """An MLX download streams without a repack: plan says so, with its ranges per expert (one
    per tensor of the record: 9 for affine gate/up/down) and what they cost per read path; a
    bf16 download, a planned --quantize and a repacked folder have no such line, nor gpt-oss's
    MXFP4 download, which generate refuses to stream in place (it is repacked first): plan said
    "in place  yes, 9 ranges an expert" for it."""
    mlx_download = checkpoints.mlx("qwen3_moe")
    assert main(["plan", str(mlx_download)]) == 0
    line = [x for x in capsys.readouterr().out.splitlines() if x.startswith("in place")]
    assert line == [
        "in place           yes, 9 ranges an expert: as fast as a repack on the slot path "
        "(Metal, CUDA); +0.18 ms a synced layer call on the mapped path (CPU; a repack reads 1)"
    ]
    for words in (
        [str(checkpoints.hf("qwen3_moe"))],
        [str(checkpoints.hf("qwen3_moe")), "--quantize", "4"],
        [str(checkpoints.repacked(mlx_download))],
        [str(checkpoints.hf("gpt_oss"))],
    ):
        assert main(["plan", *words]) == 0
        assert "in place" not in capsys.readouterr().out, words


def test_a_download_s_layers_are_planned_in_the_dtype_repack_writes(tmp_path):
    """float32 tensors under torch_dtype bfloat16: repack keeps the experts float32, but plan
    sized each layer's experts in memory as bfloat16 (the slot path's budget half of a load's)."""
    src = write_hf_checkpoint(tmp_path / "src", tiny_config("qwen3_moe"), dtype="float32")
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "torch_dtype": "bfloat16"}))
    repack(src, tmp_path / "dst", log=lambda _: None)
    assert {t.dtype for x in read_manifest(tmp_path / "dst").layers for t in x.tensors} == {"F32"}
    before, after = plan(src, 1 << 20), plan(tmp_path / "dst", 1 << 20)  # a pool of few slots
    assert before.plans["slots"].classes == after.plans["slots"].classes
    assert before.plans["slots"].classes[0].slot_bytes == 3 * 64 * 128 * 4


def test_plan_s_expert_figures_agree_and_name_their_layout(checkpoints, capsys):
    """plan said "experts 512.00 KiB (streamed from disk)", a repack's page-padded records, beside
    residency lines of 480.00 KiB (the tensors in memory), and for an MLX download streamed in
    place the repack's figure alone where `info` said 432.00 KiB."""
    from streamer.io.safetensors import read_header

    mlx = checkpoints.mlx("qwen3_moe")
    repacked = checkpoints.repacked(mlx)
    download, folder = plan(mlx, 8 * GB, dtype=mx.float32), plan(repacked, 8 * GB, dtype=mx.float32)
    header = read_header(mlx / "model.safetensors")
    stored = sum(t.nbytes for name, t in header.items() if ".switch_mlp." in name)
    assert download.in_place_expert_bytes == stored and folder.in_place_expert_bytes is None
    assert download.expert_bytes == folder.expert_bytes  # the records repack writes
    memory = {p.expert_memory_bytes for p in (download, folder)}
    memory |= {r.expert_bytes for p in (download, folder) for r in p.plans.values()}
    assert len(memory) == 1, memory  # one figure in memory, whichever layout
    for source in (mlx, repacked):
        assert main(["plan", str(source), "--memory", "8G"]) == 0
        lines = capsys.readouterr().out.splitlines()
        experts = next(line for line in lines if line.startswith("experts   ") and "disk" in line)
        in_memory = size_text(folder.expert_memory_bytes)
        assert "repacked" in experts and f"{in_memory} in memory" in experts
        assert ("in place" in experts) == (source == mlx), experts
        assert all(in_memory in line for line in lines if line.startswith("residency"))
