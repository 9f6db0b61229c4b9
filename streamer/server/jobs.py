"""What a request is to the engine (engine.py): a `Job`, the tokens it may generate (`fit`), and the
events its handler reads."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from queue import Queue

from ..arguments import tokens_text
from ..run_stats import RunStats
from .api import Completion
from .fields import ApiError
from .logprobs import Token
from .output import Piece


@dataclass
class Step:
    piece: Piece
    tokens: list[Token] = field(default_factory=list)


@dataclass
class Done:
    finish_reason: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    stats: RunStats | None  # streamer's figures for the request


class Job:
    def __init__(
        self, request: Completion, prompt: list[int], max_tokens: int, forget: bool = False
    ):
        """`forget`: no answer, the kept KV caches in memory are dropped (chat's /reset)."""
        self.request, self.prompt, self.max_tokens = request, prompt, max_tokens
        self.forget = forget
        self.events: Queue = Queue()
        self.cancelled = threading.Event()


def fit(
    prompt: int,
    asked: int | None,
    default: int,
    context: int | None,
    fields: tuple[str, str] = ("messages", "max_tokens"),
) -> int:
    """The tokens to generate after a `prompt`-token prompt: `asked`, else `default` (at most what
    the context leaves); ApiError when the prompt or the ask does not fit the model's context,
    naming `fields` (the request's prompt field and the max tokens field it set)."""
    if context is None:
        return asked or default
    (prompt_field, asked_field), said = fields, f"the prompt is {tokens_text(prompt)}"
    if prompt >= context:
        message = f"{said} but the model's context is {tokens_text(context)}"
        raise ApiError(400, message, param=prompt_field, code="context_length_exceeded")
    room = context - prompt
    if asked is not None and asked > room:
        raise ApiError(
            400,
            f"{said} and {asked_field} is {asked}, but the model's context is "
            f"{tokens_text(context)}: ask for at most {room}",
            param=asked_field,
            code="context_length_exceeded",
        )
    return asked or min(default, room)
