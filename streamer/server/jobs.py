"""What a request is to the engine (engine.py): a `Job`, and the events its handler reads."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from queue import Queue

from ..run_stats import RunStats
from .api import Completion
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
