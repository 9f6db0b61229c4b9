"""Hostile and broken inputs: each ends in a StreamerError naming the file or tensor and what
to do."""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest

import streamer
from streamer.cli import main
from streamer.errors import StreamerError
from streamer.io.safetensors import read_header, to_mlx, write_safetensors
from streamer.repack import repack

QUIET = {"log": lambda _: None}


def raw_safetensors(path, header: dict, data: bytes = b"", length: int | None = None):
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


@pytest.mark.parametrize(
    "header, data, message",
    [
        (
            {
                "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]},
            },
            bytes(24),
            "tensors 'a' and 'b' overlap",
        ),
        (
            {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}},
            bytes(8),
            "data ends at byte 16 but the file holds only 8",
        ),
        (
            {"a": {"dtype": "F32", "shape": [4], "data_offsets": [-8, 8]}},
            bytes(16),
            "invalid data_offsets",
        ),
        (
            {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}},
            bytes(16),
            "16 bytes for shape [3]",
        ),
        (
            {"a": {"dtype": ["F32"], "shape": [4], "data_offsets": [0, 16]}},
            bytes(16),
            "unsupported dtype",
        ),
        (
            {"a": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}},
            bytes(16),
            "invalid shape",
        ),
        ([1, 2], b"", "not a JSON object"),
    ],
)
def test_bad_safetensors_headers(tmp_path, header, data, message):
    path = raw_safetensors(tmp_path / "model.safetensors", header, data)
    with pytest.raises(StreamerError, match="model.safetensors") as err:
        read_header(path)
    assert message in str(err.value)


def test_absurd_header_length(tmp_path):
    path = raw_safetensors(tmp_path / "model.safetensors", {}, length=1 << 62)
    with pytest.raises(
        StreamerError, match="header length 4611686018427387904 is impossible.*Download it again"
    ):
        read_header(path)


def rewrite_tensor(src, name: str, change) -> None:
    """Replace tensor `name` in its shard by change(tensor), keeping everything else."""
    index = json.loads((src / "model.safetensors.index.json").read_text())
    shard = src / index["weight_map"][name]
    header = read_header(shard)
    data = shard.read_bytes()
    tensors = [(n, to_mlx(data[i.start : i.end], i.dtype, i.shape)) for n, i in header.items()]
    write_safetensors(shard, [(n, change(t) if n == name else t) for n, t in tensors])


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


# -- a manifest edited by hand ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_folder(checkpoints):
    return checkpoints.repacked(checkpoints.mlx("qwen3_moe"))


def edit(model_folder, tmp_path, change):
    folder = tmp_path / "model"
    shutil.copytree(model_folder, folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    change(manifest)
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def set_first_offset(value):
    return lambda m: m["moe_layers"][0]["experts"][0].update(offset=value)


def set_tensor(**fields):
    return lambda m: m["moe_layers"][1]["tensors"][0].update(fields)


@pytest.mark.parametrize(
    "change, message",
    [
        (set_first_offset(100), "not stored in expert order"),
        (set_first_offset(1 << 40), "not stored in expert order"),
        (lambda m: m.update(format_version="1"), "format version '1'"),
        (lambda m: m.update(format_version=0), "format version 0"),
        (lambda m: m["moe_layers"][0].update(file="../../etc/passwd"), "points outside the folder"),
        (lambda m: m["moe_layers"][0].update(record_bytes=4096), "not page-aligned"),
        (
            lambda m: m["moe_layers"][0]["quantization"].update(gate_proj={"bits": "4"}),
            "malformed|invalid quantization",
        ),
        (set_tensor(offset=64), "overlap"),
        (set_tensor(nbytes=12), "size does not match its shape"),
        # a consistent edit (shape and size agree) that does not fit the model
        (
            set_tensor(shape=[32, 16], nbytes=2048),
            r"tensor gate_proj.weight is 16 x \[32, 16\] U32 but the model expects",
        ),
        (lambda m: m["moe_layers"][0]["experts"][0].update(crc32=[1, 2]), "valid crc32"),
        (lambda m: m["files"]["experts/000.bin"].update(size="big"), "record of file"),
        (lambda m: m["config"].update(num_experts=8), "lists 16 experts, expected 8|expects"),
        (lambda m: m.update(moe_layers=m["moe_layers"][:1]), "lists MoE layers"),
    ],
)
def test_hand_edited_manifest(model_folder, tmp_path, change, message):
    folder = edit(model_folder, tmp_path, change)
    with pytest.raises(StreamerError, match=message) as err:
        streamer.load(folder)
    assert "manifest.json" in str(err.value) and "repack" in str(err.value)


# -- generation arguments ----------------------------------------------------------------


def test_prompt_longer_than_the_context(checkpoints):
    model, tokenizer = streamer.load(checkpoints.repacked(checkpoints.hf("qwen3_moe")))
    long = " ".join(f"w{i}" for i in range(2100))
    with pytest.raises(
        StreamerError, match=r"the prompt is \d+ tokens but the model's context is 2048 tokens"
    ):
        streamer.generate(model, tokenizer, long, max_tokens=1)
    prompt = list(range(1, 2040))
    with pytest.raises(StreamerError, match="max_tokens is 100.*lower max_tokens to at most 9"):
        streamer.generate(model, tokenizer, prompt, max_tokens=100)
    with pytest.raises(StreamerError, match="max_tokens must be at least 1"):
        streamer.generate(model, tokenizer, "hello", max_tokens=-3)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--prompt", os.fsdecode(b"caf\xe9 \xff")], "not valid UTF-8 (byte 0xe9 at offset 3)"),
        (["--prompt", ""], "the prompt is empty"),
        (["--prompt", "hi", "--max-tokens", "0"], "--max-tokens must be at least 1"),
        (["--prompt", "hi", "--max-tokens", "-5"], "--max-tokens must be at least 1 (got -5)"),
    ],
)
def test_cli_refuses_bad_generation_input_before_loading(argv, message, capsys):
    assert main(["generate", "--model", "/nonexistent", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("budget", ["-1G", "inf", "nan", "lots"])
def test_cli_refuses_a_bad_memory_budget(budget, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["generate", "--model", "x", "--prompt", "hi", f"--memory-budget={budget}"])
    assert exit_.value.code == 2 and "is not a size such as 8G" in capsys.readouterr().err


def test_cli_prompt_bytes_from_the_shell_and_stdin(checkpoints):
    """Real argv bytes (not valid UTF-8) and a prompt piped on stdin."""
    model = str(checkpoints.repacked(checkpoints.hf("qwen3_moe")))
    command = [sys.executable, "-m", "streamer", "generate", "--model", model, "--max-tokens", "2"]
    result = subprocess.run([*command, "--prompt", b"\xc3\x28 bad"], capture_output=True)
    assert result.returncode == 2 and b"not valid UTF-8 (byte 0xc3 at offset 0)" in result.stderr
    result = subprocess.run(
        [*command, "--prompt", "-"], input="caf\u00e9 au lait".encode(), capture_output=True
    )
    assert result.returncode == 0 and b"decode: 2 tokens" in result.stderr, result.stderr


# -- headers and indexes that json or a lax reader would accept ------------------------------------


def test_duplicate_keys_in_a_safetensors_header(tmp_path):
    entry = '{"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}'
    raw = f'{{"a": {entry}, "a": {entry}}}'.encode()  # json.loads keeps the last
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(4))
    with pytest.raises(StreamerError, match="model.safetensors: header names 'a' twice"):
        read_header(path)


def test_non_string_metadata_values(tmp_path):
    header = {
        "__metadata__": {"format": 1},
        "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
    }
    path = raw_safetensors(tmp_path / "model.safetensors", header, bytes(4))
    with pytest.raises(StreamerError, match="__metadata__ must map names to strings"):
        read_header(path)


def test_float64_weights_are_refused(src, tmp_path):
    name = "model.layers.0.input_layernorm.weight"
    rewrite_tensor(src, name, lambda t: t.astype(mx.float64))
    with pytest.raises(StreamerError, match=f"'{name}' is F64, which MLX models cannot load"):
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


# -- special files where a regular file belongs: refused, never waited on --------------------------


class _Hang(Exception):
    pass


def _special(path, kind: str) -> None:
    """Replace `path` by a FIFO, a directory or a listening-less Unix socket."""
    import socket

    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        path.mkdir()
    else:
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()


def refused_without_hanging(call, *patterns: str) -> None:
    import signal

    def hang(*_):
        raise _Hang("blocked on a special file")

    old = signal.signal(signal.SIGALRM, hang)
    signal.alarm(20)
    try:
        with pytest.raises(StreamerError) as err:
            call()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    for pattern in patterns:
        assert pattern in str(err.value), str(err.value)


@pytest.mark.parametrize("kind", ["fifo", "dir", "socket"])
@pytest.mark.parametrize(
    "name", ["model-00001-of-00002.safetensors", "config.json", "tokenizer.json"]
)
def test_special_file_in_the_source(src, tmp_path, name, kind):
    _special(src / name, kind)
    if kind == "dir" and name == "tokenizer.json":
        return  # a folder named like a file is a folder: not read, not copied
    refused_without_hanging(lambda: repack(src, tmp_path / "out", **QUIET), name)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["fifo", "dir"])
@pytest.mark.parametrize(
    "name", ["manifest.json", "resident.safetensors", "experts/001.bin", "tokenizer.json"]
)
def test_special_file_in_a_repacked_folder(model_folder, tmp_path, name, kind):
    from streamer.verify import verify

    folder = tmp_path / "model"
    shutil.copytree(model_folder, folder)
    _special(folder / name, kind)
    if kind == "dir" and name == "tokenizer.json":
        refused_without_hanging(lambda: streamer.load(folder), "tokenizer")
        return
    refused_without_hanging(lambda: streamer.load(folder), name)
    if name == "manifest.json":
        refused_without_hanging(lambda: verify(folder, log=lambda _: None), name)
    elif name != "tokenizer.json":
        problems = verify(folder, log=lambda _: None)
        assert any(p.file == name for p in problems), problems
