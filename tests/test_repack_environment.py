"""Repack (and the commands that write) in a hostile environment: a read-only disk, a stale
`.DST.partial` that is a file, paths that are not UTF-8, a missing TMPDIR; each one line."""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from repack_checks import QUIET, snapshot

import streamer
from streamer.errors import StreamerError
from streamer.repack import repack


@pytest.fixture(scope="module")
def small_source(checkpoints) -> Path:
    return checkpoints.hf("qwen3_moe")


def test_a_stale_partial_that_is_a_file(small_source, tmp_path):
    (tmp_path / ".model.partial").write_text("left over")
    with pytest.raises(StreamerError, match=r"\.model\.partial is in the way: it is a file"):
        repack(small_source, tmp_path / "model", **QUIET)
    assert (tmp_path / ".model.partial").read_text() == "left over"


@pytest.mark.parametrize("parts", [("x" * 300, "model"), ("x" * 250,)])  # a name; its .partial
def test_a_destination_name_too_long(small_source, tmp_path, parts):
    with pytest.raises(StreamerError, match=r"is over 255 bytes .*choose a shorter destination"):
        repack(small_source, tmp_path.joinpath(*parts), **QUIET)
    assert list(tmp_path.iterdir()) == []  # nothing written


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


def test_a_folder_of_someone_elses_named_like_the_partial(small_source, tmp_path):
    """A `.model.partial` folder that is not a repack's (no experts/ in it) was removed as "the
    unfinished repack", with what it held."""
    mine = tmp_path / ".model.partial"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(
        StreamerError, match=r"\.model\.partial is in the way: it is a folder without experts/"
    ):
        repack(small_source, tmp_path / "model", **QUIET)
    assert (mine / "notes.txt").read_text() == "keep me"
    (mine / "notes.txt").unlink()  # an empty one (a kill right after it was made) is reused
    repack(small_source, tmp_path / "model", **QUIET)


def test_a_file_size_limit_is_one_line_and_leaves_nothing(small_source, tmp_path):
    """`ulimit -f` (or a FAT32 disk's 4 GiB) fails a write with EFBIG (Python ignores SIGXFSZ).
    At the first file repack wrote a traceback, and split named the source file as the fault."""
    import resource

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))

    def refused(*argv: str) -> str:
        command = [sys.executable, "-m", "streamer", *argv]
        result = subprocess.run(command, capture_output=True, text=True, preexec_fn=limited)
        lines = result.stderr.splitlines()
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
        return lines[-1]

    before = snapshot(small_source)
    model = tmp_path / "model"
    error = refused("repack", str(small_source), str(model))
    assert re.fullmatch(
        r"streamer: error: repacking failed: a file in .* grew past the largest file allowed "
        r"there .*`ulimit -f`\)\. Choose .*, then run the same command again\.",
        error,
    )
    assert list(tmp_path.iterdir()) == [] and snapshot(small_source) == before
    repack(small_source, model, **QUIET)  # once the limit is gone
    error = refused("split", str(model), str(tmp_path / "share"), "--shard", "0/2")
    assert re.fullmatch(r"streamer: error: splitting failed: a file in .* grew past .*", error)
    assert list(tmp_path.iterdir()) == [model]


def test_a_tmpdir_that_cannot_be_written(checkpoints, tmp_path, monkeypatch):
    """MLX compiles its CPU kernels under TMPDIR: one this user cannot write (or on a read-only
    disk) was a RuntimeError traceback at the first token (`cannot create directories`)."""
    import streamer.io.files

    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    # as a folder of another user's answers (root ignores modes)
    monkeypatch.setattr(
        streamer.io.files.os,
        "access",
        lambda path, mode: path != locked and real_access(path, mode),
    )
    monkeypatch.setenv("TMPDIR", str(locked))
    with pytest.raises(
        StreamerError, match=rf"TMPDIR is {locked}, where {locked} cannot be written"
    ):
        streamer.load(checkpoints.repacked(checkpoints.hf("qwen3_moe")))
