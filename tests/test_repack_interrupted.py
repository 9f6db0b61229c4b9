"""Repack under faults: a full disk, Ctrl-C, a kill at a random moment, a folder in use.

After any of them the destination is absent or complete and valid, the source is untouched, and
`--resume` finishes the job to the same bytes as an uninterrupted repack. The environment's faults
are tests/test_repack_environment.py's, a lying progress file and kills while publishing
tests/test_resume_faults.py's.
"""

from __future__ import annotations

import builtins
import errno
import gc
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from repack_checks import (
    QUIET,
    assert_absent_or_complete,
    assert_same_model,
    interrupted_repack,
    resumed_by_the_command,
    snapshot,
)

import streamer
from fixtures import tiny_config, write_hf_checkpoint
from streamer.errors import StreamerError
from streamer.repack import repack
from streamer.verify import verify


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    """Six MoE layers of 64 experts: a repack that takes long enough to be interrupted mid-way."""
    config = tiny_config(
        "qwen3_moe", num_hidden_layers=6, num_experts=64, moe_intermediate_size=128
    )
    return write_hf_checkpoint(
        tmp_path_factory.mktemp("faults") / "src", config, shard_bytes=16 << 20
    )


@pytest.fixture(scope="module")
def reference(source, tmp_path_factory) -> Path:
    dst = tmp_path_factory.mktemp("reference") / "model"
    repack(source, dst, **QUIET)
    return dst


def test_disk_full_keeps_finished_layers_and_resume_completes(
    source, reference, tmp_path, monkeypatch
):
    """ENOSPC while writing layer 3: a clear message, no destination, and --resume redoes only
    the rest."""
    real_open = builtins.open

    class FullDisk:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            self.f.write(
                bytes(data)[:1000]
            )  # part of the record reaches the disk, then the disk is full
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    def fake_open(path, mode="r", *args, **kwargs):
        f = real_open(path, mode, *args, **kwargs)
        return FullDisk(f) if str(path).endswith("002.bin") and "w" in mode else f

    before = snapshot(source)
    dst = tmp_path / "model"
    monkeypatch.setattr("streamer.repack.records.open", fake_open, raising=False)
    with pytest.raises(
        StreamerError, match=r"(?s)disk holding .* is full.*iB in all.*--resume"
    ) as err:
        repack(source, dst, **QUIET)
    assert "2/6 MoE layers are kept" in str(err.value)
    monkeypatch.undo()
    assert not dst.exists()
    logs = []
    repack(source, dst, resume=True, log=logs.append)
    assert any("2 MoE layer(s) already done" in line for line in logs)
    assert sum("kept from the interrupted run" in line for line in logs) == 2
    assert_same_model(dst, reference)
    assert snapshot(source) == before


def test_not_enough_disk_space_is_refused_up_front(source, tmp_path, monkeypatch):
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    dst, partial = tmp_path / "model", tmp_path / ".model.partial"
    monkeypatch.setattr(
        "streamer.repack.publish.shutil.disk_usage", lambda _: usage(10**9, 10**9 - 10**6, 10**6)
    )
    with pytest.raises(
        StreamerError,
        match=r"not enough disk space in .*needs about \d+\.\d\d [KM]iB more, 976.56 KiB is free",
    ):
        repack(source, dst, **QUIET)
    assert not dst.exists() and not partial.exists()
    # a resume that cannot finish keeps the work already done
    monkeypatch.undo()

    interrupted_repack(source, dst, "layer 3/6")
    monkeypatch.setattr(
        "streamer.repack.publish.shutil.disk_usage", lambda _: usage(10**9, 10**9 - 10**6, 10**6)
    )
    with pytest.raises(StreamerError, match="iB more"):  # three layers left: about half the space
        repack(source, dst, resume=True, **QUIET)
    assert (partial / "progress.json").exists()


def run_repack(source: Path, dst: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "streamer", "repack", str(source), str(dst)]
    return subprocess.Popen(command, stderr=subprocess.PIPE, text=True)


def wait_for(process: subprocess.Popen, text: str) -> None:
    for line in process.stderr:
        if text in line:
            return
    raise AssertionError(f"repack ended before printing {text!r}")


def test_kill_at_a_random_moment_then_resume(source, reference, tmp_path):
    """SIGKILL (no cleanup possible) anywhere in the writing: never a half-valid destination."""
    dst = tmp_path / "model"
    delay = random.uniform(0.0, 0.6)
    process = run_repack(source, dst)
    wait_for(process, "MoE layers x 64 experts")  # writing starts now
    time.sleep(delay)
    process.kill()
    process.wait()
    complete = assert_absent_or_complete(dst)
    repack(source, dst, resume=True, **QUIET)
    assert_same_model(dst, reference)
    print(f"killed after {delay:.3f}s; destination complete before resume: {complete}")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_keeps_progress_and_says_how_to_resume(source, reference, tmp_path, signum):
    """SIGTERM (`kill`, `systemctl stop`) as Ctrl-C, exit 143: it ended the repack silently."""
    dst = tmp_path / "model"
    process = run_repack(source, dst)
    wait_for(process, "layer 2/6")
    process.send_signal(signum)
    stderr = process.stderr.read()
    assert process.wait() == 128 + signum, stderr
    assert "interrupted" in stderr and "--resume" in stderr and "Traceback" not in stderr
    assert not dst.exists()
    assert (tmp_path / ".model.partial" / "progress.json").exists()
    resumed_by_the_command(source, dst)
    assert_same_model(dst, reference)


def test_resume_refuses_a_different_source(source, tmp_path):
    dst = tmp_path / "model"
    partial = tmp_path / ".model.partial"

    interrupted_repack(source, dst, "layer 1/6")
    assert (partial / "progress.json").exists()
    from streamer.repack import Quantize

    with pytest.raises(
        StreamerError, match="different checkpoint or with other options.*without --resume"
    ):
        repack(source, dst, resume=True, quantize=Quantize(4), **QUIET)
    assert (partial / "progress.json").exists(), "a refused resume must keep the finished work"
    repack(source, dst, **QUIET)  # without --resume: starts over
    assert not partial.exists() and verify(dst, **QUIET) == []


def test_resume_of_a_complete_destination_is_a_no_op(reference):
    before = snapshot(reference)
    repack("/nonexistent", reference, resume=True, **QUIET)
    assert snapshot(reference) == before


def test_repack_refuses_to_replace_a_folder_being_read(reference, tmp_path, source):
    import shutil

    folder = tmp_path / "model"
    shutil.copytree(reference, folder)
    model, _ = streamer.load(folder)
    with pytest.raises(StreamerError, match="in use.*another process has a model loaded"):
        repack(source, folder, force=True, **QUIET)
    assert verify(folder, **QUIET) == []  # untouched
    del model
    gc.collect()
    repack(source, folder, force=True, **QUIET)


def test_two_repacks_into_the_same_destination(source, tmp_path):
    from streamer.io.lock import lock_directory

    partial = tmp_path / ".model.partial"
    partial.mkdir()
    fd = lock_directory(partial)  # as a running repack holds it
    try:
        with pytest.raises(StreamerError, match="in use by another `streamer repack`"):
            repack(source, tmp_path / "model", **QUIET)
    finally:
        os.close(fd)
    assert partial.exists()


@pytest.mark.parametrize("race", ["created", "removed"])
def test_two_repacks_starting_at_the_same_moment(source, tmp_path, monkeypatch, race):
    """Another repack into the same destination creates (or removes, as stale) the partial folder
    between this one's look at it and its lock: "cannot create .model.partial: File exists;
    choose a destination on a writable disk, or fix the permissions", or a FileNotFoundError
    traceback."""
    import shutil

    from streamer.repack import publish

    partial = tmp_path / ".model.partial"
    make_partial = publish.make_partial

    def racing(path):
        if race == "created":
            (path / "experts").mkdir(parents=True)  # the other repack's, made just now
            make_partial(path)
        else:
            make_partial(path)
            shutil.rmtree(path)  # the other repack took it for a stale one

    monkeypatch.setattr(publish, "make_partial", racing)
    with pytest.raises(StreamerError, match="in use by another `streamer repack`"):
        repack(source, tmp_path / "model", **QUIET)
    assert not (tmp_path / "model").exists()
    assert partial.exists() == (race == "created"), "the other repack's folder is left alone"
