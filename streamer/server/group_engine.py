"""`streamer serve` and `streamer chat` on an expert-parallel group: rank 0 takes the requests
(the HTTP server, the terminal), every rank computes each of them together.

Every MoE layer's all_sum needs all ranks in the same layer of the same token, so the ranks run
the same jobs in the same order: rank 0 broadcasts each job's prompt ids, token budget and
sampling parameters (its seed included, chosen by rank 0 when the request has none) before it
starts. Their prompt caches then hold the same entries and their sampled tokens agree. After every
token the ranks sum their stop flags, so a stop string, a client gone or a Ctrl-C on rank 0 ends
every rank's generation at the same token. Each message is an all_sum issued on the generation
stream, in order with the model's own collectives; waiting for it is one host sync per token.

An error inside a job leaves the ranks out of step (one rank left a layer's all_sum that the
others wait in), so it ends that rank with status 1: mlx.launch then stops the others, and a rank
whose peer is gone gets an error from the backend at its next collective and ends the same way.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import secrets
import signal
import sys
import threading
import time
from typing import NoReturn

import mlx.core as mx
import numpy as np

from .api import ApiError, Completion, Sampling
from .engine import Engine
from .fields import server_failure
from .jobs import Job

log = logging.getLogger("streamer.server")
QUIT, JOB = 0, 1  # the kinds of rank 0's messages
QUIT_SECONDS = 60  # how long closing waits for the running job to stop and the others to be told


class _Discard:
    """A follower's job events: no one reads them."""

    def put(self, _event) -> None:
        pass


class GroupEngine(Engine):
    """The server's engine on one rank of an expert-parallel group. On rank 0 it takes jobs
    as the single-process engine does (from HTTP handlers or the chat loop); the other ranks call
    `follow()`, which computes rank 0's jobs until rank 0 closes."""

    def __init__(
        self,
        model,
        tokenizer,
        prompt_cache_size: int,
        group: mx.distributed.Group,
        options: dict | None = None,
        prompt_cache_bytes: int | None = None,
    ):
        self.group, self.rank = group, group.rank()
        self._closing = threading.Event()  # rank 0 is closing: its running job stops
        self._told_to_quit = threading.Event()  # the other ranks have been told to stop
        self._quit = Job(Completion(False, "", 0, Sampling()), [], 0)  # closing, in the queue
        self._stream = None  # the generation stream, where every collective is issued
        super().__init__(model, tokenizer, prompt_cache_size, options, None, prompt_cache_bytes)

    def close(self) -> None:
        """Rank 0: stop the running job, drop the waiting ones and tell the other ranks to stop
        (they are waiting for rank 0's next message)."""
        super().close()
        if self.rank != 0 or not self.thread.is_alive():
            return
        self._closing.set()
        self.jobs.put(self._quit)  # after the running job: the generation thread sends QUIT
        if not self._told_to_quit.wait(QUIT_SECONDS):
            log.error("the other ranks could not be told to stop: end them (Ctrl-C mlx.launch)")

    def follow(self) -> None:
        """The ranks other than 0: compute rank 0's jobs with it until it says stop."""
        # Ctrl-C in the terminal reaches every local rank; rank 0 alone decides what it stops
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        self._stream = mx.default_stream(mx.default_device())
        while True:
            try:
                job = self._receive()
            except Exception as e:  # rank 0 is gone
                self._fail(None, e)
            if job is None:
                return
            self._generate(job, self._stream)

    def _run(self) -> None:
        if self.rank == 0:
            super()._run()
        # the other ranks' generation runs in `follow()`, this thread stays idle (it is a daemon)

    def _generate(self, job: Job, stream) -> None:
        self._stream = stream
        try:
            if job is self._quit:  # closing: the others are told to stop, no job comes after
                self._send(QUIT, b"")
                self._told_to_quit.set()
                return
            if self._told_to_quit.is_set():
                raise ApiError(503, "the server is shutting down")
            if self.rank == 0:
                job = self._with_seed(job)
                self._send(JOB, _encode(job))
            super()._generate(job, stream)
        except ApiError:
            raise
        except Exception as e:
            self._fail(job, e)

    def _stops(self, job: Job, stopped: bool, generated: int) -> bool:
        local = super()._stops(job, stopped, generated) or self._closing.is_set()
        return bool(self._all_sum(np.array([int(local)], np.int32))[0])

    def _progress(self, job: Job):
        """The server's own alone: the ranks stop together at a token (`_stops`), not mid-prompt."""
        return self.options.get("prompt_progress_callback")

    def _with_seed(self, job: Job) -> Job:
        """The job with a seed: sampled tokens must agree on every rank."""
        sampling = job.request.sampling
        if sampling.seed is None:
            seed = secrets.randbelow(1 << 31)
            job.request = dataclasses.replace(
                job.request, sampling=dataclasses.replace(sampling, seed=seed)
            )
        return job

    def _send(self, kind: int, payload: bytes) -> None:
        """Rank 0: one message to the others (its kind and length, then its bytes)."""
        self._all_sum(np.array([kind, len(payload)], np.int32))
        if payload:
            self._all_sum(np.frombuffer(payload, np.uint8).astype(np.int32))

    def _receive(self) -> Job | None:
        """The other ranks: rank 0's next job, or None when it says stop."""
        kind, length = self._all_sum(np.zeros(2, np.int32)).tolist()
        if kind == QUIT:
            return None
        payload = self._all_sum(np.zeros(length, np.int32)).astype(np.uint8).tobytes()
        job = _decode(payload)
        job.events = _Discard()
        return job

    def _all_sum(self, values: np.ndarray) -> np.ndarray:
        """The sum over the ranks of each rank's `values`, on the generation stream (after the
        model's collectives already issued there): a broadcast when only rank 0 gives non-zeros."""
        with mx.stream(self._stream):
            total = mx.distributed.all_sum(mx.array(values), group=self.group)
            mx.eval(total)
        return np.array(total)

    def _fail(self, job: Job | None, error: Exception) -> NoReturn:
        message = (
            f"rank {self.rank}: generation failed ({type(error).__name__}: {error}); the ranks "
            "are out of step, so every rank stops"
        )
        print(f"streamer: error: {message}", file=sys.stderr, flush=True)
        if job is not None and self.rank == 0:  # the client gets no file names, the log has them
            job.events.put(server_failure(f"rank {self.rank}: generation failed", error))
            deadline = time.monotonic() + 2  # time for its handler to answer the client
            while not job.events.empty() and time.monotonic() < deadline:
                time.sleep(0.05)
        os._exit(1)


def _encode(job: Job) -> bytes:
    """What the other ranks need of a job to compute the same tokens, in the same passes (its
    num_draft_tokens: a rank drafting otherwise would run other passes, and hang the group)."""
    sampling = dataclasses.asdict(job.request.sampling)
    return json.dumps(
        {
            "prompt": job.prompt,
            "max_tokens": job.max_tokens,
            "sampling": sampling,
            "num_draft_tokens": job.request.num_draft_tokens,
            "forget": job.forget,  # every rank drops its kept caches: they stay the same
        }
    ).encode()


def _decode(payload: bytes) -> Job:
    message = json.loads(payload)
    sampling = message["sampling"]
    if sampling.get("logit_bias"):  # JSON keys are strings
        sampling["logit_bias"] = {int(k): v for k, v in sampling["logit_bias"].items()}
    request = Completion(False, "", message["max_tokens"], Sampling(**sampling))
    request.num_draft_tokens = message["num_draft_tokens"]
    return Job(request, message["prompt"], message["max_tokens"], message["forget"])
