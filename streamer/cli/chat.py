"""`streamer chat`: a conversation in the terminal, one answer per line typed.

Each turn renders the whole conversation (with the chat template when the tokenizer has one) and
goes through the server's engine, whose prompt cache keeps the conversation's KV cache: a turn
computes only the tokens after what is cached. Answers go to stdout, everything else to stderr.
"""

from __future__ import annotations

import sys
from queue import Empty
from typing import TextIO

from ..defaults import MAX_TOKENS
from ..errors import StreamerError, one_line
from ..server.api import Completion, Sampling
from ..server.engine import Engine
from ..server.fields import ApiError
from ..server.jobs import Done, Job, Step, fit
from ..server.prompts import prompt_tokens
from ..server.template_bounds import render
from ..server.template_checks import TemplateBoundPassed
from .interrupts import Terminated, end_interrupted
from .output import OutputFailed, emit
from .repl import HELP, Reader, command, not_text

STOPS_WITHIN = 10  # seconds a stopped answer's engine thread is waited for, then the chat ends


def templated(
    tokenizer,
    prompt: str,
    system_prompt: str | None = None,
    variables: dict | None = None,
    context: int | None = None,
) -> str:
    """`prompt` as the user's message in the chat template (with a system message first), the
    template given its `variables` (--chat-template-config) and bounded by the model's `context`
    (server/template_bounds.py)."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": prompt})
    return render(
        tokenizer,
        context,
        messages,
        add_generation_prompt=True,
        tokenize=False,
        **(variables or {}),
    )


def check_system_message(tokenizer, system_prompt: str | None) -> None:
    """Refuse a --system-prompt the chat template refuses where it takes the message alone (as
    Gemma 2's: "System role not supported"): every chat turn was refused, /reset keeping it, and
    generate said to fix the template."""
    if not system_prompt or _fails(tokenizer):
        return  # it fails without one too: told where the template is used
    if error := _fails(tokenizer, system_prompt):
        raise StreamerError(
            "--system-prompt: the model's chat template refuses a system message "
            f"({type(error).__name__}: {one_line(error)}): leave --system-prompt out."
        )


def check_template_variables(tokenizer, variables: dict | None, option: str) -> None:
    """Refuse template variables (`option`'s) the chat template fails with, naming those it
    fails with alone (one named as a function it calls, as Qwen3's calls namespace): chat refused
    each turn, saying to send a shorter message, generate said to fix the template, and serve
    refused every request."""
    if not variables or _fails(tokenizer) or not (error := _fails(tokenizer, None, variables)):
        return
    names = [k for k in variables if _fails(tokenizer, None, {k: variables[k]})] or list(variables)
    raise StreamerError(
        f"{option}: the model's chat template fails given {', '.join(names)} "
        f"({type(error).__name__}: {one_line(error)}): leave {'it' if len(names) == 1 else 'them'} "
        "out."
    )


def check_template_bounds(tokenizer, context: int | None) -> None:
    """Refuse a chat template that passes its bounds (server/template_bounds.py) rendering one short
    message, as one that loops without end: serve took RENDER_SECONDS over every request before
    refusing it (its tokenizer held meanwhile)."""
    _fails(tokenizer, context=context)


def check_template(tokenizer, context: int | None, model: str) -> None:
    """Refuse a chat template that fails rendering one short message (chat's first turn): past
    its bounds (chat took RENDER_SECONDS over every turn before refusing it), raising or making
    nothing of it (every turn was refused, with "send a shorter message")."""
    if error := _fails(tokenizer, context=context):
        raise template_fails(model, error)
    if not templated(tokenizer, "hi", context=context):
        raise template_fails(model, "it renders a message as nothing")


def template_fails(model: str, why: Exception | str) -> StreamerError:
    """generate's and chat's refusal of a template that fails: what it raises (jinja2's errors,
    or its own), or `why` in words."""
    if isinstance(why, Exception):
        why = f"{type(why).__name__}: {one_line(why)}"
    return StreamerError(
        f"{model}: the model's chat template fails ({why}); fix chat_template in "
        "tokenizer_config.json (or chat_template.jinja), or pass --ignore-chat-template."
    )


def _fails(
    tokenizer,
    system_prompt: str | None = None,
    variables: dict | None = None,
    context: int | None = None,
):
    """The exception the chat template raises for a message (after `system_prompt`, given
    `variables`), or None; TemplateBoundPassed raised, as the template's fault whatever the
    message."""
    try:
        templated(tokenizer, "hi", system_prompt, variables, context)
    except TemplateBoundPassed:
        raise
    except Exception as e:  # jinja2's errors, or whatever the template raises
        return e
    return None


class Conversation:
    def __init__(self, system_prompt: str | None, template: bool, variables: dict | None = None):
        self.system_prompt, self.template = system_prompt, template
        self.variables = variables or {}  # the template's (--chat-template-config)
        self.reset()

    def reset(self) -> None:
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        self.messages: list[dict] = system

    def request(self, model: str, sampling: Sampling) -> Completion:
        if self.template:
            return Completion(
                True, model, None, sampling, messages=self.messages, template_kwargs=self.variables
            )
        # no template: the conversation as one running text, each turn continuing it
        text = "".join(
            m["content"] + ("\n" if m["role"] != "assistant" else "") for m in self.messages
        )
        return Completion(False, model, None, sampling, text=text)


def chat(
    engine: Engine,
    *,
    system_prompt: str | None = None,
    template: bool = True,
    template_variables: dict | None = None,
    max_tokens: int = MAX_TOKENS,
    context: int | None = None,
    sampling: Sampling | None = None,
    stdin: TextIO = sys.stdin,
    stdout: TextIO = sys.stdout,
    stderr: TextIO = sys.stderr,
) -> None:
    conversation = Conversation(system_prompt, template, template_variables)
    sampling = sampling or Sampling()
    last: Done | None = None
    reader = Reader(stdin, stderr)
    print(f"[chat] {HELP}", file=stderr)
    try:
        while (text := reader.message()) is not None:
            name, text = command(text)
            if name == "/quit":
                break
            if name == "/reset":
                conversation.reset()
                engine.forget()  # the old conversation's KV cache is of no more use
                print("[chat] the conversation starts over", file=stderr)
            elif name == "/stats":
                print(_stats(last), file=stderr)
            elif name == "/help":
                print(f"[chat] {HELP}", file=stderr)
            elif name == "?":
                print(f"[chat] unknown command {text.split()[0]} (not sent): {HELP}", file=stderr)
            elif (why := not_text(text)) is not None:
                print(f"[chat] {why}", file=stderr)
            elif text.strip():
                asked = (sampling, max_tokens, context)
                last = _turn(engine, conversation, text, asked, stdout, stderr) or last
    finally:
        reader.close()


def _turn(
    engine: Engine,
    conversation: Conversation,
    text: str,
    asked: tuple[Sampling, int, int | None],
    stdout: TextIO,
    stderr: TextIO,
) -> Done | None:
    """One message and its answer, both kept in the conversation; `asked`: the sampling, the
    tokens per answer and the model's context."""
    sampling, max_tokens, context = asked
    conversation.messages.append({"role": "user", "content": text})
    request = conversation.request("chat", sampling)
    try:
        with engine.tokenizer_lock:
            prompt = prompt_tokens(request, engine.tokenizer, context)
        job = Job(request, prompt, fit(len(prompt), None, max_tokens, context))
    except ApiError as e:
        conversation.messages.pop()
        earlier = any(m["role"] == "user" for m in conversation.messages)
        way_on = "/reset to start over" if earlier else "send a shorter message"  # /reset: no use
        print(f"[chat] {e.message}: {way_on}", file=stderr)
        return None
    answer, done = _answer(engine.submit(job), stdout, stderr)
    conversation.messages.append({"role": "assistant", "content": answer})
    return done


def _stats(done: Done | None) -> str:
    """The last answer's figures, and how much of its prompt the kept conversation spared."""
    if done is None or done.stats is None:
        return "[chat] no answer yet"
    return (
        f"{done.stats.line()}\n[chat] {done.cached_tokens} of the prompt's {done.prompt_tokens} "
        "tokens came from the conversation's KV cache"
    )


def _answer(job: Job, stdout: TextIO, stderr: TextIO) -> tuple[str, Done | None]:
    """Print the answer as it comes; Ctrl-C stops it (what was printed stays in the history)."""
    parts: list[str] = []
    try:
        while not isinstance(event := job.events.get(), Done):
            if isinstance(event, ApiError):
                print(f"\n[chat] {event.message}", file=stderr)
                return "".join(parts), None
            if isinstance(event, Step):  # a call the model writes is text: chat gives no tools
                parts.append(event.piece.content)
                emit(event.piece.content, end="", file=stdout)
    except (KeyboardInterrupt, OutputFailed) as stop:
        # the answer stops here: the engine's thread must not be computing it as the process ends
        job.cancelled.set()
        try:
            while not isinstance(event := job.events.get(timeout=STOPS_WITHIN), (Done, ApiError)):
                pass
        except Empty:  # the engine's thread never came back (a group's peer gone mid-step)
            if isinstance(stop, KeyboardInterrupt):
                end_interrupted(stop)  # its line and status, not Python's shutdown under MLX
            raise stop from None
        if isinstance(stop, (OutputFailed, Terminated)):  # SIGTERM, SIGHUP: the chat ends too
            raise
        print("\n[chat] interrupted", file=stderr)
        return "".join(parts), event if isinstance(event, Done) else None
    emit(file=stdout)
    return "".join(parts), event
