"""What every request handler of `streamer serve` shares, and how a request becomes a job: its
prompt checked for size, tokenized (one request at a time: the tokenizer is shared) and fitted
to the model's context."""

from __future__ import annotations

import time

from .api import Completion, Sampling
from .engine import Engine, fit
from .jobs import Job
from .prompts import check_prompt_size, prompt_tokens


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
    ):
        self.engine, self.model_id, self.api_key = engine, model_id, api_key
        self.defaults, self.max_tokens, self.context = defaults, max_tokens, context
        self.started = int(time.time())  # the served model's `created`

    def job(self, request: Completion) -> Job:
        check_prompt_size(request, self.context)  # before the tokenizer is taken
        with self.engine.tokenizer_lock:
            prompt = prompt_tokens(request, self.engine.tokenizer)
        fields = (request.prompt_field, request.max_tokens_field)
        asked = request.max_tokens
        return Job(request, prompt, fit(len(prompt), asked, self.max_tokens, self.context, fields))
