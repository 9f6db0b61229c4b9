"""A download streamed in place: its description, its checksum sidecar, `streamer verify` on it."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import mlx.core as mx
import numpy as np
import pytest
from conftest import private_download
from hostile_files import flip_byte

import streamer
from streamer.io.checksums import default_sidecar
from streamer.loading.download_folder import open_download
from streamer.verify import verify

QUIET = {"log": lambda _: None}


@pytest.fixture
def download(checkpoints, tmp_path, monkeypatch):
    """A private copy of an mlx_lm.convert 4-bit checkpoint, and a private user cache folder."""
    return private_download(checkpoints.mlx("qwen3_moe"), tmp_path, monkeypatch)


def listing(folder):
    return {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir()}


def test_each_expert_is_its_slice_of_every_stacked_tensor(checkpoints):
    src = checkpoints.mlx("qwen3_moe")
    described, _, resident = open_download(src)
    assert len(described.layers) == 2 and not any("switch_mlp" in n for n in resident)
    for layer in described.layers:
        assert len(layer.tensors) == 9  # weight, scales, biases of gate, up and down
        for tensor in layer.tensors:
            stacked = mx.load(str(src / tensor.file))[f"{layer.module}.{tensor.name}"]
            raw = (src / tensor.file).read_bytes()
            for expert in (0, layer.num_experts - 1):
                offset, length = tensor.span(expert)
                one = np.array(stacked[expert].view(mx.uint8))
                assert raw[offset : offset + length] == one.tobytes()


def test_a_bf16_download_is_sent_to_repack(checkpoints):
    with pytest.raises(streamer.StreamerError, match="not MLX-quantized.*--quantize 4"):
        open_download(checkpoints.hf("qwen3_moe"))


def test_verify_records_outside_the_download_and_names_a_bad_expert(download):
    before = listing(download)
    with pytest.raises(streamer.StreamerError, match="no checksums are recorded.*--record"):
        verify(download, **QUIET)
    assert verify(download, record=True, **QUIET) == []
    assert default_sidecar(download).exists() and listing(download) == before  # nothing written
    assert verify(download, **QUIET) == []

    described, _, _ = open_download(download)
    tensor = described.layers[1].tensors[4]  # up_proj.scales
    offset, _ = tensor.span(5)
    flip_byte(download / tensor.file, offset)  # size and time kept: silent corruption
    problems = [str(p) for p in verify(download, **QUIET)]
    assert problems == [
        f"{tensor.file}: MoE layer 1 (model.layers.1.mlp.switch_mlp) expert 5: "
        "tensor up_proj.scales does not match its checksum"
    ]


def test_verify_cli_on_a_download_with_a_chosen_sidecar(download, tmp_path):
    sidecar = tmp_path / "elsewhere" / "sums.json"
    run = [sys.executable, "-m", "streamer", "verify", str(download), "--checksums", str(sidecar)]
    recorded = subprocess.run([*run, "--record"], capture_output=True, text=True)
    assert recorded.returncode == 0, recorded.stderr
    assert f"recorded the checksums of 1 shard(s) in {sidecar}" in recorded.stderr
    checked = subprocess.run(run, capture_output=True, text=True)
    assert checked.returncode == 0 and "every checksum matches" in checked.stderr
    shard = next(download.glob("*.safetensors"))
    os.utime(shard, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns + 10**10))
    changed = subprocess.run(run, capture_output=True, text=True)
    assert changed.returncode == 1 and "changed since its checksums were recorded" in changed.stderr
    assert "Traceback" not in changed.stderr


def test_a_hub_blob_that_does_not_match_its_name_is_not_recorded(download, tmp_path):
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    shard = next(download.glob("*.safetensors"))
    blob = blobs / ("0" * 64)  # a hub cache names each blob by its sha256: this one is wrong
    shard.rename(blob)
    shard.symlink_to(blob)
    problems = verify(download, record=True, **QUIET)
    assert [p.file for p in problems] == [shard.name] and "sha256" in problems[0].what
    assert not default_sidecar(download).exists()
    actual = blobs / hashlib.sha256(blob.read_bytes()).hexdigest()
    blob.rename(actual)
    shard.unlink()
    shard.symlink_to(actual)
    assert verify(download, record=True, **QUIET) == []
    assert default_sidecar(download).exists()
