"""`streamer pull` against a Hub served from this machine (tests/local_hub.py): the installed
huggingface_hub downloads over HTTP into a Hugging Face cache in a tmp folder; then the name
generates, as a folder would."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from huggingface_hub import constants, hf_hub_download
from huggingface_hub.utils import filter_repo_objects
from local_hub import LocalHub, commit_of

import streamer
from fixtures import tiny_config, write_hf_checkpoint
from streamer.cli import main
from streamer.loading.hub import ALLOW_PATTERNS
from streamer.pull import own_files, pull
from streamer.repack import repack
from streamer.repack.recipe import Quantize

TEMPLATE = "/{repo_id}/resolve/{revision}/{filename}"  # huggingface_hub's, after ENDPOINT
GENERATE = ["--prompt", "def read(path):", "--max-tokens", "6"]


@pytest.fixture
def hub(tmp_path, checkpoints):
    hub = LocalHub(
        {
            "tiny-org/Tiny-MLX": checkpoints.mlx("qwen3_moe"),
            "tiny-org/Tiny-BF16": checkpoints.hf("qwen3_moe"),
        }
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE"))}
    hub.env = {
        **env,
        "HF_ENDPOINT": hub.url,
        "HF_HUB_CACHE": str(tmp_path / "hf-cache"),
        "STREAMER_CACHE_DIR": str(tmp_path / "streamer-cache"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
    yield hub
    hub.close()


def start(hub: LocalHub, *args: str, **popen) -> subprocess.Popen:
    """`streamer ARGS` with HF_ENDPOINT at the local hub and the caches in tmp folders."""
    popen = {"stdin": subprocess.DEVNULL, "stderr": subprocess.PIPE, **popen}
    return subprocess.Popen(
        [sys.executable, "-m", "streamer", *args],
        env=hub.env,
        stdout=subprocess.PIPE,
        text=True,
        **popen,
    )


def run(hub: LocalHub, *args: str) -> tuple[int, str, str]:
    process = start(hub, *args)
    out, err = process.communicate(timeout=300)
    return process.returncode, out, err


def generated(model: str | Path, capsys) -> str:
    """What `streamer generate` prints for the folder (or name), in this process."""
    assert main(["generate", "--model", str(model), *GENERATE]) == 0
    return capsys.readouterr().out


@pytest.fixture
def here(hub, monkeypatch):
    """This process looks names up where the pulls put them (offline: a lookup never fetches)."""
    monkeypatch.setattr(constants, "HF_HUB_CACHE", hub.env["HF_HUB_CACHE"])  # read at import
    monkeypatch.setenv("STREAMER_CACHE_DIR", hub.env["STREAMER_CACHE_DIR"])


def test_pull_an_mlx_download_then_generate_by_name(hub, here, checkpoints, capsys):
    status, _, err = run(hub, "pull", "tiny-org/Tiny-MLX")
    assert status == 0 and "streams in place" in err, err
    assert "Downloading" in err or "Fetching" in err  # huggingface_hub's progress
    fetched = [p.split("/", 5)[-1] for m, p, _ in hub.requests if m == "GET" and "/resolve/" in p]
    wanted = list(
        filter_repo_objects(hub.files("tiny-org/Tiny-MLX"), allow_patterns=ALLOW_PATTERNS)
    )
    assert sorted(fetched) == wanted and "README.md" not in wanted  # what mlx-lm's loader takes
    asked = len(hub.requests)
    # the name is its snapshot in the cache, looked up offline
    assert generated("tiny-org/Tiny-MLX", capsys) == generated(checkpoints.mlx("qwen3_moe"), capsys)
    assert main(["info", "tiny-org/Tiny-MLX"]) == 0 and "in place" in capsys.readouterr().out
    assert main(["verify", "tiny-org/Tiny-MLX", "--record"]) == 0
    texts = [  # the Python API takes the name too
        streamer.generate(*streamer.load(model), "def read(path):", 6)
        for model in ("tiny-org/Tiny-MLX", checkpoints.mlx("qwen3_moe"))
    ]
    assert texts[0] == texts[1]
    assert len(hub.requests) == asked


def test_pull_a_bf16_download_repacked_to_4_bits(hub, here, checkpoints, tmp_path, capsys):
    status, _, err = run(hub, "pull", "tiny-org/Tiny-BF16", "--quantize", "4", "--delete-source")
    assert status == 0, err
    pulled = tmp_path / "streamer-cache" / "models" / "tiny-org--Tiny-BF16"
    assert (pulled / "manifest.json").is_file(), err
    assert "deleted source shard" in err
    # --delete-source: one copy on disk, the repacked one
    assert not (tmp_path / "hf-cache" / "models--tiny-org--Tiny-BF16").exists()
    reference = tmp_path / "reference"
    repack(checkpoints.hf("qwen3_moe"), reference, quantize=Quantize(4, 64), log=lambda _: None)
    assert generated("tiny-org/Tiny-BF16", capsys) == generated(reference, capsys)
    asked = len(hub.requests)
    assert main(["pull", "tiny-org/Tiny-BF16"]) == 0  # pulled already: no request
    assert "pulled already" in capsys.readouterr().err and len(hub.requests) == asked
    assert main(["info", "tiny-org/Tiny-BF16"]) == 0
    assert "4-bit" in capsys.readouterr().out


def test_a_pull_interrupted_while_repacking_resumes_without_fetching_again(
    hub, here, checkpoints, tmp_path, monkeypatch, capsys
):
    """Stopped once --delete-source has deleted a shard: the next pull finishes the repack from
    its stand-ins, and fetches nothing (the shards it consumed are not downloaded again)."""
    monkeypatch.setattr(constants, "ENDPOINT", hub.url)  # both read at import time
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", hub.url + TEMPLATE)
    name, quantize = "tiny-org/Tiny-BF16", Quantize(4, 64)

    def interrupt(line: str) -> None:
        if "deleted source shard" in line:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pull(name, quantize=quantize, delete_source=True, log=interrupt)
    first = len(hub.requests)
    folder = pull(name, quantize=quantize, delete_source=True, log=lambda _: None)
    assert not [p for _, p, _ in hub.requests[first:] if "/resolve/" in p]
    reference = tmp_path / "reference"
    repack(checkpoints.hf("qwen3_moe"), reference, quantize=quantize, log=lambda _: None)
    assert generated(name, capsys) == generated(reference, capsys)
    assert folder == tmp_path / "streamer-cache" / "models" / "tiny-org--Tiny-BF16"


def test_a_pull_with_other_options_starts_an_unfinished_repack_over(
    hub, here, checkpoints, tmp_path, monkeypatch, capsys
):
    """A pull resumes the repack an earlier one left; one of another revision or other options
    was refused with "rerun without --resume", which pull has not: every pull failed alike."""
    monkeypatch.setattr(constants, "ENDPOINT", hub.url)  # both read at import time
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", hub.url + TEMPLATE)
    name, lines = "tiny-org/Tiny-BF16", []

    def interrupt(line: str) -> None:
        if "layer 2/2" in line:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        pull(name, quantize=Quantize(4, 64), log=interrupt)
    folder = pull(name, quantize=Quantize(8, 64), log=lines.append)
    assert any("is the repack of another revision or options: starting over" in x for x in lines)
    reference = tmp_path / "reference"
    repack(checkpoints.hf("qwen3_moe"), reference, quantize=Quantize(8, 64), log=lambda _: None)
    assert generated(folder, capsys) == generated(reference, capsys)


def test_a_pull_without_quantize_says_it_repacks_unquantized(hub, here, monkeypatch):
    """A bf16 download pulled without --quantize is repacked as it is (as mlx_lm.convert without
    -q): 3.5x the disk of 4 bits, said nowhere, though the README's pull has --quantize 4."""
    monkeypatch.setattr(constants, "ENDPOINT", hub.url)  # both read at import time
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", hub.url + TEMPLATE)
    lines = []
    pull("tiny-org/Tiny-BF16", log=lines.append)
    said = next(x for x in lines if "is not MLX-quantized: repacking it" in x)
    assert "unquantized" in said and "--quantize 4" in said, said
    lines.clear()
    pull("tiny-org/Tiny-BF16", quantize=Quantize(4, 64), force=True, log=lines.append)
    said = next(x for x in lines if "is not MLX-quantized: repacking it" in x)
    assert "unquantized" not in said, said


def test_an_interrupted_pull_resumes(hub, here, checkpoints, tmp_path, capsys):
    """Killed while a file comes: the next pull fetches only that file; a connection cut midway
    resumes from the byte it reached (a Range request)."""
    repo = "tiny-org/Tiny-MLX"
    folder = hub.repos[repo] = tmp_path / "repo"
    shutil.copytree(checkpoints.mlx("qwen3_moe"), folder)
    # http_get resumes from what it has written, which comes in DOWNLOAD_CHUNK_SIZE reads: a file
    # past two of them is cut after one
    big = "eval_results.jsonl"
    (folder / big).write_bytes(os.urandom(2 * constants.DOWNLOAD_CHUNK_SIZE + 4096))
    hub.hang = {big}
    process = start(hub, "pull", repo)
    files = list(filter_repo_objects(hub.files(repo), allow_patterns=ALLOW_PATTERNS))
    others = [f for f in files if f != big]
    snapshot = tmp_path / "hf-cache" / "models--tiny-org--Tiny-MLX" / "snapshots" / commit_of(repo)
    deadline = time.monotonic() + 120
    while not (hub.hanging.is_set() and all((snapshot / f).exists() for f in others)):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)  # mid-file, as a power cut or `kill -9` stops it
    process.communicate()
    blobs = snapshot.parent.parent / "blobs"
    assert list(blobs.glob("*.incomplete"))  # what huggingface_hub leaves of the file
    hub.hang = set()
    hub.release.set()
    hub.drop_once = {big}
    first = len(hub.requests)
    status, _, err = run(hub, "pull", repo)
    assert status == 0, err
    again = [(m, p, r) for m, p, r in hub.requests[first:] if "/resolve/" in p]
    assert {p.rsplit("/", 1)[-1] for _, p, _ in again} == {big}  # the others were kept
    ranges = [r for m, _, r in again if m == "GET" and r]
    assert ranges == [f"bytes={constants.DOWNLOAD_CHUNK_SIZE}-"], again
    assert (snapshot / big).read_bytes() == (folder / big).read_bytes()
    assert not list(blobs.glob("*.incomplete"))  # the killed pull's part-file is gone
    assert generated(repo, capsys) == generated(checkpoints.mlx("qwen3_moe"), capsys)


def test_missing_names_say_what_to_do_in_one_line(hub, here, monkeypatch, capsys):
    """In this process, huggingface_hub pointed at the local hub and an empty cache."""
    monkeypatch.setattr(constants, "ENDPOINT", hub.url)  # read at import time

    def one_line(argv: list[str]) -> str:
        assert main(argv) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1, lines
        return lines[0]

    assert "tiny-org/Missing is not on the Hub" in one_line(["pull", "tiny-org/Missing"])
    # not downloaded, and no one at a terminal to ask (stdin is not one): the command that
    # pulls it, no prompt
    for argv in (
        ["generate", "--model", "tiny-org/Tiny-MLX", *GENERATE],
        ["chat", "--model", "tiny-org/Tiny-MLX"],
        ["serve", "--model", "tiny-org/Tiny-MLX"],
        ["info", "tiny-org/Tiny-MLX"],
        ["verify", "tiny-org/Tiny-MLX"],
    ):
        assert "download it with `streamer pull tiny-org/Tiny-MLX`" in one_line(argv), argv
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    offline = one_line(["pull", "tiny-org/Tiny-MLX"])
    # it said "the files fetched so far are kept" with none fetched
    assert "cannot reach the Hub" in offline and "none of its files was fetched" in offline
    assert "fetched so far" not in offline, offline
    with monkeypatch.context() as reachable:
        reachable.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", hub.url + TEMPLATE)
        hf_hub_download("tiny-org/Tiny-MLX", "config.json")  # as plan's advice fetches it alone
    assert "the files fetched so far are kept" in one_line(["pull", "tiny-org/Tiny-MLX"])


def test_at_a_terminal_generate_offers_to_pull(hub, checkpoints, capsys):
    """stdin and stderr a terminal (a pseudo-terminal here): asked, a yes pulls, then it runs."""
    primary, secondary = pty.openpty()
    process = start(
        hub,
        "generate",
        "--model",
        "tiny-org/Tiny-MLX",
        *GENERATE,
        stdin=secondary,
        stderr=secondary,
    )
    os.close(secondary)
    seen = b""
    deadline = time.monotonic() + 120
    while b"[y/N]" not in seen:
        assert process.poll() is None and time.monotonic() < deadline, seen
        if select.select([primary], [], [], 0.1)[0]:
            seen += os.read(primary, 4096)
    assert b"streamer pull tiny-org/Tiny-MLX" in seen
    os.write(primary, b"y\n")
    with contextlib.suppress(OSError):  # the terminal's other side closes when the process ends
        while process.poll() is None or select.select([primary], [], [], 0)[0]:
            if select.select([primary], [], [], 0.1)[0]:
                seen += os.read(primary, 65536)
    os.close(primary)
    out = process.stdout.read()
    assert process.wait() == 0, seen.decode(errors="replace")
    assert out == generated(checkpoints.mlx("qwen3_moe"), capsys)


@pytest.fixture
def in_process(hub, here, monkeypatch):
    """This process's huggingface_hub pointed at the local hub (both read at import time)."""
    monkeypatch.setattr(constants, "ENDPOINT", hub.url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", hub.url + TEMPLATE)


def refused(argv: list[str], capsys) -> str:
    """The one error line (after huggingface_hub's progress bars, if it downloaded)."""
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    errors = [line for line in lines if "error" in line or "Traceback" in line]
    assert len(errors) == 1 and lines[-1] == errors[0], lines
    return errors[0]


def test_a_repo_without_a_model_that_streams_is_refused_before_its_weights(
    hub, in_process, checkpoints, tmp_path, capsys
):
    """Only a README and a license, or an MLX download of a dense model: refused at pull in one
    line saying what the repo holds and why it cannot stream (it said "ready", then generate
    called the cache's copy damaged and said to pull again)."""
    docs = hub.repos["tiny-org/Docs"] = tmp_path / "docs"
    docs.mkdir()
    (docs / "README.md").write_text("# a model card\n")
    (docs / "LICENSE").write_text("MIT\n")
    line = refused(["pull", "tiny-org/Docs"], capsys)
    assert "tiny-org/Docs holds LICENSE, README.md, but no config.json and no model" in line
    dense = hub.repos["tiny-org/Dense-MLX"] = tmp_path / "dense"
    shutil.copytree(checkpoints.mlx("qwen3_moe"), dense)
    config = json.loads((dense / "config.json").read_text())
    (dense / "config.json").write_text(json.dumps({**config, "model_type": "qwen3"}))
    line = refused(["pull", "tiny-org/Dense-MLX"], capsys)
    assert "tiny-org/Dense-MLX: config.json: model_type 'qwen3'" in line and "not a MoE" in line
    fetched = [p for m, p, _ in hub.requests if m == "GET" and "/resolve/" in p]
    assert fetched == [
        "/tiny-org/Dense-MLX/resolve/" + commit_of("tiny-org/Dense-MLX") + "/config.json"
    ]  # no weights downloaded


def test_fp8_that_the_family_s_sanitize_keeps_is_refused_before_its_weights(
    hub, in_process, tmp_path, capsys
):
    """Qwen3's FP8 releases (128x128 block scales, which mlx-lm's qwen3_moe does not dequantize):
    refused from config.json alone; pull downloaded every weight before repack refused them."""
    hub.repos["tiny-org/Tiny-FP8"] = write_hf_checkpoint(
        tmp_path / "fp8", tiny_config("qwen3_moe"), fp8=True
    )
    line = refused(["pull", "tiny-org/Tiny-FP8"], capsys)
    assert "FP8 weights with block scales" in line and "not for qwen3_moe" in line, line
    fetched = [p for m, p, _ in hub.requests if m == "GET" and "/resolve/" in p]
    assert not any(p.endswith(".safetensors") for p in fetched), fetched
    assert any(p.endswith("/config.json") for p in fetched), fetched


def test_a_weight_file_that_differs_from_the_hubs_sha256_is_removed_and_refused(
    hub, in_process, checkpoints, tmp_path, monkeypatch, capsys
):
    repo = "tiny-org/Tiny-MLX"
    shard = sorted(f for f in hub.files(repo) if f.endswith(".safetensors"))[0]
    hub.corrupt = {shard}
    line = refused(["pull", repo], capsys)
    assert f"{shard} of {repo} does not match the sha256 the Hub lists" in line, line
    snapshot = tmp_path / "hf-cache" / "models--tiny-org--Tiny-MLX" / "snapshots" / commit_of(repo)
    assert not (snapshot / shard).exists() and not os.path.lexists(snapshot / shard)
    assert (snapshot / "config.json").exists()  # the rest is kept for the next pull
    hub.corrupt = set()
    first = len(hub.requests)
    assert main(["pull", repo]) == 0, capsys.readouterr().err
    again = {
        p.rsplit("/", 1)[-1] for m, p, _ in hub.requests[first:] if m == "GET" and "/resolve/" in p
    }
    assert again == {shard}  # the files that were right are kept
    assert generated(repo, capsys) == generated(checkpoints.mlx("qwen3_moe"), capsys)
    # the Hub unreachable: the snapshot the cache holds, as before the Hub's list was asked for
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    assert main(["pull", repo]) == 0 and "streams in place" in capsys.readouterr().err


def test_weight_files_are_hashed_as_they_land(tmp_path):
    """While the download goes on: a file that lands is hashed then, not after the last one."""
    import hashlib

    from streamer.pulled_files import LandedHashes

    data = os.urandom(1 << 20)
    files = {"model-1.safetensors": hashlib.sha256(data).hexdigest(), "config.json": None}
    hashes = LandedHashes(tmp_path, files, set())
    (tmp_path / "part").write_bytes(data)
    os.replace(tmp_path / "part", tmp_path / "model-1.safetensors")  # it lands whole, as a link
    deadline = time.monotonic() + 30
    while "model-1.safetensors" not in hashes.digests:
        assert time.monotonic() < deadline and hashes.thread.is_alive()
        time.sleep(0.05)
    assert not hashes.downloaded.is_set()
    hashes.finish("org/name", tmp_path)  # it matches: nothing raised, nothing removed
    assert (tmp_path / "model-1.safetensors").read_bytes() == data


def test_names_and_destinations_pull_refuses_before_asking_the_hub(tmp_path, capsys):
    """A name of REPO_ID's shape the Hub could not hold (`a/..`: huggingface_hub's refusal was
    a traceback) and a --dst that exists but is no repacked folder (an unrelated folder, a
    file: "pulled already" was said of it, or with --force the download ran before repack
    refused) are one line each, before any request, and touch nothing."""
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep")
    cases = {
        ("pull", "a/.."): "'a/..' is not a Hugging Face name",
        ("pull", "org/b--c"): "is not a Hugging Face name",
        ("pull", "org/model", "--dst", str(folder)): "is not a folder `streamer repack` wrote",
        ("pull", "org/model", "--dst", str(folder), "--force"): "choose another --dst",
        ("pull", "org/model", "--dst", str(folder / "notes.txt")): "choose another --dst",
    }
    for argv, expected in cases.items():
        assert main(list(argv)) == 2, argv
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], (argv, lines)
    assert [p.name for p in folder.iterdir()] == ["notes.txt"]
    assert (folder / "notes.txt").read_text() == "keep"


def test_a_hugging_face_cache_that_cannot_be_written(hub, tmp_path):
    """A file limit (`ulimit -f`; a full disk alike) and a cache under a file were "the download
    failed (OSError: [Errno 27] File too large); ... resumes", the second one untrue."""
    import resource

    def limited() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))

    process = start(hub, "pull", "tiny-org/Tiny-BF16", preexec_fn=limited)
    _, err = process.communicate(timeout=300)
    assert process.returncode == 2, err
    assert re.search(
        r"streamer: error: the download of tiny-org/Tiny-BF16 failed: a file in .*hf-cache grew "
        r"past the largest file allowed .*, then run `streamer pull tiny-org/Tiny-BF16` again: "
        r"it resumes\.$",
        err.strip(),
    ), err
    (tmp_path / "afile").write_text("mine")
    hub.env["HF_HUB_CACHE"] = str(tmp_path / "afile" / "hub")
    status, _, err = run(hub, "pull", "tiny-org/Tiny-BF16")
    assert status == 2 and err.strip().splitlines()[-1] == (
        f"streamer: error: cannot write the Hugging Face cache (Not a directory: "
        f"{tmp_path / 'afile' / 'hub'}): set $HF_HUB_CACHE to a writable folder."
    ), err


def test_a_destination_in_a_folder_not_writable_is_refused_before_the_weights(
    hub, in_process, tmp_path, monkeypatch, capsys
):
    """$STREAMER_CACHE_DIR in a folder of another user's or on a read-only disk: the whole
    download ran, then repack refused the folder (`cannot create ...partial: Permission denied`)."""
    import streamer.pull

    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    # as a folder of another user's answers (root ignores modes)
    monkeypatch.setattr(
        streamer.pull.os, "access", lambda path, mode: path != locked and real_access(path, mode)
    )
    monkeypatch.setenv("STREAMER_CACHE_DIR", str(locked / "cache"))
    error = refused(["pull", "tiny-org/Tiny-BF16"], capsys)
    assert f"{locked} is not writable, so {locked}/cache/models/tiny-org--Tiny-BF16" in error
    assert "set $STREAMER_CACHE_DIR to a writable folder" in error
    assert not any(path.endswith(".safetensors") for _, path, _ in hub.requests)


def test_a_destination_under_a_file_is_refused_before_the_weights(hub, tmp_path):
    """$STREAMER_CACHE_DIR naming a file, or a --dst under one: the whole download ran, then
    repack refused the folder (`cannot create .../.org--name.partial: Not a directory`)."""
    (tmp_path / "afile").write_text("mine")
    for argv, env, fix in [
        ([], str(tmp_path / "afile"), "set $STREAMER_CACHE_DIR to a writable folder"),
        (["--dst", str(tmp_path / "afile" / "x")], hub.env["STREAMER_CACHE_DIR"], "another --dst"),
    ]:
        hub.env["STREAMER_CACHE_DIR"] = env
        status, _, err = run(hub, "pull", "tiny-org/Tiny-BF16", *argv)
        assert status == 2 and f"{tmp_path / 'afile'} is a file, not a folder" in err, err
        assert fix in err and err.count("streamer: error") == 1
        assert not any(path.endswith(".safetensors") for _, path, _ in hub.requests)
    assert (tmp_path / "afile").read_text() == "mine"
    hub.env["STREAMER_CACHE_DIR"] = str(tmp_path / "afile")  # an MLX download streams in place
    status, _, err = run(hub, "pull", "tiny-org/Tiny-MLX")
    assert status == 0, err


def test_a_shared_blob_is_copied_with_its_time(tmp_path):
    """own_files (--delete-source) copies a blob another revision's link shares: the copy took a
    new modification time, so a repack an earlier pull left (without --delete-source: its shards
    read through the links) could not resume, the shard seemingly rewritten."""
    storage = tmp_path / "models--org--name"
    blob = storage / "blobs" / "abc"
    blob.parent.mkdir(parents=True)
    blob.write_bytes(b"weights")
    os.utime(blob, ns=(10**18, 10**18))
    for revision in ("one", "two"):
        (storage / "snapshots" / revision).mkdir(parents=True)
        (storage / "snapshots" / revision / "model.safetensors").symlink_to("../../blobs/abc")
    own_files(storage / "snapshots" / "one")
    shard = storage / "snapshots" / "one" / "model.safetensors"
    assert not shard.is_symlink() and shard.read_bytes() == b"weights"
    assert shard.stat().st_mtime_ns == 10**18
    assert (storage / "snapshots" / "two" / "model.safetensors").resolve() == blob
