"""Resume from a progress file that lies or is malformed, and kills at each atomic step of
publishing: never a published folder that `streamer.load` refuses, never finished work lost."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from repack_checks import (
    QUIET,
    assert_same_model,
    interrupted_repack,
    rewrite,
    rewrite_at_its_size,
)

import streamer
from fixtures import muse_spark, tiny_config, write_hf_checkpoint
from streamer.errors import StreamerError
from streamer.repack import repack
from streamer.verify import verify


@pytest.fixture(scope="module")
def small_source(checkpoints) -> Path:
    return checkpoints.hf("qwen3_moe")


def _crc(state):
    state["layers"]["0"]["experts"][3]["crc32"][0] ^= 1


def _shape(state):
    state["layers"]["0"]["tensors"][0]["shape"][0] //= 2
    state["layers"]["0"]["tensors"][0]["nbytes"] //= 2


def _module(state):
    state["layers"]["0"]["module"] = "model.layers.1.mlp.switch_mlp"


def _resident(state):
    name = next(iter(state["resident"]))
    state["resident"][name] ^= 1


def _index(state):
    state["layers"]["5"] = state["layers"].pop("0")


@pytest.mark.parametrize("tamper", [_crc, _shape, _module, _resident, _index])
def test_a_tampered_progress_file_never_publishes_a_bad_folder(small_source, tmp_path, tamper):
    dst = tmp_path / "model"
    progress = interrupted_repack(small_source, dst, "layer 2/2")
    state = json.loads(progress.read_text())
    tamper(state)
    progress.write_text(json.dumps(state))
    messages = []
    repack(small_source, dst, resume=True, log=messages.append)
    assert any("does not match its record: writing it again" in m for m in messages), messages
    assert verify(dst, **QUIET) == []
    streamer.load(dst)


def test_a_shard_rewritten_at_its_size_is_refused(small_source, tmp_path):
    """A new revision of a shard at the same size (a header alike) resumed: the layers written
    before were from the old one, those after from the new. Now refused, naming the shard, the
    finished work kept."""
    source, dst = tmp_path / "src", tmp_path / "model"
    shutil.copytree(small_source, source)
    progress = interrupted_repack(source, dst, "layer 2/2")
    shard = sorted(source.glob("model*.safetensors"))[-1]
    rewrite_at_its_size(shard)
    before = progress.read_bytes()
    with pytest.raises(
        StreamerError,
        match=f"^source file {shard.name} changed since this repack started .*restore that file, "
        "or rerun without --resume to start over",
    ):
        repack(source, dst, resume=True, **QUIET)
    assert progress.read_bytes() == before
    repack(source, dst, **QUIET)  # without --resume: starts over
    assert verify(dst, **QUIET) == []


def test_a_quantization_sidecar_rewritten_is_refused(tmp_path):
    """hf_quant_config.json, where config.json has no quantization, says how the tensors are
    quantized, but only config.json was in what a resume checks: a new revision of it resumed."""
    src, dst = tmp_path / "src", tmp_path / "model"
    write_hf_checkpoint(src, tiny_config("muse_spark"), pack=muse_spark.FORMAT)
    config = json.loads((src / "config.json").read_text())
    del config["quantization_config"]
    (src / "config.json").write_text(json.dumps(config))
    sidecar = src / "hf_quant_config.json"
    sidecar.write_text(json.dumps(muse_spark.hf_quant_config(config)))
    progress = interrupted_repack(src, dst, "layer 2/")
    changed = muse_spark.hf_quant_config(config)
    changed["quantization"]["exclude_modules"] = ["lm_head"]
    rewrite(sidecar, json.dumps(changed).encode())
    before = progress.read_bytes()
    with pytest.raises(StreamerError, match="^source file hf_quant_config.json changed since"):
        repack(src, dst, resume=True, **QUIET)
    assert progress.read_bytes() == before


@pytest.mark.parametrize(
    "state",
    [
        {"layers": [1, 2]},
        {"resident": "x"},
        {"layers": {"x": {}}},
        {"layers": {"0": 3}},
        {"files": ["model.safetensors"]},
    ],
)
def test_a_malformed_progress_file_is_refused(small_source, tmp_path, state):
    dst = tmp_path / "model"
    progress = interrupted_repack(small_source, dst, "layer 2/2")
    source = json.loads(progress.read_text())["source"]
    progress.write_text(json.dumps({"source": source, **state}))
    with pytest.raises(StreamerError, match="progress.json is damaged: rerun without --resume"):
        repack(small_source, dst, resume=True, **QUIET)


KILL_AT_NTH_REPLACE = """
import os, sys
from streamer.repack import repack
real, calls = os.replace, []
def replace(a, b):
    calls.append(b)
    if len(calls) == int(sys.argv[3]):
        os._exit(9)  # as SIGKILL: no cleanup runs
    real(a, b)
os.replace = replace
repack(sys.argv[1], sys.argv[2], force=True, log=lambda _: None)
"""


def test_a_kill_at_each_step_of_publishing_costs_nothing_finished(small_source, tmp_path):
    """Kills at the last atomic steps: the manifest's rename, moving the old output aside,
    renaming the new one into place. Each leaves DST complete (old or new) or absent with the
    finished work in .DST.partial, and --resume (or nothing) gives the same model."""
    reference = tmp_path / "reference"
    repack(small_source, reference, **QUIET)
    replaces = []
    real = os.replace
    try:
        os.replace = lambda a, b: (replaces.append(b), real(a, b))
        repack(small_source, reference, force=True, **QUIET)  # count them, replacing an output
    finally:
        os.replace = real
    for nth in range(len(replaces) - 2, len(replaces) + 1):
        dst = tmp_path / f"model{nth}"
        repack(small_source, dst, **QUIET)  # an older output, replaced with --force
        result = subprocess.run(
            [sys.executable, "-c", KILL_AT_NTH_REPLACE, str(small_source), str(dst), str(nth)],
            capture_output=True,
            text=True,
        )
        assert result.returncode == 9, result.stderr
        if dst.exists():
            assert verify(dst, **QUIET) == []
        repack(small_source, dst, resume=True, force=True, **QUIET)
        assert_same_model(dst, reference)
        assert not list(tmp_path.glob(f".model{nth}.*"))


def test_an_interrupted_json_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    """progress.json, manifest.json and the checksum sidecar are written through a temporary:
    Ctrl-C (or a full disk) before the rename leaves the old file whole and no temporary."""
    from streamer.io.durable import write_json_atomic

    path = tmp_path / "progress.json"
    write_json_atomic(path, {"done": 1})

    def interrupted(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr("streamer.io.durable.os.fsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_json_atomic(path, {"done": 2})
    assert json.loads(path.read_text()) == {"done": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["progress.json"]
