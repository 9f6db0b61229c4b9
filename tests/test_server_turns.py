"""Requests waiting for serve's one generation thread take turns by client: one client's many
requests (its share of the connections, each a long answer) held every other client's for as
long as they all took."""

from __future__ import annotations

import threading

from test_server_abuse import NoEngine, running
from test_server_client_cap import status_from

from streamer.server.api import Completion, Sampling
from streamer.server.app import App
from streamer.server.engine import Engine
from streamer.server.fields import ApiError
from streamer.server.jobs import Done, Job


class Recording(Engine):
    """An engine that records the jobs in the order it computes them."""

    def __init__(self, *args, **kwargs):
        self.computed: list[Job] = []
        super().__init__(*args, **kwargs)

    def _generate(self, job: Job, stream) -> None:
        self.computed.append(job)
        super()._generate(job, stream)


def test_a_client_with_many_requests_waiting_takes_turns_with_another(local):
    model, tokenizer = local
    started, go_on = threading.Event(), threading.Event()

    def progress(done: int, total: int) -> None:
        started.set()
        go_on.wait(timeout=60)  # the first job holds the engine until the others are queued

    engine = Recording(model, tokenizer, options={"prompt_progress_callback": progress})

    def ask(client: str) -> Job:
        return engine.submit(
            Job(Completion(False, "m", 1, Sampling()), [7, 8, 9], 1, client=client)
        )

    first = ask("a")
    assert started.wait(timeout=60)
    waiting = {name: ask(name[0]) for name in ("a2", "a3", "a4", "b1")}
    go_on.set()
    for job in [first, *waiting.values()]:
        while not isinstance(job.events.get(timeout=60), Done):
            pass
    names = {id(job): name for name, job in waiting.items()}
    assert [names[id(job)] for job in engine.computed[1:]] == ["a2", "b1", "a3", "a4"]


class Asking(App):
    """An app that records who asked (in `clients`), and refuses every request."""

    def job(self, request: Completion, client: str | None = None) -> Job:
        self.clients.append(client)
        raise ApiError(400, "refused")


def test_a_request_s_job_is_its_client_s():
    app = Asking(NoEngine(), "m", Sampling(), 8, 1024)
    app.clients = []
    body = b'{"prompt": "hi"}'
    with running(app) as httpd:
        sent = b"POST /v1/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        assert status_from(httpd, "203.0.113.7", sent) == b"HTTP/1.1 400 Bad Request"
    assert app.clients == ["203.0.113.7"]
