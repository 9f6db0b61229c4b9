"""`streamer chat` driven through stdin, checked against the library on the same conversation."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

import streamer
from streamer.cli.chat import templated


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
        ["import os", "/stats", "def main():", "/stats", "/reset", "import os"],
        "--system-prompt",
        "You write Python.",
    )
    assert result.returncode == 0, result.stderr
    # the second turn sees the first, and after /reset the first comes again
    assert result.stdout == f"{first}\n{second}\n{first}\n"
    assert "decode: " in result.stderr and "starts over" in result.stderr
    # the second turn computed only what follows the first turn's KV cache, kept between turns
    (one, two) = re.findall(r"(\d+) of the prompt's (\d+) tokens came from", result.stderr)
    assert one[0] == "0" and 0 < int(two[0]) < int(two[1])
    assert "Traceback" not in result.stderr

    # the slot pool's read path, every expert streamed and checked on its first read: same text
    flags = ["--read-path", "slots", "--memory-budget", "0", "--verify-reads"]
    result = run_chat(folder, ["import os"], "--system-prompt", "You write Python.", *flags)
    assert result.returncode == 0 and result.stdout == f"{first}\n", result.stderr
    assert "read path slots (asked for)" in result.stderr

    model, tokenizer = local
    plain = streamer.generate(model, tokenizer, "import os\n", 6)
    result = run_chat(folder, ["import os"], "--ignore-chat-template")
    assert result.returncode == 0 and result.stdout == plain + "\n"
    assert templated(tokenizer, "hi", "sys") == tokenizer.apply_chat_template(
        [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}],
        add_generation_prompt=True,
        tokenize=False,
    )


def test_max_kv_size_bounds_the_conversation_s_cache_as_mlx_lm_chat_s(folder):
    """mlx_lm.chat's --max-kv-size (a rotating KV cache) was "unrecognized arguments" in chat."""
    model, tokenizer = local = streamer.load(folder)
    messages = [{"role": "system", "content": "You write Python."}]
    messages.append({"role": "user", "content": "import os"})
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    bounded = streamer.generate(model, tokenizer, prompt, 6, max_kv_size=8)
    assert bounded != answer(local, messages)  # the bound changes this answer
    lines = ["import os", "def main():"]
    result = run_chat(folder, lines, "--system-prompt", "You write Python.", "--max-kv-size", "8")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"{bounded}\n") and result.stdout.count("\n") == 2


def test_a_model_that_is_not_repacked_is_refused(checkpoints):
    result = run_chat(checkpoints.hf("qwen3_moe"), ["hi"])
    assert result.returncode == 2 and "into a new folder and pass DST" in result.stderr
    assert "Traceback" not in result.stderr


def test_generate_speaks_mlx_lm_flags(folder, tmp_path, capsys):
    from streamer.cli import main

    model, tokenizer = streamer.load(folder)

    def generate(*flags: str) -> str:
        assert main(["generate", "--model", str(folder), "--max-tokens", "6", *flags]) == 0
        return capsys.readouterr().out

    chat = templated(tokenizer, "import os", "Be brief.")
    assert generate("--prompt", "import os", "--system-prompt", "Be brief.") == (
        streamer.generate(model, tokenizer, chat, 6) + "\n"
    )
    raw = streamer.generate(model, tokenizer, "import os", 6)
    plain_answer = streamer.generate(model, tokenizer, "import os\n", 6)  # a turn ends its line
    assert generate("--prompt", "import os", "--ignore-chat-template") == raw + "\n"
    # top-k 1 keeps only the likeliest token: greedy whatever the temperature
    sampled = generate("--prompt", "import os", "--temp", "5", "--top-k", "1", "--seed", "3")
    assert (
        sampled == streamer.generate(model, tokenizer, templated(tokenizer, "import os"), 6) + "\n"
    )
    first = next(streamer.stream_generate(model, tokenizer, templated(tokenizer, "import os"), 6))
    assert generate("--prompt", "import os", "--extra-eos-token", str(first.token)) == "\n"
    # min-p 1 keeps only the tokens as likely as the likeliest: greedy too
    assert generate("--prompt", "import os", "--temp", "5", "--min-p", "1", "--seed", "3") == (
        sampled
    )
    # a KV cache of 5 tokens, shorter than the prompt: what the library computes with it
    window = streamer.generate(
        model, tokenizer, templated(tokenizer, "import os"), 6, max_kv_size=5
    )
    assert generate("--prompt", "import os", "--max-kv-size", "5") == window + "\n"

    plain = tmp_path / "no-template"
    shutil.copytree(folder, plain)
    config = json.loads((plain / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (plain / "tokenizer_config.json").write_text(json.dumps(config))
    assert main(["generate", "--model", str(plain), "--prompt", "hi", "--chat"]) == 2
    assert "has no chat template" in capsys.readouterr().err
    result = run_chat(plain, ["import os"])  # chat says so, and continues the text
    assert result.returncode == 0 and result.stdout == plain_answer + "\n", result.stderr
    assert "no chat template: the conversation is plain text" in result.stderr


@pytest.mark.parametrize(  # stdin strict UTF-8, or with surrogate escapes
    "locale, template", [("C.UTF-8", []), ("C", ["--ignore-chat-template"])]
)
def test_a_line_that_is_not_utf8_is_refused_and_the_chat_goes_on(folder, locale, template):
    command = [sys.executable, "-m", "streamer", "chat", "--model", str(folder), "--max-tokens"]
    result = subprocess.run(
        [*command, "2", *template],
        input=b"caf\xe9\nhello\n",
        capture_output=True,
        timeout=300,
        env={**os.environ, "LC_ALL": locale},
    )
    stderr = result.stderr.decode()
    assert result.returncode == 0 and "Traceback" not in stderr, stderr
    assert "the message is not valid UTF-8 (byte 0xe9 at character 3), not sent" in stderr
    assert "template refused" not in stderr and result.stdout.strip()  # "hello" was answered


@pytest.mark.parametrize("template", [[], ["--ignore-chat-template"]])
def test_a_system_prompt_that_is_not_utf8_is_refused_at_start(folder, template):
    """Its lone surrogates reached the tokenizer: a traceback without the template, every turn
    refused with it (/reset keeps the system prompt)."""
    command = [sys.executable, "-m", "streamer", "chat", "--model", str(folder), *template]
    result = subprocess.run(
        [*command, "--system-prompt", b"caf\xe9"],
        input=b"hello\n",
        capture_output=True,
        timeout=300,
    )
    stderr = result.stderr.decode()
    assert result.returncode == 2 and len(stderr.splitlines()) == 1, stderr
    assert "error: --system-prompt is not valid UTF-8 (byte 0xe9 at offset 3)" in stderr, stderr


@pytest.mark.parametrize("command", [["chat"], ["generate", "--prompt", "-"]])
def test_standard_input_closed(folder, command):
    result = subprocess.run(
        [sys.executable, "-m", "streamer", *command, "--model", str(folder)],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=lambda: os.close(0),
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.endswith(
        "from standard input, which is closed: give it a file or a pipe (`< FILE`).\n"
    ), result.stderr


@pytest.mark.parametrize("command", [["chat"], ["generate", "--prompt", "-"]])
def test_standard_input_unreadable(folder, command, tmp_path):
    """Standard input opened only for writing (`0>FILE`): the read's OSError was a traceback."""
    with open(tmp_path / "written", "w") as written:
        result = subprocess.run(
            [sys.executable, "-m", "streamer", *command, "--model", str(folder)],
            stdin=written,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.splitlines()[-1].endswith(
        "from standard input, which cannot be read (Bad file descriptor): give it a file or a "
        "pipe (`< FILE`)."
    ), result.stderr


def test_a_system_prompt_the_template_refuses_is_refused_at_start(folder, tmp_path):
    """A template that raises on a system message (Gemma 2's "System role not supported"): chat
    refused every turn, /reset keeping the system prompt; generate said to fix the template."""
    refusing = tmp_path / "no-system"
    shutil.copytree(folder, refusing)
    config = json.loads((refusing / "tokenizer_config.json").read_text())
    config["chat_template"] = (
        "{% for m in messages %}{% if m.role == 'system' %}"
        "{{ raise_exception('System role not supported') }}{% endif %}"
        "{{ m.content }}\n{% endfor %}"
    )
    (refusing / "tokenizer_config.json").write_text(json.dumps(config))
    for command in (["chat"], ["generate", "--prompt", "hi"]):
        result = subprocess.run(
            [sys.executable, "-m", "streamer", *command, "--model", str(refusing)]
            + ["--max-tokens", "2", "--system-prompt", "Be brief."],
            input="hi\n",
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 2, result.stderr
        assert result.stderr.splitlines()[-1] == (
            "streamer: error: --system-prompt: the model's chat template refuses a system message "
            "(TemplateError: System role not supported): leave --system-prompt out."
        ), result.stderr
    assert run_chat(refusing, ["hi"]).returncode == 0  # without one it chats


@pytest.mark.parametrize("stop", [KeyboardInterrupt(), "SIGTERM"])
def test_an_answer_whose_engine_never_stops_ends_the_chat_without_a_traceback(monkeypatch, stop):
    """Ctrl-C or SIGTERM mid-answer cancels the job and waits for the engine's thread; a thread
    that never comes back (stuck in a collective whose peer is gone, as on rank 0 of a group
    under load) ended in `queue.Empty`'s traceback after two minutes. Now the chat ends after
    STOPS_WITHIN seconds with Ctrl-C's line and status (end_interrupted)."""
    import io
    import signal

    from streamer.cli import chat
    from streamer.cli.interrupts import Terminated
    from streamer.server.api import Completion
    from streamer.server.jobs import Job, Step
    from streamer.server.output import Piece

    interrupt = Terminated(signal.SIGTERM) if stop == "SIGTERM" else stop

    class Interrupted(io.StringIO):
        def write(self, text: str) -> int:
            raise interrupt

    ended = []

    def end(given):
        ended.append(given)
        raise SystemExit(1)  # the process ends there

    monkeypatch.setattr(chat, "STOPS_WITHIN", 0.05)
    monkeypatch.setattr(chat, "end_interrupted", end)
    job = Job(Completion.__new__(Completion), [1], 4)
    job.events.put(Step(Piece(content="x")))  # printing it is where the stop lands
    with pytest.raises(SystemExit):
        chat._answer(job, Interrupted(), io.StringIO())
    assert ended == [interrupt] and job.cancelled.is_set()
