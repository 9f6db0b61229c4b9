"""The command line, run as a user would run it."""

from __future__ import annotations

import subprocess
import sys


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "-m", "streamer", *args], capture_output=True, text=True, timeout=300
    )
    if check:
        assert result.returncode == 0, result.stderr
    return result


def test_repack_info_generate(checkpoints, tmp_path):
    dst = tmp_path / "model"
    result = run("repack", str(checkpoints.hf("qwen3_moe")), str(dst), "--quantize", "4")
    assert "layer 2/2" in result.stderr and "done" in result.stderr
    info = run("info", str(dst)).stdout
    assert (
        "qwen3_moe" in info
        and "16 per layer, 4 routed per token" in info
        and "4-bit affine, group 64" in info
    )
    args = (
        "generate",
        "--model",
        str(dst),
        "--prompt",
        "The file",
        "--max-tokens",
        "8",
        "--seed",
        "1",
        "--temp",
        "0.7",
    )
    streamed = run(*args, "--memory-budget", "0")
    assert streamed.stdout.strip()
    assert "page cache only" in streamed.stderr
    assert "decode: 8 tokens" in streamed.stderr and "syncs/token 2.0" in streamed.stderr
    resident = run(*args)  # the tiny model fits in memory: by default every layer is resident
    assert "all experts resident" in resident.stderr and "syncs/token 0.0" in resident.stderr
    assert resident.stdout == streamed.stdout  # same seed, same text


def test_demo_runs_offline():
    result = run("demo", "--max-tokens", "8")
    assert "decode: 8 tokens" in result.stderr and "page-cache hits" in result.stderr


def test_errors_exit_2_with_a_message(tmp_path):
    result = run("generate", "--prompt", "hi", check=False)
    assert result.returncode == 2 and "streamer demo" in result.stderr
    result = run("repack", str(tmp_path / "nowhere"), str(tmp_path / "out"), check=False)
    assert result.returncode == 2 and "is not a folder" in result.stderr
    assert "Traceback" not in result.stderr
