"""`streamer chat` and `streamer serve` expert-parallel: 2 ranks started by mlx.launch on
127.0.0.1 (ring backend), rank 0 talking to the user or the clients, rank 1 computing every job
with it. Answers are those of one process on the full model; a stop, a client gone or Ctrl-C
ends both ranks together, and an error on one rank ends the group instead of hanging it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from mlx_launch import LAUNCH_SECONDS, RANKS, launch, start
from mlx_lm.sample_utils import make_logits_processors

import streamer
from streamer.parallel.split import split

FAILING = Path(__file__).with_name("distributed_failing.py")
STREAMED = ["--memory-budget", "0"]  # every expert streamed: each layer syncs on its routing
NO_EOS = {"0": -100}  # the tiny model's EOS is token 0: keep it generating


@pytest.fixture(scope="module")
def shards(checkpoints, tmp_path_factory) -> tuple[Path, str]:
    """A 4-bit model's full folder and its 2 shards' folder ("{rank}" in it)."""
    full = checkpoints.repacked(checkpoints.mlx("qwen3_moe"))
    root = tmp_path_factory.mktemp("expert-parallel-serve")
    for rank in range(RANKS):
        split(full, root / f"shard{rank}", rank, RANKS, log=lambda _: None)
    return full, str(root / "shard{rank}")


def test_chat_answers_as_one_process_does(shards, checkpoints):
    """Sampled, with a draft model (the model's float weights: it drafts some tokens the 4-bit
    model samples, and some it does not): every rank drafts and samples alike, with one seed."""
    full, pattern = shards
    lines = ["def read(path):", "/stats", "and then?", "/reset", "x =", "/quit"]
    typed = "".join(f"{line}\n" for line in lines)
    flags = ["--max-tokens", "8", "--temp", "0.8", "--seed", "3", *STREAMED]  # seed shared
    flags += ["--draft-model", str(checkpoints.hf("qwen3_moe")), "--num-draft-tokens", "2"]
    command = [sys.executable, "-m", "streamer", "chat", *flags, "--model"]
    alone = subprocess.run(
        [*command, str(full)], input=typed, capture_output=True, text=True, timeout=300
    )
    assert alone.returncode == 0, alone.stderr
    result = launch([*command, pattern], Path(pattern).parent, stdin=typed)
    assert result.returncode == 0, result.stderr
    assert result.stdout == alone.stdout and result.stdout.count("\n") == 3
    assert "kept per pass" in alone.stderr and "kept per pass" in result.stderr  # /stats
    assert result.stderr.count("[chat] the conversation starts over") == 1  # rank 0 alone talks


def test_under_streamer_launch_input_ends_as_for_one_process(shards):
    """Input from a pipe, under `streamer launch`: a chat without /quit ends at its end with its
    answers, and `generate --prompt -` prints one process's text. Before: the chat waited for
    more input for ever, and `--prompt -` was refused (it read for ever)."""
    full, pattern = shards
    typed = "def read(path):\nand then?\n"
    flags = ["--max-tokens", "6", "--temp", "0.8", "--seed", "3", *STREAMED]
    for command in (["chat", *flags], ["generate", "--prompt", "-", *flags]):
        alone = subprocess.run(
            [sys.executable, "-m", "streamer", *command, "--model", str(full)],
            input=typed,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert alone.returncode == 0 and alone.stdout.strip(), alone.stderr
        cwd = Path(pattern).parent
        result = launch([*command, "--model", pattern], cwd, typed, streamer=True, ends=True)
        assert (result.returncode, result.stdout) == (0, alone.stdout), result.stderr


def test_an_error_on_one_rank_ends_every_rank(shards):
    _, pattern = shards
    command = [sys.executable, str(FAILING), "--model", pattern, "--max-tokens", "50", *STREAMED]
    result = launch(command, Path(pattern).parent, stdin="def read(path):\n/quit\n")
    # mlx.launch itself exits 0 whatever its ranks do: it says how each ended
    assert "Node with rank 1 exited with code 1" in result.stderr
    # rank 0 ends on its own (1), or by mlx.launch's SIGTERM, at once (-15) or, its engine's
    # thread stuck in the broken collective, after chat.STOPS_WITHIN seconds (143)
    assert re.search("Node with rank 0 exited with code (1|-15|143)", result.stderr)
    assert (  # the rank that failed says why (mlx.launch interleaves the ranks' lines)
        "streamer: error: rank 1: generation failed (OSError: [Errno 5] Input/output error "
        "(injected)); the ranks are out of step, so every rank stops\n"
    ) in result.stderr


class Server:
    """`streamer serve` on 2 ranks, its stderr collected as it comes."""

    def __init__(self, pattern: str, *flags: str):
        command = [sys.executable, "-m", "streamer", "serve", "--port", "0", *STREAMED, *flags]
        self.process = start([*command, "--model", pattern], Path(pattern).parent)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self.lines.extend, args=(self.process.stderr,))
        self.reader.start()
        deadline = time.monotonic() + LAUNCH_SECONDS
        while not (found := re.search(r"listening on (http://\S+)", self.log)):
            assert self.process.poll() is None and time.monotonic() < deadline, self.log
            time.sleep(0.1)
        self.url, self.model = found.group(1), pattern

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def complete(self, **body) -> dict:
        request = urllib.request.Request(
            f"{self.url}/completions",
            json.dumps({"model": self.model, **body}).encode(),
            {"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.loads(response.read())

    def hang_up_after_the_first_token(self, **body) -> None:
        request = urllib.request.Request(
            f"{self.url}/completions",
            json.dumps({"model": self.model, "stream": True, **body}).encode(),
            {"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            while not response.readline().startswith(b"data: "):
                pass

    def interrupt(self) -> int:
        """Ctrl-C, as in the terminal that runs mlx.launch: every process of the group gets it."""
        os.killpg(self.process.pid, signal.SIGINT)
        try:
            self.process.wait(timeout=LAUNCH_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            pytest.fail(f"the ranks did not stop after Ctrl-C:\n{self.log[-3000:]}")
        self.reader.join()
        return self.process.returncode


def test_serve_answers_as_one_process_does_and_stops_together(shards):
    full, pattern = shards
    model, tokenizer = streamer.load(full, memory_budget=0)
    no_eos = make_logits_processors({0: -100})
    want = streamer.generate(model, tokenizer, "def read(path):", 12, logits_processors=no_eos)
    greedy = dict(prompt="def read(path):", max_tokens=12, logit_bias=NO_EOS)
    # the server drafts by prompt lookup (one launch for both: each costs 10-30 s here), a
    # request with num_draft_tokens 0 decodes plainly and one with 4 drafts 4: every rank alike
    server = Server(pattern, "--prompt-lookup", "1")
    try:
        drafted = server.complete(**greedy)
        assert drafted["choices"][0]["text"] == want and "drafts_kept" in drafted["streamer"]
        server.hang_up_after_the_first_token(prompt="x", max_tokens=1000, logit_bias=NO_EOS)
        cut = server.complete(**greedy, stop=[want[5:8]])["choices"][0]
        assert (cut["text"], cut["finish_reason"]) == (want[: want.index(want[5:8])], "stop")
        server.complete(prompt="y", max_tokens=6, temperature=1.0)  # no seed: rank 0 picks it
        plain = server.complete(**greedy, num_draft_tokens=0)  # the ranks are still in step
        assert plain["choices"][0]["text"] == want and plain["usage"]["prompt_tokens_details"]
        assert "drafts_kept" not in plain["streamer"]
        assert server.complete(**greedy, num_draft_tokens=4)["choices"][0]["text"] == want
    finally:
        server.interrupt()
    stopped = re.findall(r"client gone: stopped after (\d+) of 1000", server.log)
    assert len(stopped) == 1 and int(stopped[0]) < 1000
    assert "Node with rank 0 exited with code 130" in server.log  # Ctrl-C, as alone
    assert "Node with rank 1" not in server.log  # told by rank 0, it ended by itself, cleanly
