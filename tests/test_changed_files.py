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
from streamer.server.api import Completion, Sampling
from streamer.server.engine import Engine
from streamer.server.fields import ApiError
from streamer.server.jobs import Done, Job, Step

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


@pytest.mark.parametrize("read_path", ["mapped", "slots"])
def test_an_expert_file_replaced_by_another_runs_on_the_open_one(folder, tmp_path, read_path):
    """A new file at the path (os.replace) leaves the open one's bytes as they were."""
    model, tokenizer = streamer.load(folder, memory_budget=0, read_path=read_path)
    expected = streamer.generate(model, tokenizer, PROMPT, max_tokens=4)
    path = folder / read_manifest(folder).layers[0].file
    other = tmp_path / "other.bin"
    shutil.copy2(path, other)
    overwrite(other)  # other bytes at the path, not in the open file
    os.replace(other, path)
    assert streamer.generate(model, tokenizer, PROMPT, max_tokens=4) == expected


@pytest.mark.parametrize("read_path", ["mapped", "slots"])
def test_a_folder_deleted_and_repacked_anew_under_an_answer_finishes_it(
    checkpoints, folder, read_path
):
    """`rm -rf` and a repack into the same path while an answer streams: its open files are
    intact, so it finishes as it would have."""
    model, tokenizer = streamer.load(folder, memory_budget=0, read_path=read_path)
    expected = streamer.generate(model, tokenizer, PROMPT, max_tokens=6)
    stream = streamer.stream_generate(model, tokenizer, PROMPT, max_tokens=6)
    text = next(stream).text
    shutil.rmtree(folder)
    shutil.copytree(checkpoints.repacked(checkpoints.hf("qwen3_moe")), folder)  # new inodes
    text += "".join(response.text for response in stream)
    assert text == expected


def answer(engine: Engine, prompt: list[int]) -> str | ApiError:
    """The served text of one request, or the error it was answered with."""
    job = engine.submit(Job(Completion(False, "m", 4, Sampling(), text=PROMPT), prompt, 4))
    pieces = []
    while not isinstance(event := job.events.get(timeout=120), Done):
        if isinstance(event, ApiError):
            return event
        assert isinstance(event, Step), event
        pieces.append(event.piece.content)
    return "".join(pieces)


def test_a_server_keeps_serving_when_its_files_change(checkpoints, folder, caplog):
    """A folder repacked anew under the server: requests are answered as before. A file rewritten
    in place: each request is answered with one clear error (no traceback in the log), and the
    server still answers the next."""
    model, tokenizer = streamer.load(folder, memory_budget=0)
    prompt = tokenizer.encode(PROMPT)
    engine = Engine(model, tokenizer, 2)
    expected = answer(engine, prompt)
    assert isinstance(expected, str) and expected
    shutil.rmtree(folder)
    shutil.copytree(checkpoints.repacked(checkpoints.hf("qwen3_moe")), folder)
    assert answer(engine, prompt) == expected
    engine.close()
    model, tokenizer = streamer.load(folder, memory_budget=0)  # the new files, then rewritten
    engine = Engine(model, tokenizer, 2)
    overwrite(folder / read_manifest(folder).layers[0].file)
    for _ in range(2):
        error = answer(engine, prompt)
        assert isinstance(error, ApiError) and error.status == 500, error
        assert "generation failed" in error.message and "000.bin" not in error.message
        reference = error.message.rpartition("reference ")[2]  # the log has the line under it
        logged = [r.getMessage() for r in caplog.records if reference in r.getMessage()]
        assert logged and "000.bin (MoE layer 0, " in logged[0] and "was written to" in logged[0]
        assert engine.healthy
    assert not any(record.exc_info for record in caplog.records), "a traceback was logged"
    engine.close()


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
