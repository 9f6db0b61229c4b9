"""Answers streamed, through the live server (tests/serving.py): /v1/completions with the same
text, stop and logprobs as the whole answer, and the usage chunk when asked for; chat chunks as
OpenAI's streaming helper joins them."""

from __future__ import annotations

from mlx_lm.sample_utils import make_logits_processors
from serving import CALL, HELLO, NO_CALL, NO_EOS

import streamer

CALLING = make_logits_processors({512: 100})  # the call token, every time


def test_a_streamed_text_completion_is_the_whole_one(client, served_folder, local):
    model, tokenizer = local
    no_call = make_logits_processors({512: -100})
    want = streamer.generate(model, tokenizer, "The file", 8, logits_processors=no_call)
    ask = dict(model=str(served_folder), prompt="The file", max_tokens=8, logit_bias=NO_CALL)
    whole = client.completions.create(**ask, logprobs=2)
    chunks = list(
        client.completions.create(
            **ask, logprobs=2, stream=True, stream_options={"include_usage": True}
        )
    )
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert "".join(texts) == whole.choices[0].text == want
    streamed = [
        t
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for t in c.choices[0].logprobs.tokens
    ]
    assert streamed == whole.choices[0].logprobs.tokens
    (usage,) = [c.usage for c in chunks if c.usage is not None]
    assert (usage.prompt_tokens, usage.completion_tokens) == (
        whole.usage.prompt_tokens,
        whole.usage.completion_tokens,
    )
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [c.choices[0].finish_reason for c in finals] == ["length"]
    assert "expert_mb_per_token" in finals[0].model_extra["streamer"]

    stop = want[3:5]  # cut exactly where the stop string starts, streamed as whole
    cut = client.completions.create(**ask, stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in cut if c.choices) == want[: want.index(stop)]


def test_a_streamed_chat_names_its_role_once(client, served_folder):
    """OpenAI's streaming helper joins the deltas' strings: with the role in every chunk, its
    answer's role was 'assistantassistant...'."""
    ask = dict(model=str(served_folder), messages=HELLO, max_tokens=4, logit_bias=NO_EOS)
    with client.chat.completions.stream(**ask) as stream:
        for _ in stream:
            pass
        answer = stream.current_completion_snapshot
    assert answer.choices[0].message.role == "assistant"
    chunks = list(client.chat.completions.create(**ask, stream=True))
    assert [c.choices[0].delta.role for c in chunks][:2] == ["assistant", None]
    assert answer.choices[0].message.content == "".join(
        c.choices[0].delta.content or "" for c in chunks
    )


def test_a_text_completion_is_the_text_the_model_made(client, served_folder, local):
    """/v1/completions is raw text: a tool call (or a think block) the model wrote was taken out
    as the chat endpoint takes it, so the answer's text lacked it (here it was empty) and its
    finish_reason was "tool_calls", which completions do not have."""
    model, tokenizer = local
    ask = dict(model=str(served_folder), prompt="The file", max_tokens=2, logit_bias={"512": 100})
    want = streamer.generate(model, tokenizer, "The file", 2, logits_processors=CALLING)
    assert want == CALL * 2
    whole = client.completions.create(**ask)
    streamed = list(client.completions.create(**ask, stream=True))
    assert whole.choices[0].text == "".join(c.choices[0].text for c in streamed) == want
    assert whole.choices[0].finish_reason == streamed[-1].choices[0].finish_reason == "length"
