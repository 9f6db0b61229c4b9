"""Chat messages as newer OpenAI clients send them, rendered by the served model's template."""

from __future__ import annotations

import pytest
from serving import HELLO, WEATHER

from streamer.server.api import Completion, Sampling
from streamer.server.fields import ApiError
from streamer.server.prompts import prompt_tokens


def _prompt(tokenizer, role: str) -> list[int]:
    messages = [{"role": role, "content": "answer briefly"}, *HELLO]
    return prompt_tokens(Completion(True, "m", 2, Sampling(), messages=messages), tokenizer)


def test_a_developer_message_is_a_system_message_unless_the_template_names_it(local, monkeypatch):
    """OpenAI's clients send `developer` for `system`: a template that knows only `system` (as
    Qwen's, which dropped the message) renders it as one."""
    _, tokenizer = local
    assert _prompt(tokenizer, "developer") == _prompt(tokenizer, "system")
    names_it = (
        "{% for m in messages %}{% if m.role == 'developer' %}<|user|>dev: {% else %}"
        "<|{{ m.role }}|>{% endif %}{{ m.content }}\n{% endfor %}<|assistant|>"
    )
    monkeypatch.setattr(tokenizer._tokenizer, "chat_template", names_it)
    assert _prompt(tokenizer, "developer") != _prompt(tokenizer, "system")


def test_tools_a_template_leaves_out_are_refused(local, monkeypatch):
    """A template that renders no tools: the model never saw them and answered as if it had none,
    with no word to the client."""
    _, tokenizer = local
    ask = Completion(True, "m", 2, Sampling(), messages=HELLO, tools=[WEATHER])
    assert len(prompt_tokens(ask, tokenizer)) > len(_prompt(tokenizer, "user"))  # rendered
    no_tools = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}<|assistant|>"
    monkeypatch.setattr(tokenizer._tokenizer, "chat_template", no_tools)
    with pytest.raises(ApiError) as refused:
        prompt_tokens(ask, tokenizer)
    assert refused.value.param == "tools" and "does not render tools" in refused.value.message
    plain = Completion(True, "m", 2, Sampling(), messages=HELLO)  # without tools: as before
    assert prompt_tokens(plain, tokenizer)


def test_a_conversation_with_tools_is_rendered_once(local, monkeypatch):
    """Whether the template renders tools was checked by rendering the whole conversation twice,
    with and without them: every request with tools tokenized its prompt twice (seconds for a
    long chat, every other prompt waiting on the tokenizer's lock)."""
    _, tokenizer = local
    chat = [*HELLO, {"role": "assistant", "content": "x = 1"}] * 20 + HELLO
    expected = tokenizer.apply_chat_template(chat, tools=[WEATHER], add_generation_prompt=True)
    rendered = []
    render = tokenizer._tokenizer.apply_chat_template

    def counting(messages, *args, **kwargs):
        rendered.append(len(messages))
        return render(messages, *args, **kwargs)

    monkeypatch.setattr(tokenizer._tokenizer, "apply_chat_template", counting)
    ask = Completion(True, "m", 2, Sampling(), messages=chat, tools=[WEATHER])
    tokens = prompt_tokens(ask, tokenizer)
    assert rendered.count(len(chat)) == 1
    assert tokens == list(expected)
