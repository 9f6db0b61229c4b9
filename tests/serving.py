"""The live `streamer serve` the server tests talk to, started once per session (a pytest plugin
named in conftest.py), and what they share: the tiny tool-calling model, raw requests, the
library's own answer to compare with."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import openai
import pytest
from mlx_lm.sample_utils import make_logits_processors
from tokenizers import AddedToken, Tokenizer

import streamer
from fixtures import tiny_config, write_hf_checkpoint
from streamer.repack import repack

# One token that is a whole tool call, so a logit bias makes the tiny random model call a tool.
CALL = '<tool_call>{"name":"get_weather","arguments":{"city":"Paris"}}</tool_call>'
# Tools rendered into the prompt; `<tool_call>` and `tool_call.name` make mlx-lm pick its
# json_tools parser, as for Qwen's templates.
TEMPLATE = (
    "{% if tools %}<|system|>tools:{% for t in tools %} {{ t.function.name }}{% endfor %}\n"
    "{% endif %}{% for m in messages %}<|{{ m.role }}|>{{ m.content or '' }}"
    "{% for tool_call in m.tool_calls or [] %}{% if tool_call.function %}"
    "{% set tool_call = tool_call.function %}{% endif %}"
    '<tool_call>{"name":"{{ tool_call.name }}","arguments":{{ tool_call.arguments | tojson }}}'
    "</tool_call>{% endfor %}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CONTEXT = 1024
# The random model emits the CALL token now and then: plain answers are generated without it.
NO_CALL = {"512": -100}
NO_EOS = {**NO_CALL, "0": -100}  # the tiny model's EOS is token 0: keep it generating


@pytest.fixture(scope="session")
def served_folder(tmp_path_factory) -> Path:
    """A repacked tiny qwen3_moe whose tokenizer has a tool-calling template and the CALL token."""
    root = tmp_path_factory.mktemp("serve")
    hf = root / "hf"
    write_hf_checkpoint(
        hf, tiny_config("qwen3_moe", vocab_size=520, max_position_embeddings=CONTEXT)
    )
    tokenizer = Tokenizer.from_file(str(hf / "tokenizer.json"))
    tokenizer.add_tokens([AddedToken(CALL, special=False, normalized=False)])
    tokenizer.save(str(hf / "tokenizer.json"))
    config = json.loads((hf / "tokenizer_config.json").read_text())
    (hf / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TEMPLATE}))
    repack(hf, root / "tiny-tools", log=lambda _: None)
    shutil.rmtree(hf)
    return root / "tiny-tools"


# Experts stream through the slot pool (the Metal and CUDA default), each checked on its first
# read: every answer below must still be what the library computes with the CPU's default path.
SERVE_FLAGS = ["--read-path", "slots", "--memory-budget", "0", "--verify-reads"]


@contextlib.contextmanager
def live_server(
    folder: Path, flags: list[str], log: Path, env: dict | None = None, nofile: int | None = None
):
    """`streamer serve --model folder --port 0 flags` running (with `nofile`, under that hard
    limit on open files); yields its base url. After it stops, its log shows no traceback."""
    with open(log, "w") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "streamer", "serve", "--model", str(folder), "--port", "0"]
            + flags,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=None if env is None else {**os.environ, **env},
            preexec_fn=None if nofile is None else lambda: _limit_files(nofile),
        )
    try:
        deadline = time.monotonic() + 120
        while not (found := re.search(r"listening on (http://\S+)", log.read_text())):
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.1)
        yield found.group(1)
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert "Traceback" not in log.read_text(), log.read_text()[-3000:]


def _limit_files(most: int) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (most, most))


@pytest.fixture(scope="session")
def server(served_folder):
    """`streamer serve` on a free port; yields (base url, log file). After every server test of
    the session, whichever file it is in, nothing reached a traceback."""
    log = served_folder.parent / "serve.log"
    with live_server(served_folder, SERVE_FLAGS, log) as url:
        yield url, log


@pytest.fixture(scope="session")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server[0], api_key="unused", timeout=60, max_retries=0)


@pytest.fixture(scope="session")
def local(served_folder):
    """The same model in this process: what the server must answer, computed by the library."""
    return streamer.load(served_folder)


def expected(local, messages, max_tokens, tools=None) -> str:
    model, tokenizer = local
    prompt = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True)
    no_call = make_logits_processors({512: -100})
    return streamer.generate(model, tokenizer, prompt, max_tokens, logits_processors=no_call)


HELLO = [{"role": "user", "content": "def read_config(path):"}]


def connection(url: str, timeout: float = 60) -> http.client.HTTPConnection:
    parts = urlsplit(url)
    return http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)


def request(url: str, method: str, path: str, body: bytes | None = None, headers=None):
    """(status, JSON body) of one raw request to the server at `url` (its /v1 base)."""
    http = connection(url)
    try:
        headers = {"Content-Type": "application/json", **(headers or {})}
        http.request(method, path, body=body, headers=headers)
        response = http.getresponse()
        return response.status, json.loads(response.read())
    finally:
        http.close()
