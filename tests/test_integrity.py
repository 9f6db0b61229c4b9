"""A wrong weight never computes: checksums (verify, verify_reads), file sizes and times at load."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from hostile_files import flip_byte

import streamer
from streamer.errors import StreamerError
from streamer.io.integrity import MTIME_TOLERANCE_NS
from streamer.io.manifest import read_manifest
from streamer.verify import verify

QUIET = {"log": lambda _: None}


@pytest.fixture
def folder(checkpoints, tmp_path):
    dst = tmp_path / "model"
    shutil.copytree(
        checkpoints.repacked(checkpoints.hf("qwen3_moe")), dst
    )  # copy2 keeps file times
    return dst


def expert_tensor_offset(folder, layer: int, expert: int, tensor: int = 0) -> int:
    manifest = read_manifest(folder)
    record = manifest.layers[layer]
    return record.expert_offsets[expert] + record.tensors[tensor].offset


def test_verify_names_each_bad_tensor(folder):
    assert verify(folder, **QUIET) == []
    flip_byte(folder / "experts" / "001.bin", expert_tensor_offset(folder, 1, 7, 1) + 5)
    flip_byte(folder / "resident.safetensors", (folder / "resident.safetensors").stat().st_size - 3)
    problems = [str(p) for p in verify(folder, **QUIET)]
    assert len(problems) == 2, problems
    assert "resident.safetensors" in problems[0] and "does not match its checksum" in problems[0]
    assert (
        "experts/001.bin" in problems[1]
        and "expert 7" in problems[1]
        and "up_proj.weight" in problems[1]
    )


def test_verify_cli_exits_non_zero_with_progress(folder):
    flip_byte(folder / "experts" / "000.bin", expert_tensor_offset(folder, 0, 3))
    result = subprocess.run(
        [sys.executable, "-m", "streamer", "verify", str(folder)], capture_output=True, text=True
    )
    assert result.returncode == 1
    assert "layer 1/2" in result.stderr and "layer 2/2" in result.stderr  # progress
    assert (
        "expert 3" in result.stderr
        and "gate_proj.weight" in result.stderr
        and "repack" in result.stderr
    )


@pytest.mark.parametrize("read_path", ["mapped", "slots"])
def test_verify_reads_refuses_a_corrupt_expert_on_first_read(folder, read_path):
    manifest = read_manifest(folder)
    layer = manifest.layers[0]
    for expert in range(layer.num_experts):  # whichever expert is routed first is corrupt
        flip_byte(folder / layer.file, expert_tensor_offset(folder, 0, expert) + 1)
    model, tokenizer = streamer.load(folder, memory_budget=0, read_path=read_path)
    streamer.generate(
        model, tokenizer, "hello", max_tokens=2
    )  # without the check: computes garbage
    model, tokenizer = streamer.load(
        folder, verify_reads=True, memory_budget=0, read_path=read_path
    )
    with pytest.raises(
        StreamerError,
        match=r"000.bin \(MoE layer 0, .*\): expert \d+ tensor gate_proj.weight does not match",
    ):
        streamer.generate(model, tokenizer, "hello", max_tokens=2)


def test_verify_reads_checks_each_expert_once(folder, monkeypatch):
    model, tokenizer = streamer.load(folder, verify_reads=True, memory_budget=0)
    first = streamer.generate(model, tokenizer, "hello world", max_tokens=4)
    assert all(
        bits.any() for bits in (layer.prefetcher.verified for layer in model.streamer.layers)
    )

    class NoChecksums:
        def crc32(self, data):
            raise AssertionError("an expert was checksummed twice")

    monkeypatch.setattr("streamer.io.tensor_crcs.zlib", NoChecksums())
    assert (
        streamer.generate(model, tokenizer, "hello world", max_tokens=4) == first
    )  # same experts again


def test_verify_reads_checks_resident_weights_at_load(folder):
    flip_byte(folder / "resident.safetensors", (folder / "resident.safetensors").stat().st_size - 3)
    streamer.load(folder)  # size and time unchanged: only a checksum can tell
    with pytest.raises(
        StreamerError, match="resident.safetensors: tensor '.*' does not match its checksum"
    ):
        streamer.load(folder, verify_reads=True)


def test_a_copy_without_file_times_loads_and_a_file_edited_in_place_is_caught(folder, tmp_path):
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(folder), str(copy)], check=True)  # no times kept
    later_than_tolerated(copy)  # a checkpoint repacked within 2 s of the copy: times the same
    streamer.load(copy)
    assert verify(copy, **QUIET) == []
    # an edit with a new time, in a sampled expert (the first) or a resident tensor
    path = copy / "experts" / "001.bin"
    flip_byte(path, expert_tensor_offset(copy, 1, 0, tensor=-1), keep_time=False)
    later_than_tolerated(path)
    with pytest.raises(StreamerError, match="001.bin changed after it was repacked.*sampled"):
        streamer.load(copy)
    assert len(verify(copy, refresh=True, **QUIET)) == 1  # --refresh waves no edit through
    with pytest.raises(StreamerError, match="001.bin changed after it was repacked"):
        streamer.load(copy)
    # the same edit keeping the recorded time is silent corruption: verify and --verify-reads
    flip_byte(path, expert_tensor_offset(copy, 1, 0, tensor=-1), keep_time=False)  # undo
    assert verify(copy, refresh=True, **QUIET) == []
    streamer.load(copy)


def later_than_tolerated(path) -> None:
    """Every file at or under `path` timed past MTIME_TOLERANCE_NS after its recorded time, as a
    copy or an edit made later than 2 s after the repack: the test does not depend on how long
    ago the session's checkpoint was repacked."""
    for file in [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()]:
        later = file.stat().st_mtime_ns + 2 * MTIME_TOLERANCE_NS
        os.utime(file, ns=(later, later))


def test_expert_file_truncated_while_loaded(folder):
    """Touching a mapped page past the new end of the file would kill the process (SIGBUS): the
    size is checked before each layer computes, and the error names the file and layer."""
    model, tokenizer = streamer.load(folder, memory_budget=0)
    layer = read_manifest(folder).layers[1]
    os.truncate(folder / layer.file, layer.record_bytes)  # only expert 0 remains
    with pytest.raises(StreamerError, match=r"001.bin \(MoE layer 1, .*\) changed size"):
        streamer.generate(model, tokenizer, "hello world, this is a longer prompt", max_tokens=4)


def test_missing_expert_file(folder):
    (folder / "experts" / "000.bin").unlink()
    with pytest.raises(StreamerError, match="000.bin is missing.*MoE layer 0"):
        streamer.load(folder)


@pytest.mark.parametrize("budget", [None, 0, "hot"])  # resident (default here), streamed, cached
def test_verify_reads_holds_at_every_budget(folder, budget):
    """No expert is computed with before its crc32 matched: not when the budget makes every
    expert resident (copied at load), nor when misses are copied into the hot-expert cache."""
    manifest = read_manifest(folder)
    for layer_index, layer in enumerate(manifest.layers):
        for expert in range(layer.num_experts):  # whichever the router picks is bad
            flip_byte(folder / layer.file, expert_tensor_offset(folder, layer_index, expert))
    if budget == "hot":
        record = manifest.layers[0].record_bytes
        budget = 4 * record  # a few slots (floats in the compute dtype take more)
    with pytest.raises(StreamerError, match="does not match its checksum"):
        model, tokenizer = streamer.load(folder, verify_reads=True, memory_budget=budget)
        assert budget is not None, "a resident layer must be checked when it is made resident"
        assert ("hot experts" in model.streamer.residency) == (budget > 0)
        streamer.generate(model, tokenizer, "hello", max_tokens=2)
