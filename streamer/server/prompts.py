"""A validated request -> the prompt's token ids, with the chat template as mlx-lm's server applies
it (tools passed to the template; no template: mlx-lm's plain role prefixes)."""

from __future__ import annotations

import copy
import json

from mlx_lm.server import convert_chat, process_message_content
from mlx_lm.tokenizer_utils import TokenizerWrapper

from ..arguments import tokens_text, vocabulary
from ..errors import one_line
from .api import Completion
from .fields import ApiError, check_ids_below
from .template_bounds import render
from .template_checks import MAX_BYTES_PER_TOKEN, TemplateBoundPassed


def prompt_size(request: Completion, context: int | None) -> int:
    """The bytes of text of the prompt (0 for token ids); ApiError 400 when its model's context
    cannot hold that much."""
    if request.text is None and not request.chat:  # token ids: counted against the context
        return 0
    if request.chat:  # the text of everything the template renders, as JSON (about its size)
        rendered = [request.messages, request.tools, request.template_kwargs]
        text = json.dumps(rendered, ensure_ascii=False)
    else:
        text = request.text
    size = len(text.encode())
    if context is not None and size > (most := context * MAX_BYTES_PER_TOKEN):
        raise ApiError(
            400,
            f"the prompt is {size:,} bytes of text, over the {most:,} the model's context of "
            f"{tokens_text(context)} can hold (at {MAX_BYTES_PER_TOKEN} bytes a token at most): "
            "shorten it",
            param=request.prompt_field,
            code="context_length_exceeded",
        )
    return size


def prompt_tokens(
    request: Completion, tokenizer: TokenizerWrapper, context: int | None = None
) -> list[int]:
    """The prompt's token ids; `context`: the model's, which bounds the rendered template's text
    (template_bounds.py)."""
    if not request.chat:
        if request.text is None:
            check_ids_below(request.prompt, "prompt", vocabulary(tokenizer))
            return request.prompt
        bos = tokenizer.bos_token
        special = not (bos and request.text.startswith(bos))  # no second BOS, as mlx-lm does
        return tokenizer.encode(request.text, add_special_tokens=special)
    messages = copy.deepcopy(request.messages)
    process_message_content(messages)  # text parts joined; tool-call arguments parsed to objects
    _developer_as_system(messages, tokenizer)
    if not tokenizer.has_chat_template:
        if request.tools:
            raise _tools_left_out()
        return tokenizer.encode(convert_chat(messages))
    variables = request.template_kwargs
    tokens = _render(tokenizer, context, messages, request.tools, variables)
    if not tokens:
        raise ApiError(400, "the messages render to an empty prompt", param="messages")
    if request.tools and not _renders_tools(tokenizer, context, request):
        if tokens == _render(tokenizer, context, messages, None, variables):
            raise _tools_left_out()
    return list(tokens)


def _renders_tools(tokenizer: TokenizerWrapper, context: int | None, request: Completion) -> bool:
    """Whether the template renders the request's tools for one short user message: where it
    does, the conversation is not rendered a second time without them to find out (a long
    chat's prompt was tokenized twice); False where it renders none, or refuses that message."""
    probe, variables = [{"role": "user", "content": "hi"}], request.template_kwargs
    try:
        with_tools = _render(tokenizer, context, probe, request.tools, variables)
        return with_tools != _render(tokenizer, context, probe, None, variables)
    except ApiError:
        return False


def _render(
    tokenizer: TokenizerWrapper,
    context: int | None,
    messages: list[dict],
    tools: list | None,
    variables: dict,
) -> list[int]:
    try:
        return render(
            tokenizer, context, messages, tools=tools, add_generation_prompt=True, **variables
        )
    except TemplateBoundPassed as e:
        raise ApiError(400, str(e), param="messages") from None
    except Exception as e:  # jinja raises its own errors for messages a template refuses
        raise ApiError(  # one line: a template's raise_exception may say anything, at any length
            400,
            f"the model's chat template refused these messages: {one_line(e)}",
            param="messages",
        ) from None


def _tools_left_out() -> ApiError:
    """Tools the prompt leaves out: the model would answer as if it had none, so the request is
    refused (as Ollama refuses tools for such a model)."""
    return ApiError(
        400,
        "the model's chat template does not render tools, so the model cannot call them: send "
        "the request without tools (or with tool_choice: none), or serve a model whose template "
        "takes tools",
        param="tools",
    )


def _developer_as_system(messages: list[dict], tokenizer: TokenizerWrapper) -> None:
    """OpenAI's `developer` role is its newer name for `system`: a Jinja template that does not
    name it gets a system message (Qwen's templates dropped the message, mlx-lm's plain prefixes
    left it unlabelled). A template that names it (gpt-oss's) or a renderer of mlx-lm's own
    (DeepSeek-V3.2's, which has no template text) gets it as it is."""
    template = tokenizer.chat_template if tokenizer.has_chat_template else ""
    if not isinstance(template, str) or "developer" in template:
        return
    for message in messages:
        if message["role"] == "developer":
            message["role"] = "system"
