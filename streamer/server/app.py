"""What every request handler of `streamer serve` shares (the engine, the served model's names, the
defaults a request leaves to the server), and how a request becomes a job: its prompt checked for
size, tokenized and fitted to the model's context.

A tokenizer is used by one thread at a time (HF's fast tokenizers are not safe across threads), so
a prompt of megabytes, seconds to tokenize, made every other request's prompt wait as long. Long
prompts are tokenized by a copy of the tokenizer, under its own lock: they wait for each other,
short ones for short ones.
"""

from __future__ import annotations

import copy
import logging
import threading
import time

from ..arguments import tokens_text, vocabulary
from .api import Completion, Sampling
from .engine import Engine
from .fields import ApiError
from .jobs import Job, fit
from .prompts import prompt_size, prompt_tokens
from .sampling import check_logit_bias

log = logging.getLogger("streamer.server")
LONG_PROMPT_BYTES = 256 << 10  # about 64K tokens of English: tokenized in a fraction of a second


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
        self._long: tuple | None = None  # the long prompts' tokenizer and lock, once needed
        self._copying = threading.Lock()

    def job(self, request: Completion, client: str | None = None) -> Job:
        """`request` made a job for the engine; `client`: who asked (its address), whose jobs
        take their turn together."""
        self._check_asked(request)
        request.template_kwargs = {**self.template_kwargs, **request.template_kwargs}
        tokenizer, lock = self._tokenizer(prompt_size(request, self.context))
        with lock:  # the vocabulary is counted once per tokenizer, under its lock
            if request.sampling.logit_bias:
                check_logit_bias(request.sampling.logit_bias, vocabulary(tokenizer))
            prompt = prompt_tokens(request, tokenizer, self.context)
        fields = (request.prompt_field, request.max_tokens_field)
        asked = request.max_tokens
        budget = fit(len(prompt), asked, self.max_tokens, self.context, fields)
        return Job(request, prompt, budget, client=client)

    def _check_asked(self, request: Completion) -> None:
        """ApiError 400 for a max_tokens the context cannot hold with any prompt, before the prompt
        is tokenized (seconds for a long one): `fit` refuses it after, naming the room left."""
        asked, context = request.max_tokens, self.context
        if context is not None and asked is not None and asked >= context:
            raise ApiError(
                400,
                f"{request.max_tokens_field} is {asked}, but the model's context is "
                f"{tokens_text(context)}, the prompt's tokens included: ask for fewer",
                param=request.max_tokens_field,
                code="context_length_exceeded",
            )

    def _tokenizer(self, size: int) -> tuple:
        """The tokenizer for a prompt of `size` bytes of text, and the lock to hold while using
        it: the engine's, or for a long prompt a copy of it (made once)."""
        engine = self.engine
        if size <= LONG_PROMPT_BYTES:
            return engine.tokenizer, engine.tokenizer_lock
        with self._copying:
            if self._long is None:
                try:
                    self._long = copy.deepcopy(engine.tokenizer), threading.Lock()
                except Exception as e:  # a tokenizer of a model's own code may not copy
                    log.warning("long prompts share the tokenizer (it cannot be copied: %s)", e)
                    self._long = engine.tokenizer, engine.tokenizer_lock
        return self._long
