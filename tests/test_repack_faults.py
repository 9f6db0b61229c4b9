"""Repack under faults: a full disk, Ctrl-C, a kill at a random moment, a folder in use.

After any of them the destination is absent or complete and valid, the source is untouched, and
`--resume` finishes the job to the same bytes as an uninterrupted repack.
"""

from __future__ import annotations

import builtins
import errno
import gc
import hashlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import streamer
from fixtures import tiny_config, write_hf_checkpoint
from streamer.errors import StreamerError
from streamer.repack import repack
from streamer.verify import verify

QUIET = {"log": lambda _: None}


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


def snapshot(folder: Path) -> dict[str, tuple[int, str]]:
    """(mtime_ns, sha256) of every file: proves a folder was not touched."""
    return {
        str(p.relative_to(folder)): (
            p.stat().st_mtime_ns,
            hashlib.sha256(p.read_bytes()).hexdigest(),
        )
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def assert_same_model(folder: Path, reference: Path) -> None:
    """Byte-identical files; the manifest identical except the recorded file times."""
    names = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    assert names == sorted(
        str(p.relative_to(reference)) for p in reference.rglob("*") if p.is_file()
    )
    for name in names:
        if name != "manifest.json":
            assert (folder / name).read_bytes() == (reference / name).read_bytes(), name
    ours, theirs = (json.loads((f / "manifest.json").read_text()) for f in (folder, reference))
    assert ours.pop("files").keys() == theirs.pop("files").keys()
    assert ours == theirs
    assert verify(folder, **QUIET) == []


def assert_absent_or_complete(dst: Path) -> bool:
    if dst.exists():
        assert verify(dst, **QUIET) == []
    return dst.exists()


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
    with pytest.raises(StreamerError, match=r"(?s)disk holding .* is full.*GB.*--resume") as err:
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
        StreamerError, match=r"not enough disk space in .*needs about 0.04 GB more, 0.00 GB is free"
    ):
        repack(source, dst, **QUIET)
    assert not dst.exists() and not partial.exists()
    # a resume that cannot finish keeps the work already done
    monkeypatch.undo()

    def interrupt(msg):
        if "layer 3/6" in msg:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        repack(source, dst, log=interrupt)
    monkeypatch.setattr(
        "streamer.repack.publish.shutil.disk_usage", lambda _: usage(10**9, 10**9 - 10**6, 10**6)
    )
    with pytest.raises(StreamerError, match="GB more"):  # three layers left: about half the space
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


def test_ctrl_c_keeps_progress_and_says_how_to_resume(source, reference, tmp_path):
    dst = tmp_path / "model"
    process = run_repack(source, dst)
    wait_for(process, "layer 2/6")
    process.send_signal(signal.SIGINT)
    stderr = process.stderr.read()
    assert process.wait() == 130, stderr
    assert "interrupted" in stderr and "--resume" in stderr and "Traceback" not in stderr
    assert not dst.exists()
    assert (tmp_path / ".model.partial" / "progress.json").exists()
    result = subprocess.run(
        [sys.executable, "-m", "streamer", "repack", str(source), str(dst), "--resume"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert "kept from the interrupted run" in result.stderr
    assert_same_model(dst, reference)


def test_resume_refuses_a_different_source(source, tmp_path):
    dst = tmp_path / "model"
    partial = tmp_path / ".model.partial"

    def interrupt(msg):
        if "layer 1/6" in msg:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        repack(source, dst, log=interrupt)
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
    fd = lock_directory(partial, "test")  # as a running repack holds it
    try:
        with pytest.raises(StreamerError, match="in use by another `streamer repack`"):
            repack(source, tmp_path / "model", **QUIET)
    finally:
        os.close(fd)
    assert partial.exists()


# -- the environment: read-only disks, files in the way, odd paths ---------------------------------


@pytest.fixture(scope="module")
def small_source(tmp_path_factory) -> Path:
    return write_hf_checkpoint(tmp_path_factory.mktemp("env") / "src", tiny_config("qwen3_moe"))


def test_a_stale_partial_that_is_a_file(small_source, tmp_path):
    (tmp_path / ".model.partial").write_text("left over")
    with pytest.raises(StreamerError, match=r"\.model\.partial is in the way: it is a file"):
        repack(small_source, tmp_path / "model", **QUIET)
    assert (tmp_path / ".model.partial").read_text() == "left over"


def test_a_read_only_destination(small_source, tmp_path, monkeypatch):
    real_mkdir = Path.mkdir

    def read_only(self, *args, **kwargs):  # as a read-only mount answers (root ignores modes)
        if tmp_path in (self, *self.parents):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", read_only)
    with pytest.raises(StreamerError, match="cannot create .*Read-only file system; choose"):
        repack(small_source, tmp_path / "model", **QUIET)


# Run inside a private mount namespace (`unshare`), so the mount is seen by nothing else and
# goes away with the process: the tree is bound read-only onto itself, then each command runs as
# the program runs it (streamer.cli.main), its status and output recorded.
READ_ONLY_RUN = """
import contextlib, io, json, subprocess, sys, traceback
tree, commands = sys.argv[1], json.loads(sys.argv[2])
for mount in (["mount", "--bind", tree, tree], ["mount", "-o", "remount,ro,bind", tree]):
    if subprocess.run(mount, capture_output=True).returncode != 0:
        sys.exit(77)
from streamer.cli import main
results = []
for argv in commands:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(argv)
        except BaseException:
            status, err = "traceback", io.StringIO(traceback.format_exc())
    results.append([status, out.getvalue(), err.getvalue()])
print(json.dumps(results))
"""


def test_a_real_read_only_file_system(checkpoints, tmp_path):
    """A model on a read-only volume loads and verifies; what would write there (repack, split,
    --refresh, --record) is one line, and nothing there changes."""
    import shutil

    if shutil.which("unshare") is None:
        pytest.skip("no `unshare` here to mount a read-only file system in private")
    tree = tmp_path / "read-only"
    tree.mkdir()
    shutil.copytree(checkpoints.mlx("qwen3_moe"), tree / "download")
    shutil.copytree(checkpoints.repacked(checkpoints.hf("qwen3_moe")), tree / "model")
    for path in (tree / "model").rglob("*"):  # a copy with other times: --refresh would write
        os.utime(path, (1e9, 1e9))
    before = snapshot(tree)
    src, model = str(checkpoints.hf("qwen3_moe")), str(tree / "model")
    prompt = ["--prompt", "The file", "--max-tokens", "3", "--ignore-chat-template"]
    commands = [
        ["repack", src, str(tree / "new")],
        ["repack", src, model, "--force"],
        ["split", model, str(tree / "share"), "--shard", "0/2"],
        ["verify", model, "--refresh"],
        ["verify", str(tree / "download"), "--record", "--checksums", str(tree / "sums.json")],
        ["verify", model],
        ["generate", "--model", model, *prompt],
        ["generate", "--model", str(tree / "download"), *prompt],
    ]
    env = {**os.environ, "STREAMER_CACHE_DIR": str(tmp_path / "cache")}
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", sys.executable, "-c", READ_ONLY_RUN]
        + [str(tree), json.dumps(commands)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    if result.returncode == 77 or "unshare failed" in result.stderr:
        pytest.skip(f"mounting is not permitted here: {result.stderr.strip()[:200]}")
    assert result.returncode == 0, result.stderr[-3000:]
    outcomes = json.loads(result.stdout.splitlines()[-1])
    refusals = {
        0: "cannot create .*\\.new\\.partial: Read-only file system; choose a destination",
        1: "cannot create .*\\.model\\.partial: Read-only file system",
        2: "cannot create .*\\.share\\.partial: Read-only file system",
        3: "cannot write .*manifest.json: Read-only file system; the folder loads as it is",
        4: "cannot write .*sums.json: Read-only file system; name a writable file",
    }
    for index, pattern in refusals.items():
        status, _, stderr = outcomes[index]
        errors = [line for line in stderr.splitlines() if line.startswith("streamer: error")]
        assert status == 2 and len(errors) == 1, (commands[index], stderr)
        assert re.search(pattern, errors[0]), (commands[index], errors[0])
    for index in (5, 6, 7):  # reading works as on any disk
        status, stdout, stderr = outcomes[index]
        assert status == 0 and "Traceback" not in stderr, (commands[index], stderr)
    assert outcomes[6][1].strip() and outcomes[7][1].strip()
    assert snapshot(tree) == before


def test_paths_that_are_not_utf8(small_source, tmp_path):
    import shutil

    odd = Path(os.fsdecode(bytes(tmp_path) + b"/caf\xe9"))
    shutil.copytree(small_source, odd)
    for src, dst in ((odd, tmp_path / "model"), (small_source, Path(f"{odd}-out"))):
        with pytest.raises(StreamerError, match=r"caf\\xe9.* is not valid UTF-8.*rename"):
            repack(src, dst, **QUIET)
    with pytest.raises(StreamerError, match=r"caf\\xe9.* is not valid UTF-8"):
        streamer.load(odd)
    result = subprocess.run(
        [sys.executable, "-m", "streamer", "repack", os.fsencode(odd), str(tmp_path / "m")],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and "not valid UTF-8" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_missing_tmpdir(small_source, tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path / "nonexistent")}
    dst = tmp_path / "model"
    command = [sys.executable, "-m", "streamer"]
    result = subprocess.run(
        [*command, "repack", str(small_source), str(dst)], capture_output=True, text=True, env=env
    )
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    generate = ["generate", "--model", str(dst), "--prompt", "x", "--max-tokens", "2"]
    result = subprocess.run([*command, *generate], capture_output=True, text=True, env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "nonexistent, which is not a folder: MLX writes its compiled kernels there" in (
        result.stderr
    )


# -- resume from a sidecar that lies; a kill at each step of publishing ----------------------------


def interrupted_repack(source: Path, dst: Path, after: str) -> Path:
    def interrupt(message):
        if after in message:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        repack(source, dst, log=interrupt)
    return dst.parent / f".{dst.name}.partial" / "progress.json"


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


@pytest.mark.parametrize(
    "state", [{"layers": [1, 2]}, {"resident": "x"}, {"layers": {"x": {}}}, {"layers": {"0": 3}}]
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
