"""One thread owns the model and computes one sequence at a time; requests wait in a queue, taking
turns by client (jobs.py).

A streamed model reads its routed experts from disk for every token, so sequences computed side by
side would share the same disk and caches: they run in turn. Each request is a `Job` whose events
(`Step`s, then a `Done` or an `ApiError`) its HTTP handler reads; a handler whose client went away
cancels the job, and the loop stops at the next token (or skips the job if it has not started).
KV caches of finished sequences are kept (prompt_cache.py), so a conversation's next turn computes
only the tokens after the longest cached prefix; so is what a sequence cut short computed.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache, trim_prompt_cache
from mlx_lm.tokenizer_utils import TokenizerWrapper

from ..api_request import cached_tokens
from ..defaults import PROMPT_CACHE_SIZE
from ..generate import stream_generate
from ..kv_quantization import check_kv_cache_quantizes
from ..run_stats import settled
from .api import Completion, Sampling
from .disk_cache import DiskCache
from .fields import ApiError, server_failure
from .jobs import Done, Job, JobQueue, Step
from .logprobs import token_logprobs
from .output import Output
from .prompt_cache import PromptCache
from .sampling import sampler_and_processors

log = logging.getLogger("streamer.server")
KEEP_SECONDS = 120  # close() waits this long at most for a prompt cache being written
MODEL_KEY = "served"  # one model per server: the prompt cache's key for it


class Abandoned(Exception):
    """A job's client went away while its prompt was computed."""


class Engine:
    def __init__(
        self,
        model: nn.Module,
        tokenizer: TokenizerWrapper,
        prompt_cache_size: int = PROMPT_CACHE_SIZE,
        options: dict | None = None,
        disk: DiskCache | None = None,
        prompt_cache_bytes: int | None = None,
    ):
        """`options`: streamer.generate's keywords for every request (kv_bits, ...); `disk`: the
        prompt caches on disk, beside those in memory; `prompt_cache_bytes`: the most memory the
        kept KV caches take (the least recently used dropped first; None: no bound but their
        number)."""
        self.model, self.tokenizer = model, tokenizer
        self.options, self.disk = options or {}, disk
        self._keeping = threading.Lock()  # held while a finished sequence's cache is kept
        if self.options.get("kv_bits") is not None:
            check_kv_cache_quantizes(model, self.options)  # at start, not in every request
        self.tokenizer_lock = threading.Lock()  # HF fast tokenizers are not safe across threads
        if prompt_cache_bytes is None:
            self.prompt_cache = PromptCache(prompt_cache_size)
        else:
            self.prompt_cache = PromptCache(prompt_cache_size, prompt_cache_bytes)
        self.jobs = JobQueue()
        self.thread = threading.Thread(target=self._run, name="streamer-generate", daemon=True)
        self.thread.start()

    @property
    def healthy(self) -> bool:
        return self.thread.is_alive()

    def submit(self, job: Job) -> Job:
        self.jobs.put(job)
        return job

    def close(self) -> None:
        """Drop the jobs still waiting. The thread is left blocked, not ended: with mlx 0.32.4 a
        thread that ran generation and then ends makes MLX abort the process at exit (about one
        run in two here), so it ends with the process (it is a daemon)."""
        for job in self.jobs.drain():
            job.cancelled.set()
        self.wait_kept()

    def forget(self) -> None:
        """Drop the KV caches kept in memory, once the jobs before are done (chat's /reset: the
        old conversation's cache, near the context's size at its end, was kept while a new one
        grew beside it; --prompt-cache-dir's files stay)."""
        job = self.submit(Job(Completion(False, "", 0, Sampling()), [], 0, forget=True))
        job.events.get()

    def wait_kept(self) -> None:
        """Wait (KEEP_SECONDS at most) until the last answered sequence's KV cache is kept, in
        memory and in --prompt-cache-dir: its lock is taken before its Done is sent."""
        if self._keeping.acquire(timeout=KEEP_SECONDS):
            self._keeping.release()

    def _run(self) -> None:
        stream = mx.default_stream(mx.default_device())  # this thread's own, as mlx-lm's server
        while True:
            job = self.jobs.get()
            if job.cancelled.is_set():
                continue
            try:
                self._generate(job, stream)
            except ApiError as e:
                job.events.put(e)
            except Abandoned:  # its client went away while the prompt was computed
                job.events.put(Done("stop", len(job.prompt), 0, 0, None))
            except Exception as e:  # the server keeps serving; the request learns that it failed
                job.events.put(server_failure("generation failed", e))

    def _generate(self, job: Job, stream) -> None:
        if job.forget:
            self.prompt_cache.trim_to(n_sequences=0)
            mx.clear_cache()  # MLX's buffer pool gives the memory back to the system
            job.events.put(Done("forgotten", 0, 0, 0, None))
            return
        request = job.request
        cache, rest = self._cache_for(job.prompt)
        held = job.prompt[: len(job.prompt) - len(rest)]
        sampler, processors = sampler_and_processors(request.sampling, held)
        calls, one_call = request.tools is not None, not request.parallel_tool_calls
        output = Output(self.tokenizer, job.prompt, request.stop, request.chat, calls, one_call)
        generated: list[int] = []
        finish, stats = "length", None
        try:
            for response in stream_generate(
                self.model,
                self.tokenizer,
                rest,
                job.max_tokens,
                seed=request.sampling.seed,
                sampler=sampler,
                logits_processors=processors,
                prompt_cache=cache,
                stream=stream,
                **self._options(job, held),
            ):
                generated.append(response.token)
                stats = response.stats
                piece, stopped = output.feed(response.text)
                eos = response.finish_reason == "stop"
                tokens = []
                if request.logprobs and not eos:
                    top = request.top_logprobs
                    tokens = [token_logprobs(self.tokenizer, self.tokenizer_lock, response, top)]
                if piece or tokens:
                    job.events.put(Step(piece, tokens))
                if self._stops(job, stopped, len(generated)):
                    finish = "stop"
                    break
                finish = response.finish_reason or finish
        except Exception:  # Abandoned, or a step failed: what was computed stays kept
            self._keep_cut(job.prompt + generated, cache)
            raise
        if last := output.finish():
            job.events.put(Step(last))
        if finish == "stop" and output.made_tool_call:
            finish = "tool_calls"
        stats = stats and settled(self.model, stats)  # a stop string ends before the last piece
        with self._keeping:  # the answer is complete: the client need not wait for a disk write
            job.events.put(Done(finish, len(job.prompt), len(held), len(generated), stats))
            self._keep_cache(job.prompt + generated, cache)

    def _options(self, job: Job, cached: list[int]) -> dict:
        """The server's options for this job: its num_draft_tokens (0: no drafts) replaces the
        server's; a drafter also sees the tokens the prompt cache holds."""
        request = job.request
        options = {**self.options, "prompt_cache_tokens": cached}
        options["prompt_progress_callback"] = self._progress(job)
        if request.num_draft_tokens is not None:
            options["num_draft_tokens"] = request.num_draft_tokens
        return options

    def _progress(self, job: Job) -> Callable[[int, int], None] | None:
        """mlx-lm's prompt_progress_callback for `job`: the server's own (chat's bar), then a stop
        between two steps of the prompt once the job is cancelled: a long prompt's prefill went on
        for minutes after its client had gone (a token's check, `_stops`, comes after it)."""
        shown = self.options.get("prompt_progress_callback")

        def progress(done: int, total: int) -> None:
            if shown is not None:
                shown(done, total)
            if job.cancelled.is_set() and done < total:
                log.info("client gone: stopped after %d of the prompt's %d tokens", done, total)
                raise Abandoned

        return progress

    def _stops(self, job: Job, stopped: bool, generated: int) -> bool:
        """Whether generation ends after this token: a stop string came, or the client went
        away (an expert-parallel group's engine decides for all its ranks together)."""
        if job.cancelled.is_set():
            log.info("client gone: stopped after %d of %d tokens", generated, job.max_tokens)
            return True
        return stopped

    def _cache_for(self, prompt: list[int]) -> tuple[list, list[int]]:
        """The KV cache of the longest cached prefix of `prompt` and the tokens still to compute
        (at least one: the first new token's logits come from the last prompt token)."""
        cache, rest = self.prompt_cache.fetch_nearest_cache(MODEL_KEY, prompt)
        if self.disk is not None:
            held = len(prompt) - len(rest) if cache is not None else 0
            found = self.disk.fetch(prompt, longer_than=held)
            if found is not None:
                cache, rest = found[0], prompt[found[1] :]
        if cache is not None and not rest:
            if can_trim_prompt_cache(cache):
                trim_prompt_cache(cache, 1)
                return cache, prompt[-1:]
            cache = None
        if cache is None:  # chat's --max-kv-size: a rotating cache, as mlx_lm.chat makes it
            cache, rest = make_prompt_cache(self.model, self.options.get("max_kv_size")), prompt
        return cache, rest

    def _keep_cut(self, tokens: list[int], cache: list) -> None:
        """Keep in memory what a sequence cut by an exception computed of `tokens`: its cache was
        taken out of those kept, and the conversation's next turn computed it all again. Only a
        cache that can be trimmed (a recurrent state's tokens are not known), to the tokens known:
        a failed step may have fed one more, or a pass its drafts (stream_generate leveled the
        layers of one cut mid-step); none that holds nothing (cut before its first step)."""
        held = cached_tokens(cache)
        if held and can_trim_prompt_cache(cache):
            trim_prompt_cache(cache, max(held - len(tokens), 0))
            self._keep_cache(tokens, cache, on_disk=False)

    def _keep_cache(self, tokens: list[int], cache: list, on_disk: bool = True) -> None:
        # every token stream_generate yielded has been fed to the model (it computes one step
        # ahead), so the cache holds exactly these tokens; a cache with offsets says so itself
        offsets = {c.offset for c in cache if hasattr(c, "offset")}
        if len(offsets) == 1:
            tokens = tokens[: offsets.pop()]
        if self.disk is not None and on_disk:
            self.disk.save(tokens, cache)
        self.prompt_cache.insert_cache(MODEL_KEY, tokens, cache)
