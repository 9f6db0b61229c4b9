"""`streamer serve` against a client that holds the key but misbehaves: slow or idle connections,
bodies and prompts too large to hold or tokenize, and what a server-side failure tells it.

The server here runs in this process (`in_process`), with an engine that computes nothing, so
that a test can shorten its deadlines; what needs the model uses the session's live server."""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from urllib.parse import urlsplit

import pytest
from serving import request

from streamer.server.api import Completion, Sampling
from streamer.server.engine import Engine
from streamer.server.fields import ApiError
from streamer.server.http import App, Handler, Server
from streamer.server.jobs import Job

SECRET = "/srv/models/private-model/shard-00001.safetensors"  # a path the client must not see


class NoEngine:
    """An engine for requests that never reach it."""

    healthy = True
    tokenizer_lock = threading.Lock()

    def submit(self, job: Job) -> Job:
        raise AssertionError("no request reaches the engine here")


@contextlib.contextmanager
def in_process(app: App, handler: type[Handler] = Handler):
    """A `streamer serve` HTTP server over `app` on a free port; yields its base url."""
    httpd = Server(("127.0.0.1", 0), handler)
    httpd.app = app
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_port}/v1"
    finally:
        httpd.shutdown()
        httpd.server_close()


def address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname, parts.port


class FailingApp(App):
    """An app whose tokenizer's file went missing: an OSError that names the server's path."""

    def job(self, request: Completion) -> Job:
        raise FileNotFoundError(2, "No such file or directory", SECRET)


def _reference(message: str) -> str:
    found = re.search(r"reference ([0-9a-f]{8})", message)
    assert found, message
    return found.group(1)


def test_a_failure_in_a_request_names_no_path_but_a_reference_in_the_log(caplog):
    """The 500 said the OSError's text, the server's file path in it."""
    app = FailingApp(NoEngine(), "m", Sampling(), 8, 1024)
    with caplog.at_level(logging.ERROR, "streamer.server"), in_process(app) as url:
        status, body = request(url, "POST", "/v1/completions", b'{"prompt": "hi"}')
    message = body["error"]["message"]
    assert status == 500 and SECRET not in message and "Traceback" not in message, body
    logged = [r for r in caplog.records if _reference(message) in r.getMessage()]
    assert logged and SECRET in logged[0].getMessage() and logged[0].exc_info, caplog.text


class UnreadableDisk:
    """Prompt caches on disk whose folder became unreadable."""

    def fetch(self, tokens: list[int], longer_than: int):
        raise PermissionError(13, "Permission denied", SECRET)


def test_a_failure_in_generation_names_no_path_but_a_reference_in_the_log(caplog):
    """The engine's 500 said `generation failed: [Errno 13] Permission denied: '/srv/...'`."""
    engine = Engine(None, None, disk=UnreadableDisk())
    job = Job(Completion(False, "m", 2, Sampling()), [1, 2, 3], 2)
    with caplog.at_level(logging.ERROR, "streamer.server"):
        failed = engine.submit(job).events.get(timeout=30)
    assert isinstance(failed, ApiError) and failed.status == 500
    assert SECRET not in failed.message and "generation failed" in failed.message
    logged = [r for r in caplog.records if _reference(failed.message) in r.getMessage()]
    assert logged and SECRET in logged[0].getMessage(), caplog.text


@pytest.fixture
def app() -> App:
    return App(NoEngine(), "m", Sampling(), 8, 1024)
