"""`streamer serve` as clients use it: the official openai client against a live server."""

from __future__ import annotations

import http.client
import json
import re
import shutil
import socket
import subprocess
import sys
import threading
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


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
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


@pytest.fixture(scope="module")
def server(folder):
    """`streamer serve` on a free port; yields (base url, log file)."""
    log = folder.parent / "serve.log"
    with open(log, "w") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "streamer", "serve", "--model", str(folder), "--port", "0"]
            + SERVE_FLAGS,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        deadline = time.monotonic() + 120
        while not (found := re.search(r"listening on (http://\S+)", log.read_text())):
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.1)
        yield found.group(1), log
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server[0], api_key="unused", timeout=60, max_retries=0)


@pytest.fixture(scope="module")
def local(folder):
    """The same model in this process: what the server must answer, computed by the library."""
    return streamer.load(folder)


def expected(local, messages, max_tokens, tools=None) -> str:
    model, tokenizer = local
    prompt = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True)
    no_call = make_logits_processors({512: -100})
    return streamer.generate(model, tokenizer, prompt, max_tokens, logits_processors=no_call)


HELLO = [{"role": "user", "content": "def read_config(path):"}]


def connection(url: str, timeout: float = 60) -> http.client.HTTPConnection:
    parts = urlsplit(url)
    return http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)


def request(url: str, method: str, path: str, body: bytes | None = None):
    """(status, JSON body) of one raw request to the server at `url` (its /v1 base)."""
    http = connection(url)
    try:
        http.request(method, path, body=body, headers={"Content-Type": "application/json"})
        response = http.getresponse()
        return response.status, json.loads(response.read())
    finally:
        http.close()


def test_models_and_health(server, client, folder):
    assert [m.id for m in client.models.list()] == [str(folder)]
    assert "read path slots (asked for)" in server[1].read_text()
    assert request(server[0], "GET", "/health") == (200, {"status": "ok"})


def test_chat_whole_and_streamed_match_the_library(client, folder, local):
    want = expected(local, HELLO, 12)
    whole = client.chat.completions.create(
        model=str(folder), messages=HELLO, max_tokens=12, logit_bias=NO_CALL
    )
    assert whole.choices[0].message.content == want
    assert whole.usage.completion_tokens == 12 and whole.choices[0].finish_reason == "length"
    assert whole.model_extra["streamer"]["generation_tokens_per_second"] > 0
    for include_usage in (True, False):
        chunks = list(
            client.chat.completions.create(
                model=str(folder),
                messages=HELLO,
                max_tokens=12,
                stream=True,
                stream_options={"include_usage": include_usage},
                logit_bias=NO_CALL,
            )
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == want
        usage = [c.usage for c in chunks if c.usage is not None]
        assert len(usage) == int(include_usage)
        if include_usage:
            assert usage[0].prompt_tokens == whole.usage.prompt_tokens
            assert usage[0].completion_tokens == 12
        finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
        assert [c.choices[0].finish_reason for c in finals] == ["length"]
        assert "expert_mb_per_token" in finals[0].model_extra["streamer"]


def test_text_completion_and_logprobs(client, folder, local):
    model, tokenizer = local
    no_call = make_logits_processors({512: -100})
    want = streamer.generate(model, tokenizer, "The file", 6, logits_processors=no_call)
    result = client.completions.create(
        model=str(folder), prompt="The file", max_tokens=6, logprobs=3, logit_bias=NO_CALL
    )
    assert result.choices[0].text == want
    logprobs = result.choices[0].logprobs
    assert len(logprobs.tokens) == 6 and "".join(logprobs.tokens).removeprefix(" ") == want
    for logprob, top in zip(logprobs.token_logprobs, logprobs.top_logprobs):
        assert len(top) == 3 and max(top.values()) == pytest.approx(logprob)  # greedy: the top
    chat = client.chat.completions.create(
        model=str(folder),
        messages=HELLO,
        max_tokens=4,
        logprobs=True,
        top_logprobs=2,
        logit_bias=NO_CALL,
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == 4 and all(len(c.top_logprobs) == 2 for c in content)
    # mlx-lm's streaming detokenizer drops the answer's leading space; a token's own text keeps it
    text = "".join(c.token for c in content)
    assert text.removeprefix(" ") == chat.choices[0].message.content


def test_stop_strings_cut_exactly(client, folder, local):
    text = expected(local, HELLO, 24)
    stop = text[7:10]  # a piece from inside some token, most likely not on a token boundary
    want = text[: text.index(stop)]
    whole = client.chat.completions.create(
        model=str(folder),
        messages=HELLO,
        max_tokens=24,
        stop=[stop, "never printed"],
        logit_bias=NO_CALL,
    )
    assert whole.choices[0].message.content == want
    assert whole.choices[0].finish_reason == "stop"
    chunks = client.chat.completions.create(
        model=str(folder), messages=HELLO, max_tokens=24, stop=stop, stream=True, logit_bias=NO_CALL
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want


def test_conversation_reuses_the_cached_prefix(client, folder, local):
    first = client.chat.completions.create(
        model=str(folder), messages=HELLO, max_tokens=8, logit_bias=NO_CALL
    )
    reply = first.choices[0].message.content
    turn = [*HELLO, {"role": "assistant", "content": reply}, {"role": "user", "content": "more"}]
    second = client.chat.completions.create(
        model=str(folder), messages=turn, max_tokens=8, logit_bias=NO_CALL
    )
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached < second.usage.prompt_tokens
    assert second.choices[0].message.content == expected(local, turn, 8)  # reuse is exact


def test_tools_reach_the_template_and_calls_are_parsed(client, folder):
    plain = client.chat.completions.create(model=str(folder), messages=HELLO, max_tokens=1)
    args = dict(model=str(folder), messages=HELLO, tools=[WEATHER], max_tokens=1)
    whole = client.chat.completions.create(**args, logit_bias={"512": 100})
    assert whole.usage.prompt_tokens > plain.usage.prompt_tokens  # the tool list is rendered
    (call,) = whole.choices[0].message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert whole.choices[0].message.content is None
    chunks = list(client.chat.completions.create(**args, logit_bias={"512": 100}, stream=True))
    calls = [t for c in chunks if c.choices for t in c.choices[0].delta.tool_calls or ()]
    assert [(t.function.name, json.loads(t.function.arguments)) for t in calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    # a tool call and its result sent back render through the template
    history = [
        *HELLO,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    again = client.chat.completions.create(model=str(folder), messages=history, max_tokens=2)
    assert again.usage.prompt_tokens > whole.usage.prompt_tokens


def test_two_clients_at_once_queue(client, folder, local):
    prompts = [[{"role": "user", "content": "class Reader:"}], HELLO]
    want = [expected(local, p, 16) for p in prompts]
    got = [None, None]

    def ask(i):
        got[i] = client.chat.completions.create(
            model=str(folder), messages=prompts[i], max_tokens=16, logit_bias=NO_CALL
        )

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert [g.choices[0].message.content for g in got] == want


def _stopped_after(log: Path, seen: int) -> int:
    """Tokens generated by the next cancelled request the server logs after `seen` of them."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = re.findall(r"client gone: stopped after (\d+) of", log.read_text())
        if len(found) > seen:
            return int(found[seen])
        time.sleep(0.05)
    raise AssertionError("the server did not stop the generation")


def test_a_client_that_leaves_stops_its_generation(server, client, folder):
    url, log = server
    seen = len(re.findall("client gone", log.read_text()))
    body = dict(model=str(folder), messages=HELLO, max_tokens=1000, logit_bias=NO_EOS)
    http = connection(url)
    http.request("POST", "/v1/chat/completions", body=json.dumps({**body, "stream": True}))
    response = http.getresponse()
    assert response.status == 200
    while not response.readline().startswith(b"data: "):  # ": waiting" comments until then
        pass
    response.close()  # hang up after the first event
    http.close()
    assert _stopped_after(log, seen) < 1000
    http = connection(url, timeout=0.3)  # a whole answer waited for, then abandoned
    http.request("POST", "/v1/chat/completions", body=json.dumps(body))
    with pytest.raises(TimeoutError):
        http.getresponse()
    http.close()
    assert _stopped_after(log, seen + 1) < 1000
    after = client.chat.completions.create(model=str(folder), messages=HELLO, max_tokens=2)
    assert after.usage.completion_tokens == 2  # and the server carries on


@pytest.mark.parametrize(
    "body, status, words",
    [
        (b"{not json", 400, "not valid JSON"),
        (b"[1, 2]", 400, "JSON object"),
        (b"\xff\xfe", 400, "UTF-8"),
        (b'{"model": "M", "messages": [], "max_tokens": 2}', 400, "messages"),
        (b'{"model": "M", "messages": [{"role": "x", "content": "hi"}]}', 400, "role"),
        (b'{"model": "M", "messages": [{"role": "user", "content": 5}]}', 400, "content"),
        (b'{"model": "nope", "messages": [{"role": "user", "content": "hi"}]}', 404, "nope"),
        (
            b'{"model": "M", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}',
            400,
            "temperature",
        ),
        (
            b'{"model": "M", "messages": [{"role": "user", "content": "hi"}], "top_p": 2}',
            400,
            "top_p",
        ),
        (
            b'{"model": "M", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}',
            400,
            "max_tokens",
        ),
        (
            b'{"model": "M", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5000}',
            400,
            "context",
        ),
        (
            b'{"model": "M", "messages": [{"role": "user", "content": "hi"}], "seed": 1.5}',
            400,
            "seed",
        ),
        (
            b'{"model": "M", "messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2}',
            400,
            "logprobs",
        ),
        (
            b'{"model": "M", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}',
            400,
            "JSON",
        ),
        (b'{"model": "M", "prompt": [99999]}', 400, "token ids"),
        (  # JSON's 1e400 is Python's inf
            b'{"model": "M", "messages": [{"role": "user", "content": "x"}], "temperature": 1e400}',
            400,
            "temperature",
        ),
    ],
)
def test_bad_requests_get_openai_errors(server, folder, body, status, words):
    path = "/v1/completions" if b'"prompt"' in body else "/v1/chat/completions"
    got, answer = request(
        server[0], "POST", path, body.replace(b'"M"', json.dumps(str(folder)).encode())
    )
    assert got == status, answer
    error = answer["error"]
    assert words in error["message"] and error["type"] == "invalid_request_error"


HI = [{"role": "user", "content": "hi"}]
CALLED = {"role": "assistant", "content": None}


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"seed": -1}, "seed"),
        ({"seed": 2**64}, "seed"),
        ({"max_tokens": 2**70}, "max_tokens"),
        ({"top_k": 10**20}, "top_k"),
        ({"temperature": 1e-300}, "temperature"),
        ({"repetition_penalty": 1e308}, "repetition_penalty"),
        ({"presence_penalty": 2**2000}, "presence_penalty"),
        ({"logit_bias": {"99999999999999999999999": 1}}, "logit_bias"),
        ({"logit_bias": {"1": "x"}}, "logit_bias"),
        ({"logit_bias": {"1.5": 1}}, "logit_bias"),
        ({"logit_bias": {"99999": 1}}, "past the model's vocabulary"),  # found at the first step
        ({"logit_bias": {"99999": 1}, "stream": True}, "past the model's vocabulary"),
        ({"stop": ["a", 5]}, "stop"),
        ({"stop": ["a"] * 17}, "stop"),
        ({"stop": "x" * 1001}, "stop"),
        ({"stop": {"a": 1}}, "stop"),
        ({"logprobs": 1}, "logprobs"),
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"stream": "yes"}, "stream"),
        ({"stream": True, "stream_options": {"include_usage": "yes"}}, "include_usage"),
        ({"stream_options": []}, "stream_options"),
        ({"n": 2}, "n must be 1"),
        ({"tools": {"a": 1}}, "tools"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": 5}}]}, "tools"),
        ({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"chat_template_kwargs": {"tokenize": False}}, "chat_template_kwargs"),
        ({"chat_template_kwargs": 5}, "chat_template_kwargs"),
        ({"messages": [{"role": "user", "content": "\ud800"}]}, "UTF-8"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "text parts"),
        ({"messages": [{"role": "user", "content": "x", "name": 5}]}, "name"),
        ({"messages": [{**CALLED, "tool_calls": 5}]}, "tool_calls"),
        ({"messages": [{**CALLED, "tool_calls": ["x"]}]}, "tool_calls[0]"),
        ({"messages": [{**CALLED, "tool_calls": [{"function": None}]}]}, "tool_calls[0]"),
        (
            {"messages": [{**CALLED, "tool_calls": [{"function": {"name": "f", "arguments": 5}}]}]},
            "arguments",
        ),
        (
            {
                "messages": [
                    {**CALLED, "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]}
                ]
            },
            "arguments are not JSON",
        ),
    ],
)
def test_every_field_is_checked(server, folder, fields, words):
    """Each bad value a 4xx naming the field, streamed or not: never a 500 or a lost connection."""
    body = {"model": str(folder), "messages": HI, "max_tokens": 2, **fields}
    got, answer = request(server[0], "POST", "/v1/chat/completions", json.dumps(body).encode())
    assert got == 400, answer
    assert words in answer["error"]["message"], answer


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"prompt": [[1, 2], [3]]}, "one prompt"),
        ({"prompt": [-1]}, "prompt"),
        ({"prompt": [True]}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"logprobs": True}, "logprobs"),
        ({"logprobs": 21}, "logprobs"),
        ({"echo": True}, "echo"),
        ({"best_of": 3}, "best_of"),
        ({"seed": -5}, "seed"),
    ],
)
def test_every_text_completion_field_is_checked(server, folder, fields, words):
    body = {"model": str(folder), "prompt": "hi", "max_tokens": 2, **fields}
    got, answer = request(server[0], "POST", "/v1/completions", json.dumps(body).encode())
    assert got == 400, answer
    assert words in answer["error"]["message"], answer


def test_values_the_sampler_cannot_take_as_given_still_answer(client, folder):
    """A top_k past the vocabulary keeps every token (mlx-lm's sampler would refuse it)."""
    common = dict(model=str(folder), messages=HELLO, max_tokens=3, temperature=1.0, seed=3)
    every = client.chat.completions.create(**common, extra_body={"top_k": 100000})
    off = client.chat.completions.create(**common, extra_body={"top_k": 0})
    assert every.choices[0].message.content == off.choices[0].message.content


def test_malformed_bodies_and_connections(server, folder):
    url = urlsplit(server[0])
    deep = b'{"model": ' + b"[" * 100000 + b"]" * 100000 + b"}"
    assert request(server[0], "POST", "/v1/chat/completions", deep)[0] == 400
    http = connection(server[0])
    http.request("HEAD", "/v1/models")
    assert http.getresponse().status == 405  # (a HEAD answer has no body)
    http.close()
    ok = {"model": str(folder), "messages": HI, "max_tokens": 1}
    # a query string (as Azure-style clients add) does not change the route
    status, body = request(server[0], "POST", "/v1/chat/completions?x=1", json.dumps(ok).encode())
    assert status == 200 and body["usage"]["completion_tokens"] == 1
    with socket.create_connection((url.hostname, url.port), timeout=30) as s:
        s.sendall(  # a body shorter than its Content-Length, then the client closes its side
            b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 100\r\n\r\n{}"
        )
        s.shutdown(socket.SHUT_WR)
        assert s.recv(100).startswith(b"HTTP/1.0 400")


def test_the_server_logged_no_traceback(server, client, folder):
    """Runs after the bad inputs above: none of them reached a traceback, the server serves on."""
    after = client.chat.completions.create(model=str(folder), messages=HELLO, max_tokens=2)
    assert after.usage.completion_tokens == 2
    assert "Traceback" not in server[1].read_text()


def test_a_prompt_over_the_context_is_refused_by_the_client(client, folder):
    long = [{"role": "user", "content": "word " * CONTEXT}]
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=str(folder), messages=long, max_tokens=2)
    assert error.value.code == "context_length_exceeded"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=HELLO)


def test_unknown_paths_and_missing_length(server):
    assert request(server[0], "GET", "/v1/nothing")[0] == 404
    status, body = request(server[0], "DELETE", "/v1/models")
    assert status == 405 and "use GET or POST" in body["error"]["message"]
    url = urlsplit(server[0])
    with socket.create_connection((url.hostname, url.port)) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.0\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.0 411")
