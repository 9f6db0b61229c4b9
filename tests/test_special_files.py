"""Special files (a FIFO, a directory) where the tool reads a file of its own or of a download it
streams in place: the checksum sidecar, a routing trace, plan's config.json, repack's progress
file, a download's shard. Each is refused with a line naming it, never waited on (a FIFO opened
for reading blocks until a writer comes). The source's and a repacked folder's files are
tests/test_hostile_sources.py's and tests/test_hostile_repacked.py's."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import private_download
from hostile_files import make_special, refused_without_hanging
from repack_checks import interrupted_repack

import streamer
from streamer.io.checksums import default_sidecar
from streamer.parallel.split import split
from streamer.plan import plan
from streamer.repack import repack
from streamer.verify import verify

QUIET = {"log": lambda _: None}
KINDS = ["fifo", "dir"]


@pytest.fixture
def download(checkpoints, tmp_path, monkeypatch):
    return private_download(checkpoints.mlx("qwen3_moe"), tmp_path, monkeypatch)


@pytest.mark.parametrize("kind", KINDS)
def test_a_special_checksum_sidecar(download, kind):
    sidecar = default_sidecar(download)
    sidecar.parent.mkdir(parents=True, exist_ok=True)
    make_special(sidecar, kind)
    refused_without_hanging(lambda: verify(download, **QUIET), sidecar.name, "not a regular file")
    refused_without_hanging(
        lambda: streamer.load(download, verify_reads=True), sidecar.name, "not a regular file"
    )


@pytest.mark.parametrize("kind", KINDS)
def test_a_special_shard_in_a_download(download, kind):
    shard = sorted(download.glob("*.safetensors"))[0]
    make_special(shard, kind)
    refused_without_hanging(lambda: streamer.load(download), shard.name, "not a regular file")
    refused_without_hanging(
        lambda: verify(download, record=True, **QUIET), shard.name, "not a regular file"
    )


@pytest.mark.parametrize("kind", KINDS)
def test_a_special_routing_trace(checkpoints, tmp_path, kind):
    trace = tmp_path / "trace.npz"
    make_special(trace, kind)
    full = checkpoints.repacked(checkpoints.hf("qwen3_moe"))
    refused_without_hanging(
        lambda: split(full, tmp_path / "share", 0, 2, trace=trace, **QUIET),
        "trace.npz",
        "not a regular file (a routing trace)",
    )
    assert not (tmp_path / "share").exists() and not list(tmp_path.glob(".share*"))


def test_a_special_config_for_plan(tmp_path):
    config = tmp_path / "config.json"
    make_special(config, "fifo")
    refused_without_hanging(lambda: plan(config, 8 << 30), "config.json is a FIFO")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ["experts/001.bin", "resident.safetensors"])
def test_a_special_file_in_a_repacked_folder_plan_reads(checkpoints, tmp_path, name, kind):
    """plan sizes a repacked folder from its files: a FIFO's size (0) would be planned as is."""
    folder = tmp_path / "model"
    shutil.copytree(checkpoints.repacked(checkpoints.hf("qwen3_moe")), folder)
    make_special(folder / name, kind)
    refused_without_hanging(lambda: plan(folder, 8 << 30), name, "not a regular file")


@pytest.mark.parametrize("kind", KINDS)
def test_a_special_progress_file_on_resume(checkpoints, tmp_path, kind):
    src, dst = checkpoints.hf("qwen3_moe"), tmp_path / "model"
    progress = interrupted_repack(src, dst, "layer 2/")  # stopped after the first layer
    json.loads(progress.read_text())  # the interrupted repack kept its progress there
    make_special(progress, kind)
    refused_without_hanging(
        lambda: repack(src, dst, resume=True, **QUIET), "progress.json", "not a regular file"
    )
    assert not dst.exists()
