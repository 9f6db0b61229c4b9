"""An MLX download streamed in place: computed on the shards' own bytes, checked like a repack.

tests/test_parity.py runs every architecture's `mlx_lm.convert` checkpoint in place; here: that
the compute reads the shards without a copy (float32 scales, as a Mac computing in bf16 sees),
the budget's other read paths, the sync-free cached layers, checksums on read from the sidecar,
changed files, and the lock that keeps `repack --delete-source` away from a download in use.
"""

from __future__ import annotations

import os
import subprocess
import sys

import mlx.core as mx
import pytest
from conftest import private_download, reference_model
from hostile_files import flip_byte
from test_parity import PROMPT, assert_exactly_as, greedy_tokens

import streamer
from streamer.cache.budget import largest_expert_bytes
from streamer.errors import StreamerError
from streamer.loading.download_folder import open_download
from streamer.repack import repack
from streamer.verify import verify

QUIET = {"log": lambda _: None}


@pytest.fixture
def download(checkpoints, tmp_path, monkeypatch):
    """A private copy of a float32-scaled 4-bit checkpoint and a private user cache folder."""
    return private_download(checkpoints.mlx("qwen3_moe", dtype="float32"), tmp_path, monkeypatch)


def listing(folder):
    return sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir())


def test_experts_are_computed_on_the_shards_with_no_copy(download):
    described, _, _ = open_download(download)
    assert any(not t.aligned for layer in described.layers for t in layer.tensors)  # as mlx writes
    before = listing(download)
    reference = reference_model(download)
    one = largest_expert_bytes(described, mx.float32)
    for budget in (0, 12 * one):  # page cache only (in place), then a hot-expert cache
        model, tokenizer = streamer.load(download, memory_budget=budget)
        prompt = mx.array(tokenizer.encode(PROMPT))
        assert_exactly_as(model, reference, prompt, 24)
        handle = model.streamer
        decode = handle.stats.decode
        assert decode.experts_read + decode.cache_hits >= decode.layer_calls > 0
        if budget == 0:
            assert decode.bytes_copied == 0  # computed on the mapped shards
            # only the layers' stacked tensors are mapped, not the shard's other weights
            assert handle.files.mapped_bytes < sum(described.file_bytes.values())
            handle.stats.reset()
            greedy_tokens(model, prompt, 24)  # files now in the page cache: no syncs needed
            assert handle.stats.decode.syncs < handle.stats.decode.layer_calls
        else:
            assert decode.cache_hits > 0
        handle.close()
    assert listing(download) == before  # nothing written into the download


def test_verify_reads_uses_the_sidecar_and_catches_a_bad_expert(download):
    with pytest.raises(StreamerError, match="verify_reads needs checksums.*--record"):
        streamer.load(download, verify_reads=True)
    assert verify(download, record=True, **QUIET) == []
    described, _, _ = open_download(download)
    tensor = described.layers[0].tensors[0]
    for expert in range(described.layers[0].num_experts):  # every expert of one tensor
        flip_byte(download / tensor.file, tensor.span(expert)[0])
    model, tokenizer = streamer.load(download, verify_reads=True, memory_budget=0)
    prompt = mx.array(tokenizer.encode(PROMPT))
    with pytest.raises(StreamerError, match=r"expert \d+ tensor gate_proj.weight does not match"):
        mx.eval(model(prompt[None]))
    model.streamer.close()


def test_a_sidecar_that_checks_fewer_tensors_is_refused(download):
    """A tampered sidecar listing fewer crc32s per expert than the expert has tensors would leave
    the rest unchecked under verify_reads: refused at load."""
    import json

    from streamer.io.checksums import default_sidecar

    assert verify(download, record=True, **QUIET) == []
    sidecar = default_sidecar(download)
    data = json.loads(sidecar.read_text())
    module = next(iter(data["experts"]))
    data["experts"][module] = [crcs[:-1] for crcs in data["experts"][module]]
    sidecar.write_text(json.dumps(data))
    with pytest.raises(StreamerError, match="does not describe .*delete it and record it again"):
        streamer.load(download, verify_reads=True)


def test_a_shard_changed_since_its_checksums_were_recorded_is_refused(download):
    assert verify(download, record=True, **QUIET) == []
    shard = next(download.glob("*.safetensors"))
    os.utime(shard, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns + 10**10))
    with pytest.raises(StreamerError, match="changed since its checksums were recorded"):
        streamer.load(download)
    assert verify(download, record=True, **QUIET) == []  # the user accepts the files as they are
    streamer.load(download)[0].streamer.close()


def test_delete_source_refuses_a_download_a_model_streams_from(download, tmp_path):
    model, _ = streamer.load(download, memory_budget=0)
    with pytest.raises(StreamerError, match="in use: another process streams a model from it"):
        repack(download, tmp_path / "out", delete_source=True, **QUIET)
    assert not (tmp_path / "out").exists() and list(download.glob("*.safetensors"))
    model.streamer.close()


def test_generate_and_info_cli_on_a_download(download):
    result = subprocess.run(
        [sys.executable, "-m", "streamer", "generate", "--model", str(download)]
        + ["--prompt", "def f(", "--max-tokens", "4", "--memory-budget", "0"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert "page cache only" in result.stderr and "tok/s" in result.stderr
    info = subprocess.run(
        [sys.executable, "-m", "streamer", "info", str(download)], capture_output=True, text=True
    )
    assert info.returncode == 0 and "in place, 9 byte ranges per expert" in info.stdout


def test_verify_reads_without_checksums_names_the_flag_on_the_command_line(download, capsys):
    """`generate --verify-reads` of a download whose checksums are not recorded said
    "verify_reads needs checksums", the Python API's keyword, not the flag typed."""
    from streamer.cli import main

    argv = ["generate", "--model", str(download), "-p", "hi", "--verify-reads"]
    assert main(argv) == 2
    line = capsys.readouterr().err.splitlines()[-1]
    assert line.startswith("streamer: error: --verify-reads needs checksums of "), line
