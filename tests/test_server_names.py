"""`streamer serve` under the name clients use: one model answers whatever `model` a request names
(or none), under its served name; and with an API key, only to clients that send it. The
official openai client against live servers (tests/serving.py)."""

from __future__ import annotations

import json

import openai
import pytest
from serving import HELLO, NO_CALL, live_server, request

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
