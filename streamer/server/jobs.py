"""What a request is to the engine (engine.py): a `Job`, the tokens it may generate (`fit`), the
events its handler reads, and the queue where jobs wait their turn (`JobQueue`)."""

from __future__ import annotations

import threading
from collections import deque
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
        self,
        request: Completion,
        prompt: list[int],
        max_tokens: int,
        forget: bool = False,
        client: str | None = None,
    ):
        """`forget`: no answer, the kept KV caches in memory are dropped (chat's /reset);
        `client`: who asked (serve's: the address), whose jobs wait their turn (`JobQueue`)."""
        self.request, self.prompt, self.max_tokens = request, prompt, max_tokens
        self.forget, self.client = forget, client
        self.events: Queue = Queue()
        self.cancelled = threading.Event()


class JobQueue:
    """Jobs waiting for the engine's thread, taken in turn by client, in order within each: one
    client's many (its share of the connections, each a long answer) held every other client's,
    queued after them, for as long as they all took. A client waits behind one job of each client
    ahead of it at most."""

    def __init__(self):
        self._waiting: dict[str | None, deque[Job]] = {}  # the clients in turn, oldest first
        self._ready = threading.Condition()

    def put(self, job: Job) -> None:
        with self._ready:
            self._waiting.setdefault(job.client, deque()).append(job)
            self._ready.notify()

    def get(self) -> Job:
        """The next job, once there is one: the first waiting client's oldest, that client then
        last in turn."""
        with self._ready:
            while not self._waiting:
                self._ready.wait()
            client, jobs = next(iter(self._waiting.items()))
            del self._waiting[client]
            job = jobs.popleft()
            if jobs:
                self._waiting[client] = jobs
            return job

    def drain(self) -> list[Job]:
        """The jobs waiting, taken out."""
        with self._ready:
            jobs = [job for waiting in self._waiting.values() for job in waiting]
            self._waiting.clear()
            return jobs


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
