"""What every request handler shares: the engine, the served model's names, the defaults a
request leaves to the server, and a checked request made a job."""

from __future__ import annotations

import time

from .api import Completion, Sampling
from .engine import Engine, fit
from .jobs import Job
from .prompts import prompt_tokens


class App:
    """What every handler shares: the engine, the served model's names and the defaults."""

    def __init__(
        self,
        engine: Engine,
        model_id: str,
        defaults: Sampling,
        max_tokens: int,
        context: int | None,
        api_key: str | None = None,
        template_kwargs: dict | None = None,  # --chat-template-args: a request's replace them
    ):
        self.engine, self.model_id, self.api_key = engine, model_id, api_key
        self.template_kwargs = template_kwargs or {}
        self.defaults, self.max_tokens, self.context = defaults, max_tokens, context
        self.started = int(time.time())  # the served model's `created`

    def job(self, request: Completion) -> Job:
        request.template_kwargs = {**self.template_kwargs, **request.template_kwargs}
        with self.engine.tokenizer_lock:
            prompt = prompt_tokens(request, self.engine.tokenizer)
        fields = (request.prompt_field, request.max_tokens_field)
        asked = request.max_tokens
        return Job(request, prompt, fit(len(prompt), asked, self.max_tokens, self.context, fields))
