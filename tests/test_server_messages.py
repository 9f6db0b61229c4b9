"""Chat messages as newer OpenAI clients send them, rendered by the served model's template."""

from __future__ import annotations

from serving import HELLO

from streamer.server.api import Completion, Sampling
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
