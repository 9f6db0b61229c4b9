"""`--chat-template-config JSON` (mlx_lm.generate's flag): the chat template's own variables, such
as Qwen3's enable_thinking, for generate and chat. It was refused as an unrecognized argument, and
neither command could turn a model's thinking off."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

import streamer
from streamer.cli import main

# Qwen3's switch (off: an empty thought after the assistant's tag), in the tiny tokenizer's
# template; mlx-lm's TokenizerWrapper sets enable_thinking to whether the vocabulary has <think>
# (this one's has not: off) where the call leaves it out
THINKING = (
    "{% set turns = namespace(n=0) %}"
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    "{% if not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
)
ON = '{"enable_thinking": true}'


@pytest.fixture(scope="module")
def thinking(checkpoints, tmp_path_factory):
    folder = tmp_path_factory.mktemp("thinking") / "model"
    shutil.copytree(checkpoints.repacked(checkpoints.hf("qwen3_moe")), folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": THINKING}))
    return folder


def expected(folder, **variables) -> str:
    model, tokenizer = streamer.load(folder)
    messages = [{"role": "user", "content": "import os"}]
    prompt = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False, **variables
    )
    return streamer.generate(model, tokenizer, prompt, 6) + "\n"


def test_generate_and_chat_pass_the_template_its_variables(thinking, capsys):
    on, off = expected(thinking, enable_thinking=True), expected(thinking)
    assert on != off  # the variable changes the answer
    argv = ["generate", "--model", str(thinking), "-p", "import os", "-m", "6"]
    assert main([*argv, "--chat-template-config", ON]) == 0
    assert capsys.readouterr().out == on
    chat = subprocess.run(
        [sys.executable, "-m", "streamer", "chat", "--model", str(thinking), "-m", "6"]
        + ["--chat-template-config", ON],
        input="import os\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert chat.returncode == 0 and chat.stdout == on, chat.stderr


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("{enable_thinking: false}", "--chat-template-config is not valid JSON"),
        # a RecursionError and a ValueError traceback (Python's limit on an integer's digits)
        pytest.param(
            "[" * 50_000 + "]" * 50_000, "--chat-template-config is nested too deeply", id="deep"
        ),
        pytest.param(
            '{"a": ' + "1" * 5000 + "}",
            "--chat-template-config holds an integer of over 4300",
            id="long-integer",
        ),
        ("[1]", "--chat-template-config must be a JSON object"),
        ('{"messages": []}', "--chat-template-config: messages is apply_chat_template's own"),
    ],
)
def test_a_bad_template_config_is_refused_in_one_line(thinking, capsys, value, message):
    argv = ["generate", "--model", str(thinking), "-p", "hi", "--chat-template-config", value]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("streamer: error: ") and message in err and "Traceback" not in err


@pytest.mark.parametrize(
    "command, flag",
    [
        ("generate", "--chat-template-config"),
        ("chat", "--chat-template-config"),
        ("serve", "--chat-template-args"),
    ],
)
def test_a_variable_the_template_fails_with_is_refused(thinking, command, flag):
    """A variable named as a function the template calls (Qwen3's template calls namespace):
    chat refused each turn, saying to send a shorter message, generate said to fix the
    template, and serve refused every request."""
    argv = [sys.executable, "-m", "streamer", command, "--model", str(thinking)]
    result = subprocess.run(
        argv + ["-p", "hi"] * (command == "generate") + [flag, '{"namespace": 1, "x": 2}'],
        input="import os\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2 and result.stderr.splitlines()[-1] == (
        f"streamer: error: {flag}: the model's chat template fails given namespace (TypeError: "
        "'int' object is not callable): leave it out."
    ), result.stderr


def test_chat_refuses_template_variables_without_a_template(thinking, tmp_path):
    """chat dropped --chat-template-config without a word under --ignore-chat-template (its
    --system-prompt is then the conversation's first text: it is kept)."""
    chat = subprocess.run(
        [sys.executable, "-m", "streamer", "chat", "--model", str(thinking), "-m", "2"]
        + ["--chat-template-config", ON, "--ignore-chat-template"],
        input="import os\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert chat.returncode == 2 and chat.stderr.splitlines()[-1] == (
        "streamer: error: --chat-template-config goes into the chat template, which "
        "--ignore-chat-template leaves out: drop one of them."
    ), chat.stderr


def test_serve_s_template_args_are_every_request_s_defaults(thinking, tmp_path):
    """`--chat-template-args JSON` (mlx_lm.server's): the template variables of every request,
    each of which a request's chat_template_kwargs replaces. It was an unrecognized argument: a
    client that sends no chat_template_kwargs (most) could not have Qwen3's thinking off."""
    from serving import live_server, request

    _, tokenizer = streamer.load(thinking)
    messages = [{"role": "user", "content": "import os"}]

    def tokens(**variables) -> int:
        return len(tokenizer.apply_chat_template(messages, add_generation_prompt=True, **variables))

    assert tokens(enable_thinking=True) != tokens(enable_thinking=False)
    flags = ["--chat-template-args", ON]
    with live_server(thinking, flags, tmp_path / "serve.log") as url:
        for asked, thinks in [
            ({}, True),
            ({"chat_template_kwargs": {"enable_thinking": False}}, False),
        ]:
            body = json.dumps({"messages": messages, "max_tokens": 1, **asked}).encode()
            status, answer = request(url, "POST", "/v1/chat/completions", body)
            assert status == 200, answer
            assert answer["usage"]["prompt_tokens"] == tokens(enable_thinking=thinks)
