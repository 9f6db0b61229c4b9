"""`streamer chat` driven through stdin, checked against the library on the same conversation."""

from __future__ import annotations

import subprocess
import sys

import pytest

import streamer
from streamer.chat import templated


@pytest.fixture(scope="module")
def folder(checkpoints):
    return checkpoints.repacked(checkpoints.hf("qwen3_moe"))


def run_chat(folder, lines: list[str], *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "streamer", "chat", "--model", str(folder), "--max-tokens", "6"]
        + list(flags),
        input="".join(line + "\n" for line in lines),
        capture_output=True,
        text=True,
        timeout=300,
    )


def answer(local, messages) -> str:
    model, tokenizer = local
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return streamer.generate(model, tokenizer, prompt, 6)


def test_turns_keep_the_conversation_and_reset_forgets_it(folder):
    local = streamer.load(folder)
    system = {"role": "system", "content": "You write Python."}
    first = answer(local, [system, {"role": "user", "content": "import os"}])
    second = answer(
        local,
        [
            system,
            {"role": "user", "content": "import os"},
            {"role": "assistant", "content": first},
            {"role": "user", "content": "def main():"},
        ],
    )
    result = run_chat(
        folder,
        ["import os", "/stats", "def main():", "/reset", "import os"],
        "--system-prompt",
        "You write Python.",
    )
    assert result.returncode == 0, result.stderr
    # the second turn sees the first (its KV cache reused), and after /reset the first comes again
    assert result.stdout == f"{first}\n{second}\n{first}\n"
    assert "decode: " in result.stderr and "starts over" in result.stderr
    assert "Traceback" not in result.stderr

    model, tokenizer = local
    plain = streamer.generate(model, tokenizer, "import os\n", 6)
    result = run_chat(folder, ["import os"], "--ignore-chat-template")
    assert result.returncode == 0 and result.stdout == plain + "\n"
    assert templated(tokenizer, "hi", "sys") == tokenizer.apply_chat_template(
        [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}],
        add_generation_prompt=True,
        tokenize=False,
    )


def test_a_model_that_is_not_repacked_is_refused(checkpoints):
    result = run_chat(checkpoints.hf("qwen3_moe"), ["hi"])
    assert result.returncode == 2 and "repack it into a new folder" in result.stderr
    assert "Traceback" not in result.stderr
