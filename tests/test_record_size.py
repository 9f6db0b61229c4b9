"""A record's size from the tensor headers and --quantize (records.record_bytes, what `streamer
plan` and the disk check use) is the size of the record repack writes, byte for byte, tensor by
tensor, for each source convention and quantization mode; and planning a download reads no tensor
data and parses each shard's header once."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os

import mlx.core as mx
import mlx_lm
import pytest
from mlx.utils import tree_flatten

from fixtures import TINY_CONFIGS, tiny_config, write_hf_checkpoint
from streamer.families.architectures import (
    SwitchLinear,
    build_model,
    quantize_like_mlx_lm,
    quantize_like_mlx_lm_convert,
)
from streamer.families.config import check_config
from streamer.families.transformers.spellings import normalize_config
from streamer.io import checkpoint as checkpoint_module
from streamer.io.checkpoint import Checkpoint
from streamer.io.checkpoint import _is_file_name as is_file_name
from streamer.io.manifest import read_manifest
from streamer.io.safetensors import read_header, write_safetensors
from streamer.plan import plan
from streamer.repack import Quantize, disk_needed, disk_needs, repack
from streamer.repack.recipe import make_recipe
from streamer.repack.records import (
    NonfiniteWarnings,
    expert_parts,
    layer_bytes,
    layout,
    matches_recipe,
    write_layer,
)
from streamer.repack.resume_sidecar import ResumeSidecar, SourceIdentity

QUANTIZE = {
    "none": None,
    "affine-4-64": Quantize(4, 64),
    "affine-3-32": Quantize(3, 32),
    "affine-8-128": Quantize(8, 128),
    "mxfp4": Quantize(4, 32, "mxfp4"),
    "nvfp4": Quantize(4, 16, "nvfp4"),
    "mxfp8": Quantize(8, 32, "mxfp8"),
}
# (family, dtype, FP8 with 128x128 block scales): each a way experts are published
SOURCES = {
    "qwen3_moe": ("qwen3_moe", "bfloat16", False),  # per-expert tensors
    "mixtral-float32": ("mixtral", "float32", False),
    "qwen3_5_moe": ("qwen3_5_moe", "bfloat16", False),  # fused gate_up_proj
    "llama4": ("llama4", "bfloat16", False),  # fused and transposed
    "dbrx": ("dbrx", "bfloat16", False),  # each expert's rows of one tensor
    "granitemoe": ("granitemoe", "float16", False),  # input_linear
    "gpt_oss": ("gpt_oss", "bfloat16", False),  # biases; MXFP4 as published kept as it is
    "deepseek_v3-fp8": ("deepseek_v3", "bfloat16", True),  # FP8 dequantized by sanitize
}
# experts published packed (compressed-tensors' int4 and FP4, DeepSeek-V4.1's FP4 with FP8)
PACKED = [
    ("kimi_k3", "mxfp4-pack-quantized"),
    ("kimi_k2", "pack-quantized"),
    ("deepseek_v41", "ue8m0"),
]


QUIET = NonfiniteWarnings(lambda _: None)


def _refused(*args, **kwargs):
    raise AssertionError("a tensor's data was read")


def _check_sized_as_written(src, quantize, out) -> None:
    """Every MoE layer's record, sized without reading, is the record write_layer writes."""
    with Checkpoint(src) as ckpt:
        recipe = make_recipe(ckpt, quantize)
        (out / "experts").mkdir(parents=True)
        for index, (module, container) in enumerate(recipe.containers.items()):
            sized = layout(expert_parts(recipe, module, container, 0, read=False))
            written = write_layer(recipe, out, index, module, QUIET)
            assert (written.tensors, written.record_bytes) == sized, module
            size = os.path.getsize(out / written.file)
            assert size == layer_bytes(recipe)[index]


@pytest.mark.parametrize("mode", sorted(QUANTIZE))
@pytest.mark.parametrize("source", sorted(SOURCES))
def test_a_record_sized_from_headers_is_the_record_written(tmp_path, source, mode):
    arch, dtype, fp8 = SOURCES[source]
    src = write_hf_checkpoint(tmp_path / "src", tiny_config(arch), dtype=dtype, fp8=fp8)
    _check_sized_as_written(src, QUANTIZE[mode], tmp_path / "out")


@pytest.mark.parametrize("quantize", [None, Quantize(4, 64)])
@pytest.mark.parametrize("arch, pack", PACKED)
def test_a_packed_record_sized_from_headers_is_the_record_written(tmp_path, arch, pack, quantize):
    src = write_hf_checkpoint(tmp_path / "src", tiny_config(arch), pack=pack)
    _check_sized_as_written(src, quantize, tmp_path / "out")


@pytest.mark.parametrize(
    "bits, group_size, mode", [(4, 64, "affine"), (6, 32, "affine"), (4, 32, "mxfp4")]
)
def test_an_mlx_quantized_record_sized_from_headers_is_the_record_written(
    checkpoints, tmp_path, bits, group_size, mode
):
    """MLX-quantized experts are kept as they are: stacked weight, scales and biases."""
    src = checkpoints.mlx("qwen3_moe", bits=bits, group_size=group_size, mode=mode)
    _check_sized_as_written(src, None, tmp_path / "out")


def test_an_mlx_mixed_bits_record_sized_from_headers_is_the_record_written(checkpoints, tmp_path):
    src = checkpoints.mlx("mixtral", recipe="mixed_3_6")
    _check_sized_as_written(src, None, tmp_path / "out")


def test_an_nvfp4_record_with_global_scales_sized_from_headers_is_the_record_written(
    checkpoints, tmp_path
):
    _check_sized_as_written(checkpoints.mlx_nvfp4_global_scales(), None, tmp_path / "out")


@pytest.mark.parametrize("quantize", [None, (4, 64)])
@pytest.mark.parametrize("fp8", [False, True])
def test_planning_a_download_reads_no_tensor_data(tmp_path, monkeypatch, fp8, quantize):
    """The plan and repack's disk check size records from the headers: a record was sized by
    reading (and with --quantize, quantizing) one whole expert, 600 MB at Mixtral-8x22B's size."""
    arch = "deepseek_v3" if fp8 else "mixtral"
    src = write_hf_checkpoint(tmp_path / "src", tiny_config(arch), fp8=fp8)

    monkeypatch.setattr(Checkpoint, "read", _refused)
    found = plan(src, 1 << 40, quantize=quantize)
    assert disk_needs(src, quantize and Quantize(*quantize))[1] == found.delete_source_peak_bytes


def test_a_resume_checks_a_kept_layer_s_layout_without_reading(tmp_path, monkeypatch):
    """A resume read (and with --quantize, quantized) each kept layer's first expert to check its
    layout; a shard --delete-source deleted left the layout unchecked."""
    src = write_hf_checkpoint(tmp_path / "src", tiny_config("deepseek_v3"), fp8=True)
    with Checkpoint(src) as ckpt:
        recipe = make_recipe(ckpt, Quantize(4, 64))
        (tmp_path / "out" / "experts").mkdir(parents=True)
        written = write_layer(recipe, tmp_path / "out", 0, next(iter(recipe.containers)), QUIET)
        monkeypatch.setattr(Checkpoint, "read", _refused)
        assert matches_recipe(recipe, 0, written)
        assert not matches_recipe(recipe, 0, dataclasses.replace(written, record_bytes=1 << 30))


def test_planning_a_download_parses_each_shard_header_once(tmp_path, monkeypatch):
    src = write_hf_checkpoint(tmp_path / "src", tiny_config("mixtral"))
    parsed = []

    def counted(path, *args, **kwargs):
        parsed.append(path.name)
        return read_header(path, *args, **kwargs)

    monkeypatch.setattr(checkpoint_module, "read_header", counted)
    monkeypatch.setattr("streamer.io.safetensors.read_header", counted)
    plan(src, 1 << 40)
    shards = sorted(p.name for p in src.glob("*.safetensors"))
    assert len(shards) > 1 and sorted(parsed) == shards


def test_an_index_s_shard_names_are_checked_once_each(tmp_path, monkeypatch):
    """Not once per tensor: Kimi K2's index names 140k tensors in a few dozen shards."""
    src = write_hf_checkpoint(tmp_path / "src", tiny_config("mixtral"))
    checked = []

    def counted(name):
        checked.append(name)
        return is_file_name(name)

    monkeypatch.setattr(checkpoint_module, "_is_file_name", counted)
    with Checkpoint(src) as ckpt:
        assert len(ckpt.tensors) > 2 * len(set(checked))
    assert sorted(checked) == sorted(p.name for p in src.glob("*.safetensors"))


def test_a_download_counts_its_own_shards_only(tmp_path):
    """A stray *.safetensors beside the shards the index names (a consolidated copy of the same
    weights) is not the model's: repack neither reads nor deletes it, and the download line said
    it was part of the download."""
    src = write_hf_checkpoint(tmp_path / "src", tiny_config("mixtral"))
    shards = sum(i.nbytes for f in src.glob("*.safetensors") for i in read_header(f).values())
    write_safetensors(src / "consolidated.safetensors", [("x", mx.zeros((1024,)))])
    assert plan(src, 1 << 40).download_bytes == shards


def _written_and_planned(src, out) -> tuple[tuple[int, int], tuple[int, int]]:
    """(expert bytes, bytes the repack needs) as planned and as written."""
    found = plan(src, 1 << 40)
    with Checkpoint(src) as ckpt:
        recipe = make_recipe(ckpt, None)
        needed = disk_needed(recipe, ResumeSidecar(src, SourceIdentity("")))[0]
    manifest = repack(src, out, log=lambda _: None)
    resident = sum(a.nbytes for _, a in recipe.resident_items())
    return (found.expert_bytes, needed - resident), (manifest.expert_file_bytes,) * 2


def test_layers_of_other_record_sizes_are_planned_as_written(tmp_path):
    """A mixed-bit recipe (the last layer's down_proj at 6 bits, the first's at 3): every layer's
    file was taken to be the first's."""
    hf = write_hf_checkpoint(tmp_path / "hf", tiny_config("mixtral", intermediate_size=1024))
    src = tmp_path / "mlx"
    with contextlib.redirect_stdout(io.StringIO()):
        mlx_lm.convert(str(hf), str(src), quantize=True, quant_predicate="mixed_3_6")
    planned, written = _written_and_planned(src, tmp_path / "out")
    assert len({layer.record_bytes for layer in read_manifest(tmp_path / "out").layers}) == 2
    assert planned == written


def test_records_in_a_dtype_config_json_does_not_say_are_planned_as_written(tmp_path):
    """float32 tensors under torch_dtype bfloat16: repack keeps them float32; the plan counted
    them at bfloat16's size, half what repack writes."""
    src = write_hf_checkpoint(tmp_path / "src", tiny_config("mixtral"), dtype="float32")
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "torch_dtype": "bfloat16"}))
    planned, written = _written_and_planned(src, tmp_path / "out")
    assert planned == written


@pytest.mark.parametrize("mode", ["affine-4-64", "mxfp4", "nvfp4"])
@pytest.mark.parametrize("family", sorted(TINY_CONFIGS))
def test_resident_weights_are_quantized_as_mlx_lm_quantize_model_does(family, mode):
    """streamer's copy of mlx_lm.utils.quantize_model's rule (imported by neither plan nor repack:
    it imports transformers) quantizes the same layers and writes the same config, byte for byte,
    each family's own recipe (its quant_predicate) and gpt-oss's MXFP4 experts included."""
    from mlx_lm.utils import quantize_model

    q = QUANTIZE[mode]
    config = normalize_config(check_config(tiny_config(family), "config.json"))
    models = [build_model(config, "config.json") for _ in range(2)]
    for model in models:  # experts published quantized (gpt-oss's MXFP4) first, as repack does
        quantize_like_mlx_lm(model, config, quantizable=lambda _, m: isinstance(m, SwitchLinear))
    with contextlib.redirect_stdout(io.StringIO()):  # mlx-lm prints its bits per weight
        theirs = quantize_model(models[1], config, q.group_size, q.bits, mode=q.mode)[1]
    ours = quantize_like_mlx_lm_convert(models[0], config, q.group_size, q.bits, q.mode)
    assert json.dumps(ours) == json.dumps(theirs)
    shapes = [{k: (v.shape, v.dtype) for k, v in tree_flatten(m.parameters())} for m in models]
    assert shapes[0] == shapes[1]
