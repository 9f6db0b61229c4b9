"""A file changed under a running model is noticed within the token, on every read path; with
verify_reads every read from the disk is checked, not only an expert's first."""

from __future__ import annotations

import os
import shutil

import pytest
from conftest import private_download
from hostile_files import flip_byte

import streamer
from streamer.errors import StreamerError
from streamer.io.manifest import read_manifest

PROMPT = "hello world, this is a prompt"


@pytest.fixture
def folder(checkpoints, tmp_path):
    dst = tmp_path / "model"
    shutil.copytree(checkpoints.repacked(checkpoints.hf("qwen3_moe")), dst)
    return dst


def overwrite(path, offset: int = 0) -> None:
    """Other bytes in place, the size kept: a download fetched again, a file rewritten."""
    with open(path, "r+b") as f:
        f.seek(offset)
        data = f.read(4096)
        f.seek(offset)
        f.write(bytes(b ^ 0x5A for b in data))


@pytest.mark.parametrize(
    "read_path, budget", [("mapped", 0), ("mapped", "hot"), ("mapped", None), ("slots", 0)]
)
def test_an_expert_file_overwritten_while_loaded_stops_generation(folder, read_path, budget):
    layer = read_manifest(folder).layers[1]
    if budget == "hot":
        budget = 4 * layer.record_bytes
    model, tokenizer = streamer.load(folder, memory_budget=budget, read_path=read_path)
    streamer.generate(model, tokenizer, PROMPT, max_tokens=2)
    if model.streamer.layers[1].resident:  # every expert copied at load: the file is not read
        overwrite(folder / layer.file)
        streamer.generate(model, tokenizer, PROMPT, max_tokens=2)
        return
    overwrite(folder / layer.file)
    with pytest.raises(
        StreamerError,
        match=r"001.bin \(MoE layer 1, .*\) was written to .* while the model was running from "
        r"it: .* generation stops; repack the model, then load the model again",
    ):
        streamer.generate(model, tokenizer, PROMPT, max_tokens=2)


def test_a_change_in_the_middle_of_an_answer_stops_it(folder):
    model, tokenizer = streamer.load(folder, memory_budget=0)
    stream = streamer.stream_generate(model, tokenizer, PROMPT, max_tokens=10)
    next(stream)
    overwrite(folder / read_manifest(folder).layers[0].file)
    with pytest.raises(StreamerError, match="000.bin .* was written to"):
        list(stream)


def test_an_expert_file_replaced_by_another_is_noticed(folder, tmp_path):
    model, tokenizer = streamer.load(folder, memory_budget=0, read_path="slots")
    path = folder / read_manifest(folder).layers[0].file
    other = tmp_path / "other.bin"
    shutil.copy2(path, other)  # the same bytes and time, another inode
    os.replace(other, path)
    with pytest.raises(StreamerError, match="000.bin .* was replaced by another file"):
        streamer.generate(model, tokenizer, PROMPT, max_tokens=2)


@pytest.mark.parametrize("read_path", ["mapped", "slots"])
def test_a_download_shard_overwritten_while_streamed_in_place(
    checkpoints, tmp_path, monkeypatch, read_path
):
    download = private_download(
        checkpoints.mlx("qwen3_moe", dtype="float32"), tmp_path, monkeypatch
    )
    model, tokenizer = streamer.load(download, memory_budget=0, read_path=read_path)
    streamer.generate(model, tokenizer, PROMPT, max_tokens=2)
    shard = model.streamer.expert_paths[0]
    overwrite(shard, shard.stat().st_size - 4096)
    with pytest.raises(StreamerError, match=r"\.safetensors .* was written to .* download that"):
        streamer.generate(model, tokenizer, PROMPT, max_tokens=2)


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="drops the page cache per file")
def test_verify_reads_checks_an_expert_read_from_the_disk_again(folder):
    """Bit rot the page cache hid: the expert checked on its first read is read from the disk
    again once its pages were dropped, and checked again."""
    model, tokenizer = streamer.load(folder, verify_reads=True, memory_budget=0)
    streamer.generate(model, tokenizer, PROMPT, max_tokens=2)
    layer = read_manifest(folder).layers[0]
    for offset in layer.expert_offsets:  # whichever is routed next is bad
        flip_byte(folder / layer.file, offset + layer.tensors[0].offset + 1)  # time kept
    model.streamer.evict()
    fd = os.open(folder / layer.file, os.O_RDONLY)
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    with pytest.raises(StreamerError, match="000.bin .* does not match its checksum"):
        streamer.generate(model, tokenizer, PROMPT, max_tokens=2)
