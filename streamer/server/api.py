"""OpenAI request bodies -> a validated `Completion`; every bad value is an `ApiError` (4xx).

Fields follow OpenAI's API reference; the extra sampling fields mlx-lm's server accepts (top_k,
min_p, repetition_penalty) are accepted too. Unknown fields are ignored, as OpenAI's clients send
some (`user`, `metadata`) that change nothing here.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Any

MAX_BODY_BYTES = 32 << 20
ROLES = ("system", "developer", "user", "assistant", "tool")


class ApiError(Exception):
    """An error answered as OpenAI does: `{"error": {message, type, param, code}}`."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code=None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {
            "error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}
        }


@dataclass
class Sampling:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    logit_bias: dict[int, float] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None


@dataclass
class Completion:
    """One validated request. `prompt` holds token ids once the request is tokenized."""

    chat: bool
    model: str
    max_tokens: int | None
    sampling: Sampling
    stream: bool = False
    include_usage: bool = False
    stop: list[str] = field(default_factory=list)
    logprobs: bool = False
    top_logprobs: int = 0
    messages: list[dict] = field(default_factory=list)
    tools: list[dict] | None = None
    template_kwargs: dict = field(default_factory=dict)
    text: str | None = None  # /v1/completions: the prompt as text...
    prompt: list[int] = field(default_factory=list)  # ...or as token ids


def parse_body(raw: bytes) -> dict:
    try:
        body = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except UnicodeDecodeError:
        raise ApiError(400, "the request body is not UTF-8 text") from None
    except ValueError as e:
        raise ApiError(400, f"the request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def parse_completion(body: dict, *, chat: bool, models: set[str], defaults: Sampling) -> Completion:
    model = _get(body, "model", str, required=True)
    if model not in models:
        raise ApiError(
            404,
            f"model {model!r} is not served here: this server serves {sorted(models)[0]!r} "
            "(see /v1/models)",
            param="model",
            code="model_not_found",
        )
    max_tokens = _get(body, "max_completion_tokens", int, low=1)
    if max_tokens is None:
        max_tokens = _get(body, "max_tokens", int, low=1)
    if _get(body, "n", int, low=1) not in (None, 1):
        raise ApiError(400, "n must be 1: one sequence is computed at a time", param="n")
    request = Completion(
        chat=chat,
        model=model,
        max_tokens=max_tokens,
        sampling=_sampling(body, defaults),
        stop=_stop(body),
    )
    request.stream = bool(_get(body, "stream", bool))
    options = _get(body, "stream_options", dict)
    if options is not None:
        if not request.stream:
            raise ApiError(400, "stream_options is only allowed with stream: true", param="stream")
        request.include_usage = bool(_get(options, "include_usage", bool, where="stream_options"))
    if chat:
        _chat_fields(body, request)
    else:
        _text_fields(body, request)
    return request


def _chat_fields(body: dict, request: Completion) -> None:
    messages = _get(body, "messages", list, required=True)
    if not messages:
        raise ApiError(400, "messages must not be empty", param="messages")
    for i, message in enumerate(messages):
        _check_message(message, f"messages[{i}]")
    request.messages = messages
    request.logprobs = bool(_get(body, "logprobs", bool))
    top = _get(body, "top_logprobs", int, low=0, high=20)
    if top and not request.logprobs:
        raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    request.top_logprobs = top or 0
    tools = _get(body, "tools", list)
    for i, tool in enumerate(tools or ()):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ApiError(
                400,
                f"tools[{i}] must be {{type: function, function: {{name, ...}}}}",
                param="tools",
            )
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise ApiError(
            400,
            "tool_choice must be 'auto' or 'none': the model decides whether to call a tool",
            param="tool_choice",
        )
    request.tools = tools if tools and choice != "none" else None
    response_format = _get(body, "response_format", dict)
    if response_format is not None and response_format.get("type") != "text":
        raise ApiError(
            400, "response_format other than text is not supported", param="response_format"
        )
    request.template_kwargs = _get(body, "chat_template_kwargs", dict) or {}


def _check_message(message: Any, where: str) -> None:
    if not isinstance(message, dict):
        raise ApiError(400, f"{where} must be an object", param="messages")
    if message.get("role") not in ROLES:
        raise ApiError(
            400, f"{where}.role must be one of {', '.join(ROLES)}", param=f"{where}.role"
        )
    content = message.get("content")
    if isinstance(content, list):
        for part in content:
            if not (
                isinstance(part, dict)
                and part.get("type") == "text"
                and isinstance(part.get("text"), str)
            ):
                raise ApiError(
                    400, f"{where}.content: only text parts are supported", param="messages"
                )
    elif content is not None and not isinstance(content, str):
        raise ApiError(
            400, f"{where}.content must be a string or a list of text parts", param="messages"
        )
    for call in message.get("tool_calls") or ():
        arguments = call.get("function", {}).get("arguments") if isinstance(call, dict) else None
        if isinstance(arguments, str):
            try:
                json.loads(arguments)
            except ValueError:
                raise ApiError(
                    400, f"{where}.tool_calls: arguments are not JSON", param="messages"
                ) from None


def _text_fields(body: dict, request: Completion) -> None:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # one prompt in a list
    if isinstance(prompt, str) and prompt:
        request.text = prompt
    elif isinstance(prompt, list) and prompt and all(_is_int(t) and t >= 0 for t in prompt):
        request.prompt = list(prompt)
    else:
        raise ApiError(
            400,
            "prompt must be a non-empty string or list of token ids (one prompt)",
            param="prompt",
        )
    top = _get(body, "logprobs", int, low=0, high=20)
    request.logprobs, request.top_logprobs = top is not None, top or 0


def _sampling(body: dict, defaults: Sampling) -> Sampling:
    """The request's sampling fields; those it leaves out come from the server's flags."""
    sampling = replace(defaults)
    for name, kind, bounds in (
        ("temperature", float, {"low": 0.0, "high": 100.0}),
        ("top_p", float, {"low": 0.0, "high": 1.0, "low_open": True}),
        ("top_k", int, {"low": 0}),
        ("min_p", float, {"low": 0.0, "high": 1.0}),
        ("seed", int, {}),
    ):
        value = _get(body, name, kind, **bounds)
        if value is not None:
            setattr(sampling, name, value)
    sampling.presence_penalty = _get(body, "presence_penalty", float, low=-2.0, high=2.0)
    sampling.frequency_penalty = _get(body, "frequency_penalty", float, low=-2.0, high=2.0)
    sampling.repetition_penalty = _get(body, "repetition_penalty", float, low=0.0, low_open=True)
    bias = _get(body, "logit_bias", dict)
    if bias:
        try:
            sampling.logit_bias = {int(k): float(v) for k, v in bias.items()}
        except (TypeError, ValueError):
            raise ApiError(
                400, "logit_bias maps token ids to numbers", param="logit_bias"
            ) from None
        if any(not -100 <= v <= 100 or k < 0 for k, v in sampling.logit_bias.items()):
            raise ApiError(
                400, "logit_bias values lie in [-100, 100], keys are token ids", param="logit_bias"
            )
    return sampling


def _stop(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise ApiError(400, "stop must be a non-empty string or a list of them", param="stop")
    return stops


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _get(
    body: dict,
    name: str,
    kind: type,
    *,
    required: bool = False,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    where: str | None = None,
):
    """body[name] checked for type and range; None when absent (or JSON null)."""
    param = f"{where}.{name}" if where else name
    value = body.get(name)
    if value is None:
        if required:
            raise ApiError(400, f"{param} is required", param=param)
        return None
    ok = {
        int: _is_int(value),
        float: (_is_int(value) or isinstance(value, float)) and math.isfinite(value),
        bool: isinstance(value, bool),
    }.get(kind, isinstance(value, kind))
    if not ok:
        names = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
        what = names.get(kind, "an array" if kind is list else "an object")
        raise ApiError(400, f"{param} must be {what}", param=param)
    too_low = low is not None and (value <= low if low_open else value < low)
    if too_low or (high is not None and value > high):
        bounds = f"{'(' if low_open else '['}{low}, {high if high is not None else 'inf'}]"
        raise ApiError(400, f"{param} must lie in {bounds} (got {value})", param=param)
    return float(value) if kind is float else value
