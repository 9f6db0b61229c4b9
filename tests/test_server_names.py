"""`streamer serve` under the name clients use: one model answers whatever `model` a request names
(or none), under its served name; and with an API key, only to clients that send it. The
official openai client against live servers (tests/serving.py)."""

from __future__ import annotations

import json

import openai
import pytest
from serving import HELLO, NO_CALL, connection, live_server, request

KEY = "sk-local-test"


def test_any_model_name_is_answered_by_the_served_model(server, client, served_folder):
    name = served_folder.name  # the default: the folder's name
    assert [m.id for m in client.models.list()] == [name]
    assert client.models.retrieve(name).id == name
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")  # what is served is listed as it is
    answers = [
        client.chat.completions.create(
            model=model, messages=HELLO, max_tokens=3, logit_bias=NO_CALL
        )
        for model in ("gpt-4o", "default", "", str(served_folder))
    ]
    assert {a.model for a in answers} == {name}
    assert len({a.choices[0].message.content for a in answers}) == 1  # greedy: the same answer
    body = json.dumps({"messages": HELLO, "max_tokens": 3, "logit_bias": NO_CALL}).encode()
    status, whole = request(server[0], "POST", "/v1/chat/completions", body)
    assert status == 200 and whole["model"] == name
    assert whole["choices"][0]["message"]["content"] == answers[0].choices[0].message.content
    status, text = request(
        server[0], "POST", "/v1/completions", b'{"prompt": "x", "max_tokens": 1}'
    )
    assert status == 200 and text["model"] == name


@pytest.fixture(scope="module")
def keyed(served_folder):
    """A server with its key from STREAMER_API_KEY and a name of its own."""
    log = served_folder.parent / "serve-keyed.log"
    flags = ["--served-model-name", "my-model"]
    with live_server(served_folder, flags, log, env={"STREAMER_API_KEY": KEY}) as url:
        yield url


def test_an_api_key_is_required_on_every_endpoint_but_health(keyed):
    good = openai.OpenAI(base_url=keyed, api_key=KEY, timeout=60, max_retries=0)
    assert [m.id for m in good.models.list()] == ["my-model"]
    answer = good.chat.completions.create(model="x", messages=HELLO, max_tokens=2)
    assert answer.model == "my-model" and answer.usage.completion_tokens == 2
    bad = openai.OpenAI(base_url=keyed, api_key="wrong", timeout=60, max_retries=0)
    for call in (
        bad.models.list,
        lambda: bad.chat.completions.create(model="my-model", messages=HELLO, max_tokens=2),
        lambda: bad.completions.create(model="my-model", prompt="x", max_tokens=2),
    ):
        with pytest.raises(openai.AuthenticationError) as error:
            call()
        assert error.value.code == "invalid_api_key"
    for path in ("/v1/models", "/v1/chat/completions", "/chat/completions", "/v1/nothing"):
        method = "GET" if "models" in path or "nothing" in path else "POST"
        status, body = request(keyed, method, path, b"{}")
        assert status == 401 and "Authorization: Bearer" in body["error"]["message"], body
    basic = {"Authorization": f"Basic {KEY}"}
    assert request(keyed, "GET", "/v1/models", headers=basic)[0] == 401
    assert request(keyed, "GET", "/health") == (200, {"status": "ok"})


def test_a_browser_preflight_lets_the_key_through(keyed):
    """A browser asks first whether it may send Authorization (OPTIONS, no key): "*" in
    Access-Control-Allow-Headers does not cover Authorization there, so the answer names it (it
    was "*" alone, and every browser client with a key was blocked)."""
    http = connection(keyed)
    http.request(
        "OPTIONS",
        "/v1/chat/completions",
        headers={
            "Origin": "http://localhost:3000",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type",
        },
    )
    response = http.getresponse()
    http.close()
    assert response.status == 204
    allowed = response.getheader("Access-Control-Allow-Headers").lower().split(", ")
    assert {"authorization", "*"} <= set(allowed), allowed
    assert response.getheader("Access-Control-Allow-Origin") == "*"


def sent(key: bytes) -> str:
    """The Authorization header as http.server hands it over for a client that sent `key`."""
    import http.client
    import io

    raw = b"Authorization: Bearer " + key + b"\r\n\r\n"
    return http.client.parse_headers(io.BytesIO(raw))["Authorization"]


def test_a_non_ascii_key_matches_the_bytes_a_client_sends():
    """Headers arrive decoded as latin-1: the UTF-8 bytes of a key like 'clé' never matched.
    curl sends a terminal's UTF-8; requests sends latin-1 where the key has a spelling there."""
    from streamer.server.auth import check_key, non_ascii_note
    from streamer.server.fields import ApiError

    for key, others in (
        ("clé", [b"cle", "clé".encode() + b"x", b"\xff\xfe"]),
        ("ключ-鍵", ["ключ-鍵".encode("utf-16"), "ключ".encode()]),
        ("sk-plain", [b"sk-plai", b"sk-plainx"]),
    ):
        check_key(key, "/v1/models", sent(key.encode()))  # accepted: no ApiError
        if key == "clé":
            check_key(key, "/v1/models", sent(key.encode("latin-1")))
        for other in others:
            with pytest.raises(ApiError):
                check_key(key, "/v1/models", sent(other))
    assert non_ascii_note("sk-plain") is None and "only ASCII" in non_ascii_note("clé")


@pytest.mark.parametrize(
    "env, argv, message",
    [
        ({}, ["--api-key", " k1 "], "--api-key begins or ends with white space (' k1 ')"),
        (
            {},
            ["--api-key", "k\x01"],
            "--api-key holds a control character ('\\x01' at character 2)",
        ),
        ({}, ["--api-key", " "], "--api-key is empty"),
        ({"STREAMER_API_KEY": "k\udce9y"}, [], "$STREAMER_API_KEY is not valid UTF-8 (byte 0xe9"),
        ({"STREAMER_API_KEY": "k1 "}, [], "$STREAMER_API_KEY begins or ends with white space"),
    ],
)
def test_a_key_no_client_can_send_is_refused_at_start(env, argv, message, monkeypatch, capsys):
    """A configured ' k1 ' never matched (the sent key is stripped); STREAMER_API_KEY of bytes
    that are not UTF-8 started a server that answered nothing but /health (a traceback a
    request). Refused before the (missing) model is looked at: one line."""
    from streamer.cli import main

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["serve", "--model", "/nonexistent", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
