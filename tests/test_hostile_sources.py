"""Hostile source checkpoints for `streamer repack`: wrong dtypes, NaN weights, symbolic link loops,
indexes and configs a lax reader would accept, special files; each refused naming the file or
tensor, with nothing left at the destination."""

from __future__ import annotations

import json
import os
import shutil
import tracemalloc

import mlx.core as mx
import numpy as np
import pytest
from hostile_files import make_special, refused_without_hanging, rewrite_tensor

import streamer
from fixtures import tiny_config, write_hf_checkpoint
from streamer.errors import StreamerError
from streamer.io.safetensors import read_header, to_mlx, write_safetensors
from streamer.repack import records, repack

QUIET = {"log": lambda _: None}


@pytest.fixture
def src(checkpoints, tmp_path):
    dst = tmp_path / "src"
    shutil.copytree(checkpoints.hf("qwen3_moe"), dst)
    return dst


@pytest.mark.parametrize(
    "name",
    ["model.layers.0.input_layernorm.weight", "model.layers.1.mlp.experts.3.down_proj.weight"],
)
def test_dtype_mismatch_with_config(src, tmp_path, name):
    rewrite_tensor(src, name, lambda t: t.astype(mx.int16))
    with pytest.raises(
        StreamerError,
        match=f"tensor '{name}' is I16 but config.json implies a floating-point tensor",
    ):
        repack(src, tmp_path / "out", **QUIET)
    assert not (tmp_path / "out").exists()


def test_nan_and_inf_weights_are_reported_not_fatal(src, tmp_path):
    def poison(value):
        return lambda t: mx.array(
            np.where(
                np.arange(t.size).reshape(t.shape) % 7 == 0, value, np.array(t.astype(mx.float32))
            )
        ).astype(t.dtype)

    rewrite_tensor(src, "model.layers.0.post_attention_layernorm.weight", poison(np.inf))
    rewrite_tensor(src, "model.layers.1.mlp.experts.5.gate_proj.weight", poison(np.nan))
    logs = []
    repack(src, tmp_path / "out", log=logs.append)
    warnings = [line for line in logs if "warning" in line]
    assert any(
        "model.layers.0.post_attention_layernorm.weight" in w and "NaN/Inf" in w for w in warnings
    ), logs
    assert any(
        "model.layers.1.mlp.switch_mlp expert 5 tensor gate_proj.weight" in w for w in warnings
    ), logs
    assert "2 tensor(s) hold NaN/Inf values" in warnings[-1]


def test_a_large_resident_tensor_is_checked_for_nan_a_chunk_at_a_time(tmp_path, monkeypatch):
    """The resident file's NaN/Inf check read each tensor whole and compared it whole: about 2.5x
    the largest one (Kimi K2's or Llama 4's 2 GB embedding) on top of the weights the repack
    holds. A chunk at a time, values on either side of a chunk's edge still counted."""
    monkeypatch.setattr(records, "CHECK_CHUNK", 4096)  # 1024 float32 values
    values = np.zeros(1 << 18, np.float32)  # 1 MiB
    values[[0, 1023, 1024, (1 << 18) - 1]] = [np.nan, np.inf, -np.inf, np.nan]
    path = tmp_path / "resident.safetensors"
    write_safetensors(path, [("model.embed_tokens.weight", mx.array(values))])
    logs = []
    tracemalloc.start()
    try:
        records.NonfiniteWarnings(logs.append).check_file(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert logs == [
        "[repack] warning: resident tensor 'model.embed_tokens.weight' holds 4 NaN/Inf value(s)."
    ]
    assert peak < 64 << 10  # a few chunks, not the tensor's 1 MiB


def test_symlink_loops_in_the_model_folder(src, tmp_path):
    os.symlink("loop", src / "loop")  # a stray loop next to the weights is ignored
    repack(src, tmp_path / "ok", **QUIET)
    shard = sorted(src.glob("model-*.safetensors"))[0]
    shard.unlink()
    os.symlink(shard.name, shard)  # the shard itself is a loop
    with pytest.raises(
        StreamerError,
        match=f"cannot read .*{shard.name} \\(a symbolic link.*Too many levels of symbolic links",
    ):
        repack(src, tmp_path / "out", **QUIET)
    folder = tmp_path / "ok"
    expert_file = folder / "experts" / "000.bin"
    expert_file.unlink()
    os.symlink("000.bin", expert_file)
    with pytest.raises(StreamerError, match="000.bin.*Too many levels of symbolic links"):
        streamer.load(folder)


def test_float64_weights_are_refused(src, tmp_path):
    name = "model.layers.0.input_layernorm.weight"
    rewrite_tensor(src, name, lambda t: t.astype(mx.float64))
    with pytest.raises(StreamerError, match=f"'{name}' is F64, which MLX cannot load"):
        repack(src, tmp_path / "out", **QUIET)


@pytest.mark.parametrize("value", [7, None, ["model-00001-of-00002.safetensors"], "../x", ""])
def test_index_weight_map_values_that_are_not_shard_names(src, tmp_path, value):
    index = json.loads((src / "model.safetensors.index.json").read_text())
    index["weight_map"][next(iter(index["weight_map"]))] = value
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(StreamerError, match="weight_map names shard .*not a file in this folder"):
        repack(src, tmp_path / "out", **QUIET)


def test_deeply_nested_config_and_index(src, tmp_path):
    for name in ("model.safetensors.index.json", "config.json"):
        (src / name).write_text("[" * 100_000 + "]" * 100_000)
        with pytest.raises(StreamerError, match=name):
            repack(src, tmp_path / "out", **QUIET)


def test_config_integer_of_thousands_of_digits(src, tmp_path):
    config = (src / "config.json").read_text()
    (src / "config.json").write_text(
        config.replace('"num_experts": 16', '"num_experts": ' + "9" * 5000)
    )
    with pytest.raises(StreamerError, match="config.json holds an integer of over 4300 digits"):
        repack(src, tmp_path / "out", **QUIET)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["fifo", "dir", "socket"])
@pytest.mark.parametrize(
    "name", ["model-00001-of-00002.safetensors", "config.json", "tokenizer.json"]
)
def test_special_file_in_the_source(src, tmp_path, name, kind):
    make_special(src / name, kind)
    refused_without_hanging(lambda: repack(src, tmp_path / "out", **QUIET), name)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("drop", [0, 1])
def test_a_numbered_shard_missing_from_a_folder_without_an_index(src, tmp_path, drop):
    """Without an index, a missing `model-0000K-of-0000N` shard was blamed on config.json ("the
    weights hold layers 0-0 only ... download config.json again") or on absent tensors."""
    (src / "model.safetensors.index.json").unlink()
    shards = sorted(src.glob("model-*.safetensors"))
    shards[drop].unlink()
    other = shards[1 - drop].name
    with pytest.raises(
        StreamerError,
        match=f"holds {other} but not {shards[drop].name}: the download is incomplete; "
        "fetch that file",
    ):
        repack(src, tmp_path / "out", **QUIET)
    assert not (tmp_path / "out").exists()


def _add_tensor(src, shard_name: str, name: str, value) -> None:
    """Tensor `name` added to shard `shard_name` and to the index."""
    shard = src / shard_name
    data = shard.read_bytes()
    tensors = [
        (n, to_mlx(data[i.start : i.end], i.dtype, i.shape)) for n, i in read_header(shard).items()
    ]
    write_safetensors(shard, [*tensors, (name, value)])
    index = json.loads((src / "model.safetensors.index.json").read_text())
    index["weight_map"][name] = shard_name
    (src / "model.safetensors.index.json").write_text(json.dumps(index))


@pytest.mark.parametrize("number", ["03", "\u0663"])  # a leading zero; ARABIC-INDIC DIGIT THREE
def test_an_expert_given_twice_under_two_numbers(src, tmp_path, number):
    """`experts.03` (or `experts.٣`) beside `experts.3`: both read as expert 3, and the one read
    last silently became its weights (mlx-lm refuses the stray name)."""
    name = "model.layers.1.mlp.experts.3.down_proj.weight"
    index = json.loads((src / "model.safetensors.index.json").read_text())
    stray = name.replace(".3.", f".{number}.")
    _add_tensor(src, index["weight_map"][name], stray, mx.ones((128, 64), mx.bfloat16))
    with pytest.raises(StreamerError, match="both hold expert 3's down_proj.weight weights") as e:
        repack(src, tmp_path / "out", **QUIET)
    assert f"'{stray}'" in str(e.value) and f"'{name}'" in str(e.value)
    assert not (tmp_path / "out").exists()


def test_experts_both_stacked_and_one_tensor_each(src, tmp_path):
    """A stacked `switch_mlp.down_proj.weight` beside the per-expert tensors it stands for: the
    stacked one was taken silently (mlx-lm's sanitize overwrites it with the per-expert ones)."""
    stacked = "model.layers.1.mlp.switch_mlp.down_proj.weight"
    shard = "model-00002-of-00002.safetensors"
    _add_tensor(src, shard, stacked, mx.ones((16, 128, 64), mx.bfloat16))
    with pytest.raises(
        StreamerError,
        match=f"'{stacked}' and 'model.layers.1.mlp.experts.0.down_proj.weight' "
        "both hold the same weights",
    ):
        repack(src, tmp_path / "out", **QUIET)
    assert not (tmp_path / "out").exists()


def test_expert_tensors_of_a_kind_the_model_lacks(src, tmp_path):
    """Per-expert biases for a model whose experts have none (config.json says no bias): they
    were dropped silently, where a resident tensor the model lacks is refused (and mlx-lm
    refuses both)."""
    shard = "model-00002-of-00002.safetensors"
    for expert in range(16):
        name = f"model.layers.1.mlp.experts.{expert}.down_proj.bias"
        _add_tensor(src, shard, name, mx.ones((128,), mx.bfloat16))
    with pytest.raises(
        StreamerError,
        match="tensor 'model.layers.1.mlp.experts.0.down_proj.bias' is not part of a qwen3_moe "
        "model with this config.json",
    ):
        repack(src, tmp_path / "out", **QUIET)
    assert not (tmp_path / "out").exists()


def test_stacked_expert_tensors_of_a_kind_the_model_lacks(checkpoints, tmp_path):
    """An MLX conversion with a stacked `switch_mlp.down_proj.bias` its model has no place for:
    dropped silently (mlx-lm refuses it: "Received parameters not in model")."""
    src = tmp_path / "src"
    shutil.copytree(checkpoints.mlx("qwen3_moe"), src)
    name = "model.layers.1.mlp.switch_mlp.down_proj.bias"
    _add_tensor(src, "model.safetensors", name, mx.zeros((16, 128), mx.bfloat16))
    with pytest.raises(StreamerError, match=f"tensor '{name}' is not part of a qwen3_moe model"):
        repack(src, tmp_path / "out", **QUIET)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("change", ["replaced", "truncated"])
def test_a_shard_changed_while_repacking(src, tmp_path, change):
    """A shard replaced (a download fetched again) or cut short while the repack read it: the
    replaced one's new bytes were mixed silently with the old ones read before, the truncated one
    reached the user as MLX's RuntimeError ("[read] Unable to read from file.")."""
    shard = src / "model-00002-of-00002.safetensors"

    def log(message):
        if message.startswith("[repack] disk"):  # the tensor table is read, nothing written yet
            if change == "replaced":
                header = read_header(shard)
                write_safetensors(
                    shard.with_suffix(".new"),
                    [(n, mx.zeros(i.shape, mx.bfloat16)) for n, i in header.items()],
                )
                os.replace(shard.with_suffix(".new"), shard)
            else:
                os.truncate(shard, shard.stat().st_size // 2)

    with pytest.raises(StreamerError, match=f"{shard.name} changed while repacking"):
        repack(src, tmp_path / "out", log=log)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))


def test_one_fp8_expert_of_another_dtype(tmp_path):
    """One expert's weight in BF16 among FP8 ones (with its block scale): MLX's from_fp8 refused
    it inside sanitize, and the message named no tensor ("mlx-lm cannot read these tensors")."""
    src = write_hf_checkpoint(tmp_path / "src", tiny_config("deepseek_v3"), fp8=True)
    name = "model.layers.1.mlp.experts.3.down_proj.weight"
    index = json.loads((src / "model.safetensors.index.json").read_text())
    shard = src / index["weight_map"][name]
    header, data = read_header(shard), shard.read_bytes()
    tensors = [
        (
            n,
            to_mlx(data[i.start : i.end], i.dtype, i.shape).astype(mx.bfloat16)
            if n == name
            else to_mlx(data[i.start : i.end], i.dtype, i.shape),
        )
        for n, i in header.items()
    ]
    fp8 = {n: "F8_E4M3" for n, i in header.items() if i.dtype == "F8_E4M3" and n != name}
    write_safetensors(shard, tensors, dtypes=fp8)
    with pytest.raises(
        StreamerError, match=f"tensor '{name}' is bfloat16 but the other experts' are uint8"
    ):
        repack(src, tmp_path / "out", **QUIET)
    assert not (tmp_path / "out").exists()


def test_fp8_block_scales_as_exponent_bytes_are_refused(tmp_path):
    """`weight_scale_inv` saved as UE8M0 exponents (F8_E8M0, 2**(byte - 127) each, as transformers
    saves and reads scale_fmt ue8m0) beside 128x128 FP8 blocks: mlx-lm's deepseek_v3 dequantize
    multiplies the weight by the byte itself, and the experts were repacked so, silently wrong."""
    src = write_hf_checkpoint(tmp_path / "src", tiny_config("deepseek_v3"), fp8=True)
    name = "model.layers.1.mlp.experts.3.down_proj.weight_scale_inv"
    index = json.loads((src / "model.safetensors.index.json").read_text())
    shard = src / index["weight_map"][name]
    header, data = read_header(shard), shard.read_bytes()
    tensors = [(n, to_mlx(data[i.start : i.end], i.dtype, i.shape)) for n, i in header.items()]
    exponents = np.ceil(np.log2(np.array(dict(tensors)[name]))) + 127
    tensors = [(n, mx.array(exponents.astype(np.uint8)) if n == name else a) for n, a in tensors]
    dtypes = {n: i.dtype for n, i in header.items() if i.dtype == "F8_E4M3"}
    write_safetensors(shard, tensors, dtypes={**dtypes, name: "F8_E8M0"})
    with pytest.raises(
        StreamerError, match=f"tensor '{name}' holds FP8 block scales as F8_E8M0 exponents"
    ):
        repack(src, tmp_path / "out", **QUIET)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("points_to", ["nothing", "itself", "a folder"])
def test_a_side_file_that_cannot_be_read_is_refused(src, tmp_path, points_to):
    """tokenizer_config.json a symbolic link to nothing (a hub blob that never landed), to itself
    or to a folder: repack left it out without a word, and the repacked model ran without its
    special tokens and chat template."""
    link = src / "tokenizer_config.json"
    link.unlink()
    target = {"nothing": src / "blob", "itself": link, "a folder": tmp_path}[points_to]
    link.symlink_to(target)
    message = f"{link} is a directory" if target.is_dir() else f"cannot read {link} \\(a symbolic"
    with pytest.raises(StreamerError, match=message):
        repack(src, tmp_path / "out", **QUIET)
    assert not (tmp_path / "out").exists()
