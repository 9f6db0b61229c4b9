"""`streamer serve` as clients use it: the official openai client against a live server
(tests/serving.py), every answer the library's own."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import pytest
from mlx_lm.sample_utils import make_logits_processors
from serving import CALL, HELLO, NO_CALL, NO_EOS, WEATHER, connection, expected, request

import streamer


def test_models_and_health(server, client, served_folder):
    assert [m.id for m in client.models.list()] == [served_folder.name]
    assert "read path slots (asked for)" in server[1].read_text()
    assert request(server[0], "GET", "/health") == (200, {"status": "ok"})
    # every field of OpenAI's Model, `created` too (typed clients refused a model without it)
    status, listing = request(server[0], "GET", "/v1/models")
    (model,) = listing["data"]
    assert set(model) == {"id", "object", "created", "owned_by"}
    assert isinstance(model["created"], int) and model["created"] > 0
    assert request(server[0], "GET", f"/v1/models/{served_folder.name}") == (200, model)
    # without /v1, as the completions are answered (a client's base URL without it): a 404
    assert request(server[0], "GET", "/models") == (200, listing)
    assert request(server[0], "GET", f"/models/{served_folder.name}") == (200, model)


def test_chat_whole_and_streamed_match_the_library(client, served_folder, local):
    want = expected(local, HELLO, 12)
    whole = client.chat.completions.create(
        model=str(served_folder), messages=HELLO, max_tokens=12, logit_bias=NO_CALL
    )
    assert whole.choices[0].message.content == want
    assert whole.usage.completion_tokens == 12 and whole.choices[0].finish_reason == "length"
    assert whole.model_extra["streamer"]["generation_tokens_per_second"] > 0
    for include_usage in (True, False):
        chunks = list(
            client.chat.completions.create(
                model=str(served_folder),
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


def test_text_completion_and_logprobs(client, served_folder, local):
    model, tokenizer = local
    no_call = make_logits_processors({512: -100})
    want = streamer.generate(model, tokenizer, "The file", 6, logits_processors=no_call)
    result = client.completions.create(
        model=str(served_folder), prompt="The file", max_tokens=6, logprobs=3, logit_bias=NO_CALL
    )
    assert result.choices[0].text == want
    logprobs = result.choices[0].logprobs
    assert len(logprobs.tokens) == 6 and "".join(logprobs.tokens).removeprefix(" ") == want
    for logprob, top in zip(logprobs.token_logprobs, logprobs.top_logprobs):
        # OpenAI's legacy top_logprobs is a dict by token text: two tokens that decode alike
        # (byte pieces of one character, "\ufffd") are one entry
        assert 1 <= len(top) <= 3 and max(top.values()) == pytest.approx(logprob)  # greedy: the top
    chat = client.chat.completions.create(
        model=str(served_folder),
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


def test_stop_strings_cut_exactly(client, served_folder, local):
    text = expected(local, HELLO, 24)
    stop = text[7:10]  # a piece from inside some token, most likely not on a token boundary
    want = text[: text.index(stop)]
    whole = client.chat.completions.create(
        model=str(served_folder),
        messages=HELLO,
        max_tokens=24,
        stop=[stop, "never printed"],
        logit_bias=NO_CALL,
    )
    assert whole.choices[0].message.content == want
    assert whole.choices[0].finish_reason == "stop"
    chunks = client.chat.completions.create(
        model=str(served_folder),
        messages=HELLO,
        max_tokens=24,
        stop=stop,
        stream=True,
        logit_bias=NO_CALL,
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want
    # stop "" is none, as mlx-lm's server reads it: it was a 400
    blank = client.chat.completions.create(
        model=str(served_folder), messages=HELLO, max_tokens=24, stop="", logit_bias=NO_CALL
    )
    assert blank.choices[0].message.content == text


def test_conversation_reuses_the_cached_prefix(client, served_folder, local):
    first = client.chat.completions.create(
        model=str(served_folder), messages=HELLO, max_tokens=8, logit_bias=NO_CALL
    )
    reply = first.choices[0].message.content
    turn = [*HELLO, {"role": "assistant", "content": reply}, {"role": "user", "content": "more"}]
    second = client.chat.completions.create(
        model=str(served_folder), messages=turn, max_tokens=8, logit_bias=NO_CALL
    )
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached < second.usage.prompt_tokens
    assert second.choices[0].message.content == expected(local, turn, 8)  # reuse is exact


def test_tools_reach_the_template_and_calls_are_parsed(client, served_folder):
    plain = client.chat.completions.create(model=str(served_folder), messages=HELLO, max_tokens=1)
    args = dict(model=str(served_folder), messages=HELLO, tools=[WEATHER], max_tokens=1)
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
    again = client.chat.completions.create(model=str(served_folder), messages=history, max_tokens=2)
    assert again.usage.prompt_tokens > whole.usage.prompt_tokens
    # a call of no arguments sent back with arguments "", which mlx-lm takes as none: it was
    # refused as not JSON
    empty = {"id": "1", "type": "function", "function": {"name": "now", "arguments": ""}}
    history = [
        *HELLO,
        {"role": "assistant", "content": None, "tool_calls": [empty]},
        {"role": "tool", "tool_call_id": "1", "content": "noon"},
    ]
    after = client.chat.completions.create(model=str(served_folder), messages=history, max_tokens=1)
    assert after.usage.completion_tokens == 1


@pytest.mark.parametrize("stream", [False, True])
def test_parallel_tool_calls_false_answers_one_call(client, served_folder, stream):
    """OpenAI's parallel_tool_calls: false (at most one call a turn) was accepted and ignored:
    the answer carried every call the model wrote. Generation ends at the first call."""
    ask = dict(model=str(served_folder), messages=HELLO, tools=[WEATHER], max_tokens=3)
    ask.update(logit_bias={"512": 100}, parallel_tool_calls=False)
    if stream:
        chunks = list(client.chat.completions.create(**ask, stream=True))
        calls = [t for c in chunks for t in c.choices[0].delta.tool_calls or ()]
        finish = chunks[-1].choices[0].finish_reason
    else:
        whole = client.chat.completions.create(**ask)
        calls, finish = whole.choices[0].message.tool_calls, whole.choices[0].finish_reason
        assert whole.usage.completion_tokens == 1
    assert [c.function.name for c in calls] == ["get_weather"] and finish == "tool_calls"
    del ask["parallel_tool_calls"]  # the default: every call, as before
    assert len(client.chat.completions.create(**ask).choices[0].message.tool_calls) == 3


@pytest.mark.parametrize("tools", [{}, {"tools": [WEATHER], "tool_choice": "none"}])
def test_a_call_written_without_tools_to_call_is_text(client, served_folder, tools):
    """OpenAI answers no tool calls to a request that gives no tools (or tool_choice none): a call
    the model wrote anyway was taken out of the content as a call (a client that reads calls out
    of the text itself, as agents prompted with their tools do, got an empty answer)."""
    ask = dict(model=str(served_folder), messages=HELLO, max_tokens=2, logit_bias={"512": 100})
    whole = client.chat.completions.create(**ask, **tools)
    assert whole.choices[0].message.content == CALL * 2
    assert whole.choices[0].message.tool_calls is None
    assert whole.choices[0].finish_reason == "length"
    chunks = list(client.chat.completions.create(**ask, **tools, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == CALL * 2
    assert not any(c.choices[0].delta.tool_calls for c in chunks)


@pytest.mark.parametrize("stream", [False, True])
def test_a_call_that_is_not_name_and_arguments_is_dropped_not_fatal(stream):
    """A model's `{"name": "f"}` (no arguments) or `5` between the call markers: mlx-lm's
    formatter raised (KeyError, AttributeError) in the handler, the answer lost."""
    from mlx_lm.tool_parsers.json_tools import parse_tool_call

    from streamer.server.api import Completion, Sampling
    from streamer.server.jobs import Done
    from streamer.server.output import Piece
    from streamer.server.responses import Answer

    answer = Answer(Completion(True, "m", 2, Sampling(), stream=stream), parse_tool_call)
    piece = Piece(tool_calls=['{"name": "f"}', "5", '{"name": "g", "arguments": {}}'])
    if stream:
        calls = answer.chunk(piece, [])["choices"][0]["delta"]["tool_calls"]
        assert [c["index"] for c in calls] == [0]
    else:
        answer.add(piece, [])
        done = Done("tool_calls", 1, 0, 1, None)
        calls = answer.whole(done)["choices"][0]["message"]["tool_calls"]
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [("g", "{}")]


@pytest.mark.parametrize("stream", [False, True])
def test_an_answer_whose_every_call_was_dropped_finishes_stop(stream):
    """finish_reason was "tool_calls" with no tool call in the answer (OpenAI's clients then look
    for calls that are not there), and a stream sent `"tool_calls": []`."""
    from mlx_lm.tool_parsers.json_tools import parse_tool_call

    from streamer.server.api import Completion, Sampling
    from streamer.server.jobs import Done
    from streamer.server.output import Piece
    from streamer.server.responses import Answer

    answer = Answer(Completion(True, "m", 2, Sampling(), stream=stream), parse_tool_call)
    piece = Piece(content="Calling. ", tool_calls=['{"name": "f"}'])
    if stream:
        assert answer.chunk(piece, [])["choices"][0]["delta"] == {
            "role": "assistant",
            "content": "Calling. ",
        }
        choice = answer.chunk(Piece(), [], "tool_calls")["choices"][0]
    else:
        answer.add(piece, [])
        choice = answer.whole(Done("tool_calls", 1, 0, 1, None))["choices"][0]
        assert choice["message"] == {"role": "assistant", "content": "Calling. "}
    assert choice["finish_reason"] == "stop"


def test_two_clients_at_once_queue(client, served_folder, local):
    prompts = [[{"role": "user", "content": "class Reader:"}], HELLO]
    want = [expected(local, p, 16) for p in prompts]
    got = [None, None]

    def ask(i):
        got[i] = client.chat.completions.create(
            model=str(served_folder), messages=prompts[i], max_tokens=16, logit_bias=NO_CALL
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


def test_a_client_that_leaves_stops_its_generation(server, client, served_folder):
    url, log = server
    seen = len(re.findall("client gone", log.read_text()))
    body = dict(model=str(served_folder), messages=HELLO, max_tokens=1000, logit_bias=NO_EOS)
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
    after = client.chat.completions.create(model=str(served_folder), messages=HELLO, max_tokens=2)
    assert after.usage.completion_tokens == 2  # and the server carries on


def test_the_next_turn_after_a_client_left_mid_answer_reuses_its_prompt(
    server, client, served_folder
):
    """What the cut answer computed stays kept (it did: a guard beside the failed step's test in
    test_server_prompt_cache.py): asked again, only the last prompt token is prefilled (a
    conversation no other test sends)."""
    url, log = server
    seen = len(re.findall("client gone", log.read_text()))
    messages = [{"role": "user", "content": "def parse_hostfile(lines):"}]
    body = dict(model=str(served_folder), messages=messages, max_tokens=1000, logit_bias=NO_EOS)
    http = connection(url)
    http.request("POST", "/v1/chat/completions", body=json.dumps({**body, "stream": True}))
    response = http.getresponse()
    while not response.readline().startswith(b"data: "):
        pass
    response.close()  # hang up after the first event
    http.close()
    assert _stopped_after(log, seen) < 1000
    again = client.chat.completions.create(**{**body, "max_tokens": 1})
    usage = again.usage
    assert usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens - 1, usage


def test_values_the_sampler_cannot_take_as_given_still_answer(client, served_folder):
    """A top_k past the vocabulary keeps every token (mlx-lm's sampler would refuse it)."""
    common = dict(model=str(served_folder), messages=HELLO, max_tokens=3, temperature=1.0, seed=3)
    every = client.chat.completions.create(**common, extra_body={"top_k": 100000})
    off = client.chat.completions.create(**common, extra_body={"top_k": 0})
    assert every.choices[0].message.content == off.choices[0].message.content


def test_a_burst_of_clients_is_queued_never_reset(server):
    """64 clients connecting at once: each is answered (socketserver's listen backlog of 5 reset
    most of them)."""
    url, _ = server
    start, answers = threading.Barrier(64), []

    def ask():
        start.wait()
        body = json.dumps({"prompt": "hello", "max_tokens": 2}).encode()
        answers.append(request(url, "POST", "/v1/completions", body)[0])

    threads = [threading.Thread(target=ask) for _ in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert answers == [200] * 64
