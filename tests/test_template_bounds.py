"""A chat template is code from the model's files: one that loops without end or makes gigabytes of
text rendered until the process was killed (generate, chat, and serve with its tokenizer held for
every request). Rendered within bounds, it ends in one line; a normal one renders as before."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from serving import TEMPLATE, WEATHER

import streamer
from fixtures.tokenizer import CHAT_TEMPLATE
from streamer.loading.tokenizer import load_tokenizer
from streamer.server import template_bounds
from streamer.server.api import Completion, Sampling
from streamer.server.fields import ApiError
from streamer.server.prompts import prompt_tokens
from streamer.server.template_bounds import render
from streamer.server.template_checks import TemplateBoundPassed

CONTEXT = 1024  # the prompt may have 32 KiB of text
HI = [{"role": "user", "content": "hi"}]
TOO_LONG = (
    "the model's chat template (chat_template in tokenizer_config.json) makes a text of over "
    "32,768 characters, more than the model's context (1024 tokens) holds at 32 bytes a token: "
    "shorten the messages, or fix the template."
)
TOO_SLOW = "did not finish rendering the prompt in -1 s (a loop without end?): fix the template."
DOUBLED = "{% set ns = namespace(s='x') %}{% for i in range(20) %}{% set ns.s = NEXT %}{% endfor %}"
# Loops, the loop variable, macros, filters, namespace, `~` and whitespace control, as Hub
# templates use them
RICH = (
    "{%- macro text(m) -%}{{ m.content if m.content is string else m.content|map(attribute='text')"
    "|join('') }}{%- endmacro -%}{% set ns = namespace(system=none) %}"
    "{%- for m in messages if m.role == 'system' %}{% set ns.system = text(m) %}{% endfor -%}"
    "{%- if tools %}<|system|>{{ ns.system ~ '\n' if ns.system }}# Tools\n"
    "{% for t in tools %}{{ loop.index }}. {{ t | tojson }}{{ '\n' if not loop.last }}{% endfor %}"
    "\n{% elif ns.system %}<|system|>{{ ns.system | trim }}\n{% endif -%}"
    "{%- for m in messages|rejectattr('role', 'equalto', 'system') %}<|{{ m.role }}|>"
    "{{- text(m) * 2 if m.role == 'tool' else text(m) -}}"
    "{%- for c in m.tool_calls or [] %}<tool_call>{{ c.function.name + ':' }}"
    "{{ c.function.arguments | tojson(sort_keys=true) }}</tool_call>{% endfor %}"
    "{{ '\n' }}{%- endfor -%}{{ '<|assistant|>' if add_generation_prompt }}{{ 2 ** 10 }}"
    "{{ '%-6s|%3d%%'|format('end', 7) ~ ('%(n)s' % {'n': 1}) ~ '{:>4}{}'.format('x', 17e8|int) }}"
)
CONVERSATION = [
    {"role": "system", "content": "  Be brief. "},
    {
        "role": "user",
        "content": [{"type": "text", "text": "Weather"}, {"type": "text", "text": "?"}],
    },
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
    },
    {"role": "tool", "content": "sunny"},
    {"role": "user", "content": "thanks"},
]


def smolvlm() -> str:
    """A template as published, read from the transformers installed (SmolVLM's)."""
    from transformers.models.smolvlm import processing_smolvlm

    return processing_smolvlm.DEFAULT_CHAT_TEMPLATE


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(Path(streamer.__file__).parent / "demo_model", False)


@pytest.fixture
def template(tokenizer, monkeypatch):
    """Sets the tokenizer's chat template for one test."""
    return lambda text: monkeypatch.setattr(tokenizer._tokenizer, "chat_template", text)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(CHAT_TEMPLATE, id="fixtures"),
        pytest.param(TEMPLATE, id="tool-calling"),
        pytest.param(RICH, id="rich"),
        pytest.param(None, id="smolvlm"),
    ],
)
@pytest.mark.parametrize("tools", [None, [WEATHER]])
def test_a_normal_template_renders_as_transformers_renders_it(tokenizer, template, text, tools):
    template(text or smolvlm())
    messages = CONVERSATION if text != CHAT_TEMPLATE else CONVERSATION[-1:]
    for tokenize in (False, True):
        asked = {"tools": tools, "add_generation_prompt": True, "tokenize": tokenize}
        plain = tokenizer.apply_chat_template(messages, **asked)
        assert render(tokenizer, CONTEXT, messages, **asked) == plain


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("{{ messages[0].content * 100000 }}", id="repeated"),
        pytest.param(
            "{% for i in range(999) %}{% for j in range(999) %}x{% endfor %}{% endfor %}",
            id="loops",
        ),
        pytest.param(DOUBLED.replace("NEXT", "ns.s ~ ns.s"), id="tilde"),
        pytest.param(DOUBLED.replace("NEXT", "ns.s + ns.s"), id="plus"),
        pytest.param(DOUBLED.replace("NEXT", "[ns.s, ns.s]|join"), id="join"),
        pytest.param(DOUBLED.replace("NEXT", "ns.s|replace('x', 'xx')"), id="filter"),
        pytest.param(DOUBLED.replace("NEXT", "ns.s.replace('x', 'xx')"), id="method"),
        # widths refused before the text is made (10 TB: MemoryError at best)
        pytest.param("{{ 'x'.center(10 ** 13)|length }}", id="center-method"),
        pytest.param("{{ 'x'.zfill(width=10 ** 13)|length }}", id="zfill-method"),
        pytest.param("{{ 'x'|center(10 ** 13)|length }}", id="center-filter"),
        pytest.param("{{ 'x'|indent(10 ** 13, true)|length }}", id="indent-filter"),
        pytest.param("{{ (['x' * 30000] * 3)|map('replace', 'x', 'xx')|list|length }}", id="map"),
        pytest.param("{{ [1]|batch(100000, 0)|list|length }}", id="batch"),
        pytest.param("{{ [1]|slice(100000)|list|length }}", id="slice"),
        pytest.param("{{ ('%0*d' % (10 ** 13, 1))|length }}", id="printf-star"),
        pytest.param("{{ ('%.10000000000000f' % 1)|length }}", id="printf-precision"),
        pytest.param("{{ '%010000000000000d'|format(1)|length }}", id="format-filter"),
        pytest.param("{{ '{:>10000000000000}'.format(1)|length }}", id="str-format"),
        pytest.param("{{ '{:>{}}'.format(1, 10 ** 13)|length }}", id="str-format-nested"),
        pytest.param("{{ '{:>{w}}'.format_map({'w': 10 ** 13})|length }}", id="format-map"),
        # made in Python, out of any check: it ran for hours (refused before it starts)
        pytest.param("{{ lipsum(10 ** 8) }}", id="lipsum"),
    ],
)
def test_a_template_making_more_text_than_the_context_holds_is_refused(tokenizer, template, text):
    template(text)
    with pytest.raises(TemplateBoundPassed) as refused:
        render(tokenizer, CONTEXT, HI, add_generation_prompt=True, tokenize=False)
    assert str(refused.value) == TOO_LONG


@pytest.mark.parametrize("text", ["{{ 7 ** 99999 }}", "{{ (2 ** 40000) * (2 ** 40000) }}"])
def test_a_template_computing_a_huge_integer_is_refused(tokenizer, template, text):
    """Computed as the template compiled (constant folding) or rendered, out of any check."""
    template(text)
    with pytest.raises(TemplateBoundPassed, match="computes an integer of over 65,536 bits"):
        render(tokenizer, CONTEXT, HI, add_generation_prompt=True, tokenize=False)


def test_a_template_too_long_to_compile_in_time_is_refused(tokenizer, template):
    """Compiling is out of the deadline's reach: 2 MB of template took 25 s, 20 MB minutes."""
    text = "{#" + "x" * (1 << 20) + "#}{{ messages[0].content }}"
    template(text)
    with pytest.raises(TemplateBoundPassed) as refused:
        render(tokenizer, CONTEXT, HI, add_generation_prompt=True, tokenize=False)
    assert str(refused.value) == (
        f"the model's chat template (chat_template in tokenizer_config.json) is {len(text):,} "
        "characters long, over the 1,048,576 a template may have: fix the template."
    )


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(
            "{% set r = range(3)|list %}{% set s %}{% for i in r %}{% for j in r %}{% endfor %}"
            "{% endfor %}{% endset %}",
            id="loop-over-a-list",
        ),
        pytest.param(
            "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}"
            "{{ f(3) }}",
            id="recursion",
        ),
    ],
)
def test_every_loop_step_and_call_checks_the_deadline(tokenizer, template, monkeypatch, text):
    """A deadline already past: the first step refuses (a long one refuses as late)."""
    template(text)
    monkeypatch.setattr(template_bounds, "RENDER_SECONDS", -1)
    with pytest.raises(TemplateBoundPassed) as refused:
        render(tokenizer, CONTEXT, HI, add_generation_prompt=True, tokenize=False)
    assert str(refused.value).endswith(TOO_SLOW)


def test_a_worker_thread_is_bounded_and_others_are_not(tokenizer, template, monkeypatch):
    """serve renders in its handler threads, where no signal reaches; the bounds are the
    rendering thread's alone, and transformers' own renders (outside streamer's) are as they
    were."""
    template("{% for m in messages %}{{ m.content * 50000 }}{% endfor %}")
    caught = []

    def worker():
        try:
            render(tokenizer, CONTEXT, HI, tokenize=False)
        except TemplateBoundPassed as e:
            caught.append(str(e))

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert caught == [TOO_LONG]
    assert tokenizer.apply_chat_template(HI, tokenize=False) == "hi" * 50000


def test_serve_refuses_the_request_with_a_400_and_renders_the_next(tokenizer, template):
    template(
        "{% for m in messages %}{{ m.content * 100000 if m.content == 'boom' else m.content }}"
        "{% endfor %}"
    )
    boom = Completion(True, "m", 2, Sampling(), messages=[{"role": "user", "content": "boom"}])
    with pytest.raises(ApiError) as refused:
        prompt_tokens(boom, tokenizer, CONTEXT)
    assert (refused.value.status, refused.value.param) == (400, "messages")
    assert refused.value.message == TOO_LONG
    fine = Completion(True, "m", 2, Sampling(), messages=HI)
    assert prompt_tokens(fine, tokenizer, CONTEXT) == tokenizer.encode("hi")


def served(checkpoints, tmp_path, template: str) -> Path:
    """The tiny qwen3_moe (a context of 2048 tokens) with this chat template."""
    folder = tmp_path / "model"
    shutil.copytree(checkpoints.repacked(checkpoints.hf("qwen3_moe")), folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def run(folder: Path, *command: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "streamer", *command, "--model", str(folder), "--max-tokens", "2"],
        input="hi\n",
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    "command", [["generate", "--prompt", "hi"], ["chat"], ["serve", "--port", "0"]]
)
def test_generate_chat_and_serve_refuse_the_template_in_one_line(checkpoints, tmp_path, command):
    """Each rendered until killed; serve and chat now refuse it as they start."""
    folder = served(checkpoints, tmp_path, "{{ messages[0].content * 100000 }}")
    result = run(folder, *command)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines()[-1] == "streamer: error: " + TOO_LONG.replace(
        "32,768", "65,536"
    ).replace("1024", "2048"), result.stderr


def test_what_a_template_raises_is_said_in_one_line(checkpoints, tmp_path, tokenizer, template):
    """raise_exception's message, of any length and lines, was printed whole by generate and
    sent whole in serve's 400 (and chat's line)."""
    raising = "{{ raise_exception('Roles must alternate.\\n' * 1000) }}"
    result = run(served(checkpoints, tmp_path, raising), "generate", "--prompt", "hi")
    assert result.returncode == 2, result.stderr
    last = result.stderr.splitlines()[-1]
    assert last.startswith("streamer: error: ") and "Roles must alternate. Roles" in last
    assert last.endswith(
        "...); fix chat_template in tokenizer_config.json (or "
        "chat_template.jinja), or pass --ignore-chat-template."
    )
    template(raising)
    with pytest.raises(ApiError) as refused:
        prompt_tokens(Completion(True, "m", 2, Sampling(), messages=HI), tokenizer, CONTEXT)
    assert refused.value.message.startswith(
        "the model's chat template refused these messages: Roles must alternate. Roles"
    )
    assert "\n" not in refused.value.message and len(refused.value.message) < 400


def test_chat_refuses_a_template_that_fails_its_first_turn(checkpoints, tmp_path):
    """Every turn was refused, each saying to send a shorter message; generate said to fix the
    template, as chat now does as it starts."""
    folder = served(checkpoints, tmp_path, "{{ foo.bar }}")
    for command in (["chat"], ["generate", "--prompt", "hi"]):
        result = run(folder, *command)
        assert result.returncode == 2, result.stderr
        assert result.stderr.splitlines()[-1] == (
            f"streamer: error: {folder}: the model's chat template fails (UndefinedError: 'foo' "
            "is undefined); fix chat_template in tokenizer_config.json (or chat_template.jinja), "
            "or pass --ignore-chat-template."
        ), result.stderr


def test_a_template_that_renders_nothing_is_refused(checkpoints, tmp_path):
    """An empty chat_template: generate said "the prompt is empty" of the prompt given, chat
    refused every turn ("the messages render to an empty prompt: send a shorter message")."""
    folder = served(checkpoints, tmp_path, "")
    for command, what in ((["chat"], "a message"), (["generate", "--prompt", "hi"], "the prompt")):
        result = run(folder, *command)
        assert result.returncode == 2, result.stderr
        assert result.stderr.splitlines()[-1] == (
            f"streamer: error: {folder}: the model's chat template fails (it renders {what} as "
            "nothing); fix chat_template in tokenizer_config.json (or chat_template.jinja), or "
            "pass --ignore-chat-template."
        ), result.stderr
