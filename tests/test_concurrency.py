"""Several processes on one repacked folder, two threads on one model, and Ctrl-C while
generating."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading

import pytest

import streamer
from streamer.errors import StreamerError


def generate_command(model, prompt: str, max_tokens: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "streamer",
        "generate",
        "--model",
        str(model),
        "--prompt",
        prompt,
        "--max-tokens",
        str(max_tokens),
        "--ignore-chat-template",  # the prompt as plain text, as streamer.generate takes it
    ]


def test_two_processes_generate_from_the_same_folder_at_once(checkpoints):
    folder = checkpoints.repacked(checkpoints.mlx("qwen3_moe"))
    model, tokenizer = streamer.load(folder)
    prompts = ["The file system", "Return the value of"]
    expected = [streamer.generate(model, tokenizer, p, max_tokens=12) for p in prompts]
    processes = [
        subprocess.Popen(
            generate_command(folder, p, 12),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for p in prompts
    ]
    for process, text in zip(processes, expected):
        stdout, stderr = process.communicate(timeout=120)
        assert process.returncode == 0, stderr
        assert stdout == text + "\n"  # greedy: exactly the single-process output


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_during_generation_prints_stats_and_exits_130(checkpoints, signum):
    """SIGTERM (`kill`) stops it as Ctrl-C does, with 143: Python's default ended it silently."""
    folder = checkpoints.repacked(checkpoints.hf("qwen3_moe"))
    process = subprocess.Popen(
        generate_command(folder, "Once upon a time", 2000),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout.read(1)  # it is generating
    process.send_signal(signum)
    _, stderr = process.communicate(timeout=60)
    stderr = stderr.decode()
    assert process.returncode == 128 + signum, stderr
    assert "[interrupted]" in stderr and "decode:" in stderr and "tok/s" in stderr
    assert "Traceback" not in stderr


def test_a_second_thread_generating_on_a_model_in_use_is_refused(checkpoints):
    """MLX's streams belong to their thread: a second thread's answer on the slot path failed
    inside the pool (RuntimeError: no Stream in current thread). It is refused in one line, and
    the first answer, and the next, are untouched."""
    folder = checkpoints.repacked(checkpoints.hf("qwen3_moe"))
    model, tokenizer = streamer.load(folder, memory_budget=0, read_path="slots")
    want = streamer.generate(model, tokenizer, "hello world", max_tokens=4)
    stream = streamer.stream_generate(model, tokenizer, "hello world", max_tokens=4)
    first = next(stream).text
    errors = []

    def second() -> None:
        with pytest.raises(StreamerError, match="generating an answer in another thread") as e:
            streamer.generate(model, tokenizer, "hello world", max_tokens=4)
        errors.append(e)

    thread = threading.Thread(target=second)
    thread.start()
    thread.join()
    assert errors and first + "".join(r.text for r in stream) == want
    assert streamer.generate(model, tokenizer, "hello world", max_tokens=4) == want
