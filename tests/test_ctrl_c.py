"""Ctrl-C as a user presses it, at the moments each command handles differently: while starting
(imports, loading: the process ends at once), while serving (the engine closes first) and at
chat's prompt. Each exits 130 with `streamer: interrupted` and no traceback. Ctrl-C during
repack is tests/test_repack_interrupted.py's, during generation tests/test_concurrency.py's.
SIGTERM (`kill`, `systemctl stop`) and SIGHUP (a closed terminal) take Ctrl-C's path, exit 128 +
their number: Python's default ended the process on the spot, silently."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

STREAMER = [sys.executable, "-m", "streamer"]


@pytest.fixture(scope="module")
def model(checkpoints) -> str:
    return str(checkpoints.repacked(checkpoints.hf("qwen3_moe")))


def read_until(stream, text: str) -> str:
    """What `stream` gives up to and including `text` (the command has reached that point)."""
    seen = ""
    while text not in seen:
        char = stream.read(1)
        assert char, f"the command ended before printing {text!r}: {seen}"
        seen += char
    return seen


def assert_interrupted(process: subprocess.Popen, before: str = "", signum=signal.SIGINT) -> str:
    """Send `signum` and check the process ends as Ctrl-C ends it, with 128 + its number."""
    process.send_signal(signum)
    _, rest = process.communicate(timeout=120)
    stderr = before + rest
    assert process.returncode == 128 + signum and "Traceback" not in stderr, stderr
    assert stderr.strip().splitlines()[-1] == "streamer: interrupted", stderr
    return stderr


def test_ctrl_c_while_importing_and_loading_exits_130_without_a_traceback(model):
    command = [*STREAMER, "generate", "--model", model, "--prompt", "x", "--max-tokens", "1000"]
    # seconds after mlx's library is mapped: right as its extension starts, importing, loading
    # (and the lazy imports mlx-lm and transformers make while loading)
    for after, signum in ((0.0, signal.SIGINT), (0.3, signal.SIGINT), (1.0, signal.SIGTERM)):
        process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        deadline = time.monotonic() + 60
        while "libmlx" not in open(f"/proc/{process.pid}/maps").read():
            assert time.monotonic() < deadline and process.poll() is None
            time.sleep(0.005)
        time.sleep(after)
        assert_interrupted(process, signum=signum)


def test_ctrl_c_while_serving(model):
    process = subprocess.Popen(
        [*STREAMER, "serve", "--model", model, "--port", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert_interrupted(process, read_until(process.stderr, "listening on http://"))


def serving(model: str, *flags: str) -> tuple[subprocess.Popen, str, http.client.HTTPConnection]:
    """`streamer serve` started on a free port: the process, its stderr up to the address, and a
    connection to it."""
    process = subprocess.Popen(
        [*STREAMER, "serve", "--model", model, "--port", "0", *flags],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    before = read_until(process.stderr, "/v1")
    port = int(re.search(r"127\.0\.0\.1:(\d+)/v1", before).group(1))
    return process, before, http.client.HTTPConnection("127.0.0.1", port, timeout=60)


def test_ctrl_c_while_an_answer_streams(model):
    """The generation thread is computing in MLX: Python's shutdown under it aborted the process
    (`terminate called without an active exception`, exit -6)."""
    process, before, connection = serving(model)
    body = {"prompt": "hello", "max_tokens": 1000, "stream": True, "logit_bias": {"0": -100}}
    connection.request("POST", "/v1/completions", json.dumps(body))
    assert connection.getresponse().read(200)  # tokens are arriving
    assert_interrupted(process, before)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_ctrl_c_at_the_chat_prompt(model, signum):
    keyboard, typing = os.pipe()  # held open: the chat waits for a line, never sees an end
    try:
        process = subprocess.Popen(
            [*STREAMER, "chat", "--model", model],
            stdin=keyboard,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        os.close(keyboard)
        assert_interrupted(process, read_until(process.stderr, ">> "), signum)
    finally:
        os.close(typing)


def test_sigterm_while_serving_keeps_the_prompt_cache_being_written(model, tmp_path):
    """`systemctl stop` right after an answer, while its prompt cache is written to
    --prompt-cache-dir (the answer is sent before the write): the write completes, no partial
    file is left, and serve exits 143 with Ctrl-C's line."""
    caches = tmp_path / "caches"
    process, before, connection = serving(model, "--prompt-cache-dir", str(caches))
    body = {"prompt": "hello there", "max_tokens": 4}
    connection.request("POST", "/v1/completions", json.dumps(body))
    assert connection.getresponse().status == 200
    assert_interrupted(process, before, signal.SIGTERM)
    names = [path.name for path in caches.iterdir()]
    assert len(names) == 1 and names[0].startswith("prompt-"), names  # whole, under its name


def test_sigterm_while_chat_answers_ends_the_chat(model):
    """Ctrl-C stops an answer and the chat goes on; SIGTERM stops the answer and ends the chat
    (it stayed at the prompt, waiting for a line, if it took SIGTERM as Ctrl-C)."""
    keyboard, typing = os.pipe()
    try:
        process = subprocess.Popen(
            [*STREAMER, "chat", "--model", model, "--max-tokens", "2000"],
            stdin=keyboard,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        os.close(keyboard)
        before = read_until(process.stderr, ">> ")
        os.write(typing, b"Once upon a time\n")
        assert process.stdout.read(1)  # the answer is coming
        stderr = assert_interrupted(process, before, signal.SIGTERM)
        assert "[chat] interrupted" not in stderr
    finally:
        os.close(typing)


def test_sighup_ignored_from_the_start_stays_ignored(model):
    """`nohup streamer chat`: SIGHUP, ignored by the parent's choice, must not end it."""
    process = subprocess.Popen(
        [*STREAMER, "chat", "--model", model],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN),
    )
    read_until(process.stderr, ">> ")
    process.send_signal(signal.SIGHUP)
    _, stderr = process.communicate("/quit\n", timeout=120)
    assert process.returncode == 0, stderr
