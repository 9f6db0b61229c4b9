"""The chat fields of a request, checked in OpenAI's shapes: messages (roles, text content parts,
tool calls and their results), tools, tool_choice, and the variables passed to the chat template.

What passes here reaches mlx-lm's `process_message_content` and the template as they expect it.
"""

from __future__ import annotations

import json
from typing import Any

from .fields import MAX_DEPTH, ApiError, depth

ROLES = ("system", "developer", "user", "assistant", "tool")
# apply_chat_template's own parameters: chat_template_kwargs holds the template's variables
# (enable_thinking, ...), not these, which would change what the call returns or double an argument
TEMPLATE_ARGUMENTS = frozenset(
    (
        "conversation",
        "messages",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "tokenize",
        "sanitize_control_tokens",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    )
)


def check_messages(messages: list) -> None:
    if not messages:
        raise ApiError(400, "messages must not be empty", param="messages")
    for i, message in enumerate(messages):
        _check_message(message, f"messages[{i}]")


def _check_message(message: Any, where: str) -> None:
    if not isinstance(message, dict):
        raise ApiError(400, f"{where} must be an object", param=where)
    if message.get("role") not in ROLES:
        raise ApiError(
            400, f"{where}.role must be one of {', '.join(ROLES)}", param=f"{where}.role"
        )
    _check_content(message, where)
    for key in ("name", "tool_call_id"):
        if message.get(key) is not None and not isinstance(message[key], str):
            raise ApiError(400, f"{where}.{key} must be a string", param=f"{where}.{key}")
    calls = message.get("tool_calls")
    if calls is not None and not isinstance(calls, list):
        raise ApiError(400, f"{where}.tool_calls must be an array", param=f"{where}.tool_calls")
    for j, call in enumerate(calls or ()):
        _check_tool_call(call, f"{where}.tool_calls[{j}]")


def _check_content(message: dict, where: str) -> None:
    """content: a string or text parts; required as OpenAI requires it (an assistant's message
    may have tool_calls instead)."""
    param = f"{where}.content"
    content = message.get("content")
    if content is None:
        if message["role"] != "assistant" or not message.get("tool_calls"):
            also = " (or tool_calls)" if message["role"] == "assistant" else ""
            raise ApiError(400, f"{param}{also} is required", param=param)
    elif isinstance(content, list):
        for k, part in enumerate(content):
            if not (
                isinstance(part, dict)
                and part.get("type") == "text"
                and isinstance(part.get("text"), str)
            ):
                raise ApiError(
                    400,
                    f"{param}[{k}]: only text parts ({{type: text, text: ...}}) are supported",
                    param=f"{param}[{k}]",
                )
    elif not isinstance(content, str):
        raise ApiError(400, f"{param} must be a string or a list of text parts", param=param)


def _check_tool_call(call: Any, where: str) -> None:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ApiError(
            400, f"{where} must be {{type: function, function: {{name, arguments}}}}", param=where
        )
    param = f"{where}.function.arguments"
    arguments = function.get("arguments")
    if isinstance(arguments, str) and arguments:  # "": none, as mlx-lm reads it (not JSON)
        try:  # parsed for the template, which renders it recursively: bounded as the body is
            deep = depth(json.loads(arguments)) > MAX_DEPTH
        except ValueError:
            raise ApiError(400, f"{param} is not JSON", param=param) from None
        except RecursionError:  # json.loads gives up about 1000 deep
            deep = True
        if deep:
            message = f"{param} nests arrays or objects over {MAX_DEPTH} deep"
            raise ApiError(400, message, param=param)
    elif arguments not in (None, "") and not isinstance(arguments, dict):
        raise ApiError(400, f"{param} must be a JSON string or object", param=param)


def check_tools(tools: list | None, choice: Any) -> list[dict] | None:
    """The tools to render into the prompt (None: none, or tool_choice "none")."""
    for i, tool in enumerate(tools or ()):
        function = tool.get("function") if isinstance(tool, dict) else None
        if (
            not isinstance(function, dict)
            or not isinstance(function.get("name"), str)
            or tool.get("type", "function") != "function"
            or not isinstance(function.get("parameters", {}), dict)
            or not isinstance(function.get("description", ""), str)
        ):
            raise ApiError(
                400,
                f"tools[{i}] must be {{type: function, function: {{name, description, "
                "parameters: {...}}}",
                param=f"tools[{i}]",
            )
    if choice not in (None, "auto", "none"):
        raise ApiError(
            400,
            "tool_choice must be 'auto' or 'none': the model decides whether to call a tool",
            param="tool_choice",
        )
    return tools if tools and choice != "none" else None


def check_template_kwargs(kwargs: dict | None) -> dict:
    clash = sorted(TEMPLATE_ARGUMENTS.intersection(kwargs or {}))
    if clash:
        raise ApiError(
            400,
            f"chat_template_kwargs: {', '.join(clash)} is set by the server, not by a request "
            "(chat_template_kwargs holds the template's own variables, such as enable_thinking)",
            param="chat_template_kwargs",
        )
    return kwargs or {}
