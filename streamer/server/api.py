"""OpenAI request bodies -> a validated `Completion`; every bad value is an `ApiError` (4xx).

Fields follow OpenAI's API reference; the extra sampling fields mlx-lm's server accepts (top_k,
min_p, repetition_penalty) are accepted too. Unknown fields are ignored, as OpenAI's clients send
some (`user`, `metadata`) that change nothing here. The server serves one model: a request's
`model` may be missing or any string (clients send "default" or a placeholder, as mlx-lm's server
and llama-server accept), and the answer names the served model.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..arguments import MAX_DRAFT_TOKENS, MAX_SEED, MIN_TEMPERATURE
from .fields import ApiError, checked, is_int
from .messages import check_messages, check_template_kwargs, check_tools

# OpenAI takes up to 4 stop strings; more are allowed here, but bounded: every new piece of text
# is checked against each stop's prefixes to hold back a partial match
MAX_STOPS, MAX_STOP_CHARS = 16, 1000
# OpenAI's seed is a signed 64-bit integer; llama.cpp's server and clients read -1 as "random"
MIN_SEED, RANDOM_SEED = -(1 << 63), -1


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
    model: str  # the served model's name, whatever the request's `model` said
    max_tokens: int | None
    sampling: Sampling
    stream: bool = False
    include_usage: bool = False
    stop: list[str] = field(default_factory=list)
    logprobs: bool = False
    top_logprobs: int = 0
    messages: list[dict] = field(default_factory=list)
    tools: list[dict] | None = None
    parallel_tool_calls: bool = True  # false: the answer ends at its first tool call
    template_kwargs: dict = field(default_factory=dict)
    text: str | None = None  # /v1/completions: the prompt as text...
    prompt: list[int] = field(default_factory=list)  # ...or as token ids
    max_tokens_field: str = "max_tokens"  # the field the request set it with, named in errors
    num_draft_tokens: int | None = None  # drafts per pass, where the server drafts (0: none)

    @property
    def prompt_field(self) -> str:
        """The field that holds the prompt at this endpoint, named in errors about it."""
        return "messages" if self.chat else "prompt"


def parse_completion(body: dict, *, chat: bool, model: str, defaults: Sampling) -> Completion:
    """`body` checked; the answer is `model`'s (the served model), whatever body["model"] says."""
    checked(body, "model", str)  # optional, any name: but a string where it is given
    max_tokens = checked(body, "max_completion_tokens", int, low=1)
    max_tokens_field = "max_completion_tokens"
    if max_tokens is None:
        max_tokens = checked(body, "max_tokens", int, low=1)
        max_tokens_field = "max_tokens"
    if checked(body, "n", int, low=1) not in (None, 1):
        raise ApiError(400, "n must be 1: one sequence is computed at a time", param="n")
    request = Completion(
        chat=chat,
        model=model,
        max_tokens=max_tokens,
        sampling=_sampling(body, defaults),
        stop=_stop(body),
        max_tokens_field=max_tokens_field,
    )
    request.stream = bool(checked(body, "stream", bool))
    request.num_draft_tokens = checked(body, "num_draft_tokens", int, low=0, high=MAX_DRAFT_TOKENS)
    options = checked(body, "stream_options", dict)
    if options is not None:
        if not request.stream:
            raise ApiError(
                400, "stream_options is only allowed with stream: true", param="stream_options"
            )
        usage = checked(options, "include_usage", bool, where="stream_options")
        request.include_usage = bool(usage)
    if chat:
        _chat_fields(body, request)
    else:
        _text_fields(body, request)
    return request


def _chat_fields(body: dict, request: Completion) -> None:
    request.messages = checked(body, "messages", list, required=True)
    check_messages(request.messages)
    request.logprobs = bool(checked(body, "logprobs", bool))
    top = checked(body, "top_logprobs", int, low=0, high=20)
    if top and not request.logprobs:
        raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    request.top_logprobs = top or 0
    request.tools = check_tools(checked(body, "tools", list), body.get("tool_choice"))
    request.parallel_tool_calls = checked(body, "parallel_tool_calls", bool) is not False
    response_format = checked(body, "response_format", dict)
    if response_format is not None and response_format.get("type") != "text":
        raise ApiError(
            400, "response_format other than text is not supported", param="response_format"
        )
    request.template_kwargs = check_template_kwargs(checked(body, "chat_template_kwargs", dict))


def _text_fields(body: dict, request: Completion) -> None:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # one prompt in a list
    if isinstance(prompt, str) and prompt:
        request.text = prompt
    elif isinstance(prompt, list) and prompt and all(is_int(t) and t >= 0 for t in prompt):
        request.prompt = list(prompt)
    else:
        raise ApiError(
            400,
            "prompt must be a non-empty string or list of token ids (one prompt)",
            param="prompt",
        )
    top = checked(body, "logprobs", int, low=0, high=20)
    request.logprobs, request.top_logprobs = top is not None, top or 0
    for name, unsupported in (
        ("echo", checked(body, "echo", bool)),
        ("suffix", checked(body, "suffix", str)),
        ("best_of", (checked(body, "best_of", int, low=1) or 1) > 1),
    ):
        if unsupported:
            raise ApiError(400, "echo, suffix and best_of > 1 are not supported", param=name)


def _sampling(body: dict, defaults: Sampling) -> Sampling:
    """The request's sampling fields; those it leaves out come from the server's flags."""
    sampling = replace(defaults)
    for name, kind, bounds in (
        ("temperature", float, {"low": 0.0}),  # as serve's --temp: arguments.check_sampling
        ("top_p", float, {"low": 0.0, "high": 1.0, "low_open": True}),
        ("top_k", int, {"low": 0}),
        ("min_p", float, {"low": 0.0, "high": 1.0}),
    ):
        value = checked(body, name, kind, **bounds)
        if value is not None:
            setattr(sampling, name, value)
    seed = checked(body, "seed", int, low=MIN_SEED, high=MAX_SEED)
    if seed is not None:
        sampling.seed = _seed(seed)
    if 0 < sampling.temperature < MIN_TEMPERATURE:
        raise ApiError(
            400,
            f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE}: below that the "
            "scaled log-probabilities overflow float32",
            param="temperature",
        )
    sampling.presence_penalty = checked(body, "presence_penalty", float, low=-2.0, high=2.0)
    sampling.frequency_penalty = checked(body, "frequency_penalty", float, low=-2.0, high=2.0)
    # 0 is off, as mlx-lm's server reads it (its default); else from 0.01 to 100
    penalty = checked(body, "repetition_penalty", float, low=0.0, high=100.0)
    if penalty is not None and 0 < penalty < 0.01:
        raise ApiError(
            400,
            f"repetition_penalty must be 0 (off) or lie in [0.01, 100.0] (got {penalty})",
            param="repetition_penalty",
        )
    sampling.repetition_penalty = penalty or None
    bias = checked(body, "logit_bias", dict)
    if bias:
        sampling.logit_bias = _logit_bias(bias)
    return sampling


def _seed(seed: int) -> int | None:
    """-1: None (random, the server's --seed overridden); another negative: its 64 bits read
    unsigned, as mx.random.seed takes them, so that the same seed samples the same tokens."""
    if seed == RANDOM_SEED:
        return None
    return seed % (MAX_SEED + 1)


def _logit_bias(bias: dict) -> dict[int, float]:
    """Token id (a decimal string key) -> a bias in [-100, 100]; ids past the model's vocabulary
    are refused against the tokenizer's (sampling.check_logit_bias)."""
    if not all(k.isdecimal() and len(k) < 10 for k in bias) or not all(
        (is_int(v) or isinstance(v, float)) and -100 <= v <= 100 for v in bias.values()
    ):
        raise ApiError(
            400,
            "logit_bias maps token ids (as strings) to numbers in [-100, 100]",
            param="logit_bias",
        )
    return {int(k): float(v) for k, v in bias.items()}


def _stop(body: dict) -> list[str]:
    stop = body.get("stop")
    if stop is None or stop == "":  # "": none, as mlx-lm's server reads it
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if (
        not isinstance(stops, list)
        or len(stops) > MAX_STOPS
        or not all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in stops)
    ):
        raise ApiError(
            400,
            f"stop must be a string or a list of at most {MAX_STOPS}, each of 1 to "
            f"{MAX_STOP_CHARS} characters",
            param="stop",
        )
    return stops
