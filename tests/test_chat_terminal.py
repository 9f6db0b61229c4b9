"""`streamer chat` under a pseudo-terminal, as a person types at it: readline's line editing and
history, /help, unknown commands refused, a message of several lines, a newline on Ctrl-D."""

from __future__ import annotations

import fcntl
import os
import select
import struct
import subprocess
import sys
import termios
import time

import pytest

from streamer.cli.repl import HELP, command


class Terminal:
    def __init__(self, argv: list[str], env: dict):
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))  # 100 columns
        self.process = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True
        )
        os.close(slave)
        self.seen = b""

    def expect(self, text: str, timeout: float = 180) -> str:
        """Everything printed up to and including `text`."""
        want, deadline = text.encode(), time.monotonic() + timeout
        while want not in self.seen:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.master], [], [], left)[0]:
                raise AssertionError(f"no {text!r} in {self.seen[-2000:]!r}")
            try:
                self.seen += os.read(self.master, 4096)
            except OSError:  # the child closed the terminal
                raise AssertionError(f"no {text!r} in {self.seen[-2000:]!r}") from None
        head, _, self.seen = self.seen.partition(want)
        return (head + want).decode(errors="replace")

    def type(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    def rest(self) -> str:
        """What is printed until the child ends."""
        while select.select([self.master], [], [], 60)[0]:
            try:
                chunk = os.read(self.master, 4096)
            except OSError:
                break
            if not chunk:
                break
            self.seen += chunk
        return self.seen.decode(errors="replace")


@pytest.fixture()
def terminal(checkpoints, tmp_path):
    folder = checkpoints.repacked(checkpoints.hf("qwen3_moe"))
    env = {**os.environ, "STREAMER_CACHE_DIR": str(tmp_path), "TERM": "xterm"}
    argv = [sys.executable, "-m", "streamer", "chat", "--model", str(folder), "--max-tokens", "4"]
    term = Terminal(argv, env)
    yield term, tmp_path
    if term.process.poll() is None:
        term.process.kill()
    term.process.wait(timeout=60)
    os.close(term.master)


def test_chat_in_a_terminal(terminal):
    term, cache = terminal
    term.expect(">> ")
    term.type("/nope\n")  # refused, not sent to the model
    assert "unknown command /nope (not sent)" in term.expect(">> ")
    term.type("/stats\n")
    assert "no answer yet" in term.expect(">> ")
    term.type("/help\n")
    assert "/reset start the conversation over" in term.expect(">> ")
    term.type('"""\n')
    term.expect(".. ")
    term.type('import os\nimport sys\n"""\n')  # one message of two lines
    term.expect(">> ")
    term.type("/stats\n")
    assert "tokens came from the conversation's KV cache" in term.expect(">> ")
    # readline: the cursor moves left over "s" and "o" goes in before it; the line is history
    term.type("import s\x1b[Do\n")
    term.expect(">> ")
    term.type("/reset\n")
    term.expect(">> ")
    term.type("import os; " * 150 + "\n")  # over 512 tokens: a bar while it prefills
    assert "prefill:" in term.expect(">> ")
    term.type("\x04")  # Ctrl-D at the prompt: a newline, and the chat ends
    rest = term.rest()
    assert term.process.wait(timeout=60) == 0, rest
    assert rest.startswith("\r\n") and "Traceback" not in rest
    history = (cache / "chat_history").read_text().splitlines()
    assert "import os" in history and "import so" not in history and "/nope" in history


def test_a_drafted_chat_shows_its_prefill(checkpoints, tmp_path):
    """chat decided the speculative loop reports no prefill; it does (as mlx-lm's loop), and a
    long message's prefill showed no bar with --prompt-lookup or --draft-model."""
    folder = checkpoints.repacked(checkpoints.hf("qwen3_moe"))
    env = {**os.environ, "STREAMER_CACHE_DIR": str(tmp_path), "TERM": "xterm"}
    argv = [sys.executable, "-m", "streamer", "chat", "--model", str(folder), "--max-tokens", "2"]
    term = Terminal([*argv, "--prompt-lookup"], env)
    try:
        term.expect(">> ")
        term.type("import os; " * 150 + "\n")  # over 512 tokens
        assert "prefill:" in term.expect(">> ")
        term.type("\x04")
        assert term.process.wait(timeout=60) == 0, term.rest()
    finally:
        if term.process.poll() is None:
            term.process.kill()
        os.close(term.master)


def test_commands_and_messages():
    assert command("/reset") == ("/reset", "")
    assert command("  /exit ") == ("/quit", "")
    assert command("/frobnicate now") == ("?", "/frobnicate now")
    assert command("//etc/hosts is a file") == (None, "/etc/hosts is a file")
    assert "starts with / is typed as //" in HELP  # it said "is sent as //...": the reverse
    assert command("import os") == (None, "import os")
    assert command("/one\n/two") == (None, "/one\n/two")  # a block is a message


def test_ollama_s_commands_are_taken():
    """Ollama's /bye (end) and /clear (start over), which a user of `ollama run` types, were
    refused as unknown commands; the help names them."""
    assert command("/bye") == ("/quit", "")
    assert command("/clear") == ("/reset", "")
    assert "/bye" in HELP and "/clear" in HELP
