"""The repacked layout: page-aligned contiguous experts, checksums, a manifest that round-trips."""

from __future__ import annotations

import json
import zlib

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

import streamer
from fixtures import tiny_config, write_hf_checkpoint
from streamer.io.checkpoint import Checkpoint
from streamer.io.manifest import RECORD_ALIGN, read_manifest, write_manifest


def test_experts_are_page_aligned_contiguous_records(checkpoints):
    folder = checkpoints.repacked(checkpoints.mlx("qwen3_moe"))
    manifest = read_manifest(folder)
    assert len(manifest.layers) == 2
    for layer in manifest.layers:
        assert (folder / layer.file).stat().st_size == layer.num_experts * layer.record_bytes
        assert layer.record_bytes % RECORD_ALIGN == 0
        assert all(off % RECORD_ALIGN == 0 for off in layer.expert_offsets)
        assert len(set(layer.expert_offsets)) == layer.num_experts
        spans = sorted((t.offset, t.offset + t.nbytes) for t in layer.tensors)
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))
        assert spans[-1][1] <= layer.record_bytes
        # one expert = one record, holding gate/up/down weights, scales and biases
        assert [t.name for t in layer.tensors] == [
            f"{p}.{k}"
            for p in ("gate_proj", "up_proj", "down_proj")
            for k in ("weight", "scales", "biases")
        ]


def test_checksums_match_file_bytes(checkpoints):
    folder = checkpoints.repacked(checkpoints.hf("olmoe"))
    manifest = read_manifest(folder)
    for layer in manifest.layers:
        data = (folder / layer.file).read_bytes()
        for offset, crcs in zip(layer.expert_offsets, layer.expert_crc32):
            for tensor, crc in zip(layer.tensors, crcs):
                start = offset + tensor.offset
                assert zlib.crc32(data[start : start + tensor.nbytes]) == crc
    resident = mx.load(str(folder / "resident.safetensors"))
    assert set(resident) == set(manifest.resident_crc32)


def test_mlx_checkpoint_experts_are_copied_byte_for_byte(checkpoints):
    src = checkpoints.mlx("mixtral")
    folder = checkpoints.repacked(src)
    manifest = read_manifest(folder)
    with Checkpoint(src) as ckpt:
        for layer in manifest.layers:
            data = (folder / layer.file).read_bytes()
            for tensor in layer.tensors:
                info = ckpt.tensors[f"{layer.module}.{tensor.name}"]
                stacked = ckpt.read(info)
                for e, offset in enumerate(layer.expert_offsets):
                    start = offset + tensor.offset
                    assert (
                        data[start : start + tensor.nbytes]
                        == stacked[e * tensor.nbytes : (e + 1) * tensor.nbytes]
                    )


def test_manifest_round_trip(checkpoints, tmp_path):
    folder = checkpoints.repacked(checkpoints.hf("qwen2_moe"))
    manifest = read_manifest(folder)
    write_manifest(tmp_path, manifest)
    assert read_manifest(tmp_path) == manifest
    raw = json.loads((folder / "manifest.json").read_text())
    assert raw["format_version"] == 1 and raw["page_size"] == RECORD_ALIGN
    assert raw["config"]["model_type"] == "qwen2_moe"


def test_side_files_are_carried_over(checkpoints):
    folder = checkpoints.repacked(checkpoints.hf("qwen3_moe"))
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        assert (folder / name).exists()
    assert not list(folder.glob("model*.safetensors"))


def test_loaded_model_keeps_only_non_expert_weights_resident(tmp_path):
    # experts dominate this model (64 experts per layer), as they do in real MoE checkpoints
    config = tiny_config(
        "qwen3_moe", num_experts=64, num_hidden_layers=4, moe_intermediate_size=256
    )
    src = write_hf_checkpoint(tmp_path / "src", config, shard_bytes=64 << 20)
    streamer.repack.repack(src, tmp_path / "dst", log=lambda _: None)
    manifest = read_manifest(tmp_path / "dst")
    before = mx.get_active_memory()
    model, _ = streamer.load(tmp_path / "dst", memory_budget=0)
    mapped = model.streamer.mapped_mlx_bytes  # MLX counts the mapped expert files as its own
    loaded = mx.get_active_memory() - before - mapped
    resident = sum(a.nbytes for _, a in tree_flatten(model.parameters()))
    expert_bytes_f32 = manifest.expert_file_bytes * 2  # bf16 on disk, float32 once computed on CPU
    assert resident < expert_bytes_f32 / 10
    assert loaded <= resident * 1.1 + (1 << 20)
    # routed experts are read per call and not kept
    tokens = mx.array([[1, 2, 3, 4, 5, 6, 7, 8]])
    mx.eval(model(tokens))
    assert mx.get_active_memory() - before - mapped < resident + expert_bytes_f32 / 4
    assert np.isfinite(np.array(model(tokens))).all()
