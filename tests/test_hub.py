"""Model names resolved through a Hugging Face cache laid out on disk as huggingface_hub does."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from streamer.cli import main
from streamer.errors import StreamerError
from streamer.loading.hub import resolve, streamable

REVISION = "0123456789abcdef0123456789abcdef01234567"


def cache_repo(cache: Path, repo_id: str, files: Path) -> Path:
    """models--org--name/{blobs,refs/main,snapshots/REV}: snapshot files are symlinks into blobs."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / REVISION
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    for path in sorted(p for p in files.rglob("*") if p.is_file()):
        blob = repo / "blobs" / hashlib.sha256(path.read_bytes()).hexdigest()
        shutil.copyfile(path, blob)
        link = snapshot / path.relative_to(files)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    return snapshot


@pytest.fixture
def hub(tmp_path, monkeypatch, checkpoints):
    """tiny-org/Tiny-MoE (as downloaded) and tiny-org/Tiny-MLX (MLX-quantized) in the cache."""
    cache = tmp_path / "hub"
    snapshot = cache_repo(cache, "tiny-org/Tiny-MoE", checkpoints.hf("qwen3_moe"))
    cache_repo(cache, "tiny-org/Tiny-MLX", checkpoints.mlx("qwen3_moe"))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))  # read at import time
    return snapshot


def streamer_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "streamer", *args], capture_output=True, text=True, timeout=300
    )


def test_a_cached_name_is_its_snapshot_and_repacks(hub, tmp_path):
    assert resolve("tiny-org/Tiny-MoE") == hub
    dst = tmp_path / "repacked"
    result = streamer_cli("repack", "tiny-org/Tiny-MoE", str(dst))
    assert result.returncode == 0, result.stderr
    assert streamable(dst) == dst


def test_a_cached_mlx_download_runs_and_plans_by_name(hub, capsys):
    """Streamed in place through the snapshot's symlinks, and planned, by its name alone."""
    snapshot = resolve("tiny-org/Tiny-MLX")
    answers = []
    for model in ("tiny-org/Tiny-MLX", str(snapshot.resolve())):  # the name, then a folder
        assert main(["generate", "--model", model, "--prompt", "hi", "--max-tokens", "4"]) == 0
        answers.append(capsys.readouterr().out)
    assert answers[0] == answers[1] and answers[0].strip()
    # a given --memory: by default the plan fits the memory available now, which moves
    assert main(["plan", "tiny-org/Tiny-MLX", "--json", "--memory", "16G"]) == 0
    by_name = capsys.readouterr().out
    assert main(["plan", str(snapshot), "--json", "--memory", "16G"]) == 0
    assert by_name == capsys.readouterr().out and '"expert_bytes"' in by_name


def test_names_that_cannot_run_say_what_to_do(hub, tmp_path, capsys):
    with pytest.raises(StreamerError, match="streamer pull tiny-org/Missing"):
        resolve("tiny-org/Missing")
    with pytest.raises(StreamerError, match=r"streamer repack tiny-org/Tiny-MoE DST"):
        streamable("tiny-org/Tiny-MoE")
    with pytest.raises(StreamerError, match="not a folder, nor a Hugging Face name"):
        resolve(str(tmp_path / "no" / "such" / "folder"))
    # a download passed as a folder: repack it into a new one, not into itself
    assert main(["generate", "--model", str(hub), "--prompt", "hi"]) == 2
    assert f"streamer repack {hub} DST" in capsys.readouterr().err
    assert main(["chat", "--model", "tiny-org/Tiny-MoE"]) == 2
    assert "streamer repack tiny-org/Tiny-MoE DST" in capsys.readouterr().err
    assert main(["generate", "--model", "tiny-org/Missing", "--prompt", "hi"]) == 2
    assert "streamer pull tiny-org/Missing" in capsys.readouterr().err


def test_a_lookup_expects_what_mlx_lm_downloads():
    """A pull fetches, and a lookup checks complete, the files mlx-lm's loader takes."""
    from mlx_lm.utils import DEFAULT_ALLOW_PATTERNS

    from streamer.loading.hub import ALLOW_PATTERNS

    assert ALLOW_PATTERNS == DEFAULT_ALLOW_PATTERNS


def test_a_damaged_cache_entry_is_named(hub, capsys):
    """Both were reported as "manifest.json is missing ...: not a repacked model"."""
    repo = hub.parent.parent
    config = hub / "config.json"
    config.resolve().unlink()  # the snapshot's link to a blob that is gone
    link = rf"{config} is a symbolic link to \.\./\.\./blobs/\w+, which is missing"
    with pytest.raises(StreamerError, match=rf"copy of tiny-org/Tiny-MoE is damaged: {link}"):
        resolve("tiny-org/Tiny-MoE")
    assert main(["generate", "--model", str(hub), "--prompt", "hi"]) == 2
    assert "which is missing: the download is incomplete" in capsys.readouterr().err
    (repo / "refs" / "main").write_text("")
    with pytest.raises(
        StreamerError, match=r"refs/main is empty: it names no snapshot\. `streamer"
    ):
        resolve("tiny-org/Tiny-MoE")


def test_a_broken_link_to_a_file_the_model_does_not_need_is_ignored(hub, capsys):
    """A README and a LICENSE.txt whose blobs are gone: the model loads, by name and as a
    folder; a broken link to a file it reads is still damage."""
    snapshot = resolve("tiny-org/Tiny-MLX")
    for name in ("README.md", "LICENSE.txt"):
        (snapshot / name).unlink(missing_ok=True)
        (snapshot / name).symlink_to("../../blobs/" + "0" * 64)  # a blob that never landed
    for model in ("tiny-org/Tiny-MLX", str(snapshot)):
        assert main(["generate", "--model", model, "--prompt", "hi", "--max-tokens", "2"]) == 0, (
            capsys.readouterr().err
        )
        assert capsys.readouterr().out.strip()
    (snapshot / "merges.txt").symlink_to("../../blobs/" + "0" * 64)
    with pytest.raises(StreamerError, match=r"Tiny-MLX is damaged: .*/merges\.txt is a symbolic"):
        resolve("tiny-org/Tiny-MLX")


@pytest.mark.parametrize("ref", ["..", "../..", "."])
def test_a_ref_naming_no_snapshot_names_the_repo(hub, ref):
    (hub.parent.parent / "refs" / "main").write_text(ref)
    with pytest.raises(StreamerError, match="tiny-org/Tiny-MoE") as caught:
        resolve("tiny-org/Tiny-MoE")
    assert "refs/main" in str(caught.value) and "pull tiny-org/Tiny-MoE" in str(caught.value)


def test_an_empty_name_is_refused_not_taken_for_the_working_directory(
    tmp_path, monkeypatch, capsys
):
    """`--model ""` (an unset shell variable) was Path(""), the working directory: a model there
    was loaded, and elsewhere the error named the directory, not the empty argument."""
    monkeypatch.chdir(tmp_path)
    for argv in (["info", ""], ["plan", ""], ["generate", "--model", "", "--prompt", "hi"]):
        assert main(argv) == 2
        assert "model '' is empty: give a model's folder or its org/name" in capsys.readouterr().err
    assert main(["repack", "", str(tmp_path / "out")]) == 2
    assert "source '' is empty" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_a_pulled_name_whose_download_is_gone_is_not_sent_to_pull(hub, tmp_path, monkeypatch):
    """A name `streamer pull` repacked with --delete-source: repack and plan --quantize, which
    read the download, said to `streamer pull` it, which answers that it is pulled already."""
    from streamer.loading.hub import pulled_folder

    monkeypatch.setenv("STREAMER_CACHE_DIR", str(tmp_path / "streamer-cache"))
    pulled_folder("tiny-org/Pulled").mkdir(parents=True)
    with pytest.raises(StreamerError) as refused:
        resolve("tiny-org/Pulled", "source")
    message = str(refused.value)
    assert "streamer pull tiny-org/Pulled`" not in message, message
    assert str(pulled_folder("tiny-org/Pulled")) in message and "hf download" in message, message


def test_a_cached_download_s_checksum_advice_names_it(hub, tmp_path, monkeypatch, capsys):
    """`streamer verify org/name` (and --verify-reads) of a download with no checksums recorded
    said to run `streamer verify <the snapshot's path> --record`: the name works, and is what was
    typed."""
    monkeypatch.setenv("STREAMER_CACHE_DIR", str(tmp_path / "streamer-cache"))
    for argv in (
        ["verify", "tiny-org/Tiny-MLX"],
        ["generate", "--model", "tiny-org/Tiny-MLX", "-p", "hi", "--verify-reads"],
    ):
        assert main(argv) == 2
        line = capsys.readouterr().err.splitlines()[-1]
        assert "`streamer verify tiny-org/Tiny-MLX --record`" in line, line


def test_a_name_cached_with_its_config_alone_is_not_a_download(hub, tmp_path, capsys):
    """`hf download org/name config.json`, as the README has it for `streamer plan`, leaves a
    snapshot with no weights: generate, info, verify and repack by that name said "holds no
    model*.safetensors files: nothing to repack", not to pull it; plan still takes it."""
    config = tmp_path / "config-only"
    config.mkdir()
    shutil.copy(hub / "config.json", config / "config.json")
    cache_repo(hub.parents[2], "tiny-org/Config-Only", config)
    for argv in (
        ["generate", "--model", "tiny-org/Config-Only", "--prompt", "hi"],
        ["info", "tiny-org/Config-Only"],
        ["verify", "tiny-org/Config-Only"],
        ["repack", "tiny-org/Config-Only", str(tmp_path / "out")],
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "holds no model*.safetensors" in err and "streamer pull tiny-org/Config-Only" in err
        assert "nothing to repack" not in err and len(err.splitlines()) == 1, err
    assert main(["plan", "tiny-org/Config-Only", "--memory", "16G"]) == 0


def test_a_pull_that_cannot_reach_the_hub_is_not_ready_with_the_config_alone(
    hub, tmp_path, monkeypatch, capsys
):
    """Offline, huggingface_hub returns the cached snapshot: one holding config.json alone (the
    README's `hf download org/name config.json`) was "[pull] ready" with no weights."""
    import huggingface_hub.constants as constants

    monkeypatch.setenv("STREAMER_CACHE_DIR", str(tmp_path / "streamer-cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    config = tmp_path / "config-only"
    config.mkdir()
    shutil.copy(resolve("tiny-org/Tiny-MLX") / "config.json", config / "config.json")
    cache_repo(hub.parents[2], "tiny-org/Config-Only", config)
    assert main(["pull", "tiny-org/Config-Only"]) == 2
    err = capsys.readouterr().err
    assert "cannot reach the Hub" in err and "ready" not in err and len(err.splitlines()) == 1
    assert main(["pull", "tiny-org/Tiny-MLX"]) == 0  # a whole download the cache holds
    assert "streams in place" in capsys.readouterr().err


def test_the_dependency_floor_has_what_the_lookup_imports():
    """pyproject.toml asked for huggingface_hub>=0.23, which has no errors.IncompleteSnapshotError
    (1.22 brought it): an install beside an older one failed every org/name with an ImportError."""
    import re

    pyproject = (Path(__file__).parent.parent / "pyproject.toml").read_text()
    floor = re.search(r'"huggingface_hub>=([\d.]+)[";]', pyproject)
    assert floor, "pyproject.toml gives huggingface_hub no floor"
    assert tuple(int(x) for x in floor[1].split(".")) >= (1, 22), floor[0]


def test_plan_of_a_name_not_cached_says_to_fetch_its_config_alone(hub, capsys):
    """plan answers before a download, from config.json: for a name not in the cache it said
    "download it with `streamer pull org/name`", the whole model (hundreds of GB for some)."""
    for argv in (["plan", "tiny-org/Missing"], ["plan", "tiny-org/Missing", "--quantize", "4"]):
        assert main(argv) == 2
        line = capsys.readouterr().err.strip()
        assert "`hf download tiny-org/Missing config.json`" in line, line
        assert "streamer pull" not in line and "\n" not in line, line
