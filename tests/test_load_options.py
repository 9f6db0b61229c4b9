"""A load's options are decided once (loading/options.py), by the API and the CLI alike, and every
one is checked before the model folder is looked up or any of its files is read."""

from __future__ import annotations

import dataclasses

import mlx.core as mx
import pytest

import streamer
from streamer.cli import main
from streamer.errors import StreamerError
from streamer.loading import load as loading
from streamer.loading.backend import default_dtype, read_path_for_backend, threads_for_backend
from streamer.loading.options import LoadOptions, load_options

BAD = [
    ({"memory_budget": "lots"}, "memory_budget 'lots' is not a size"),
    # as the CLI's --memory-budget 16: 16 GiB meant, 16 bytes taken (the model loaded, no experts)
    ({"memory_budget": "16"}, "memory_budget '16' has no unit, so it counts bytes: write 16G"),
    ({"memory_budget": "1e999"}, "memory_budget '1e999' is not a size"),  # was OverflowError
    ({"dtype": "float64"}, "dtype must be one of"),
    ({"verify_reads": "yes"}, "verify_reads must be True or False"),
    ({"bypass_page_cache": 1}, "bypass_page_cache must be True or False"),
    ({"read_path": "pool"}, "read_path must be one of slots, mapped"),
    ({"checksums": "/nonexistent/sums.json"}, "checksums /nonexistent/sums.json: no such file"),
    ({"group": "x"}, "group must be an mx.distributed group"),
    ({"cuda_misses": "fast"}, "cuda_misses must be one of staged, mapped, registered, pinned"),
]


@pytest.mark.parametrize(("kwargs", "message"), BAD)
def test_bad_options_are_refused_before_any_file_is_read(checkpoints, monkeypatch, kwargs, message):
    folder = checkpoints.repacked(checkpoints.hf("qwen3_moe"))
    touched = []
    for name in ("streamable", "is_download", "open_repacked_source", "open_download_source"):
        monkeypatch.setattr(loading, name, lambda *a, n=name: touched.append(n))
    for path in (folder, "no-such-org/no-such-model", "/nonexistent/folder"):
        with pytest.raises(StreamerError, match=message):
            streamer.load(path, **kwargs)
    assert touched == []


def test_options_are_decided_once_and_frozen():
    options = load_options(memory_budget="1G", dtype="bfloat16", read_path="slots")
    assert options.memory_budget == 1 << 30 and options.dtype == mx.bfloat16
    assert (options.read_path, options.read_path_why) == ("slots", "asked for")
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.read_path = "mapped"
    default = load_options()  # this machine's backend's defaults, decided here
    path, why = read_path_for_backend(None)
    threads, threads_why = threads_for_backend(None)
    assert default == LoadOptions(
        memory_budget=None,
        dtype=default_dtype(),
        read_path=path,
        read_path_why=why,
        checksums=None,
        trust_remote_code=False,
        verify_reads=False,
        bypass_page_cache=False,
        group=None,
        cuda_misses="gathered",
        threads=threads,
        threads_why=threads_why,
    )


def test_the_cli_refuses_a_bad_flag_before_looking_the_model_up(capsys):
    argv = ["generate", "--model", "no-such-org/no-such-model", "--prompt", "hi"]
    assert main([*argv, "--checksums", "/nonexistent/sums.json"]) == 2
    err = capsys.readouterr().err
    assert "--checksums /nonexistent/sums.json: no such file" in err and "Traceback" not in err


def test_the_mapped_path_refused_on_cuda_names_the_flag_the_cli_took(monkeypatch, capsys):
    """On MLX's CUDA backend `--read-path mapped` was refused as `read_path="mapped"`, the Python
    API's spelling, on the command line too (the backend stood in: this machine has no CUDA)."""
    from streamer.loading import backend

    monkeypatch.setattr(backend, "backend", lambda: "cuda")
    with pytest.raises(StreamerError, match=r"^read_path='mapped' does not run"):
        load_options(read_path="mapped")
    argv = ["generate", "--model", "no-such-org/no-such-model", "--prompt", "hi"]
    assert main([*argv, "--read-path", "mapped"]) == 2
    line = capsys.readouterr().err.splitlines()[-1]
    assert line.startswith("streamer: error: --read-path mapped does not run on MLX's CUDA"), line
    assert "use --read-path slots, the default" in line, line


def test_a_checksums_file_is_refused_for_a_repacked_folder(checkpoints, tmp_path):
    """A repacked folder's checksums are in its manifest: `streamer verify --checksums` refused a
    sidecar for one, while load (and generate's --checksums) ignored it without a word."""
    folder = checkpoints.repacked(checkpoints.hf("qwen3_moe"))
    sidecar = tmp_path / "sums.json"
    sidecar.write_text("{}")
    with pytest.raises(StreamerError, match="checksums .*sums.json is a download's sidecar"):
        streamer.load(folder, checksums=sidecar)
