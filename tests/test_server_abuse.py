"""`streamer serve` against a client that holds the key but misbehaves: slow or idle connections,
bodies and prompts too large to hold or tokenize, a client gone during its prompt, bodies refused
unread, and what a server-side failure tells it.

The server here runs in this process (`in_process`), with an engine that computes nothing, so
that a test can shorten its deadlines; what needs the model uses the session's live server."""

from __future__ import annotations

import contextlib
import json
import logging
import re
import select
import socket
import threading
import time
from urllib.parse import urlsplit

import pytest
from serving import connection, request

from streamer.server.api import Completion, Sampling
from streamer.server.app import LONG_PROMPT_BYTES, App
from streamer.server.body_bytes import HeldBytes
from streamer.server.engine import Engine
from streamer.server.fields import ApiError
from streamer.server.http import Handler, Server
from streamer.server.jobs import Done, Job

SECRET = "/srv/models/private-model/shard-00001.safetensors"  # a path the client must not see


class NoEngine:
    """An engine for requests that never reach it."""

    healthy = True
    tokenizer_lock = threading.Lock()

    def submit(self, job: Job) -> Job:
        raise AssertionError("no request reaches the engine here")


@contextlib.contextmanager
def in_process(
    app: App,
    handler: type[Handler] = Handler,
    most_connections: int | None = None,
    held_bodies: HeldBytes | None = None,
):
    """A `streamer serve` HTTP server over `app` on a free port (taking `most_connections` at once,
    counting the bytes of bodies it holds in `held_bodies`, where given); yields its base url."""
    with running(app, handler, most_connections, held_bodies) as httpd:
        yield f"http://127.0.0.1:{httpd.server_port}/v1"


@contextlib.contextmanager
def running(
    app: App,
    handler: type[Handler] = Handler,
    most_connections: int | None = None,
    held_bodies: HeldBytes | None = None,
):
    """in_process's server, serving: yields the server."""
    httpd = Server(("127.0.0.1", 0), handler)
    httpd.app = app
    if most_connections is not None:
        httpd.most_connections = most_connections
        httpd.slots = threading.BoundedSemaphore(most_connections)
    if held_bodies is not None:
        httpd.held_bodies = held_bodies
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()


def address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname, parts.port


class FailingApp(App):
    """An app whose tokenizer's file went missing: an OSError that names the server's path."""

    def job(self, request: Completion, client: str | None = None) -> Job:
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


class Quick(Handler):
    """Deadlines of half a second: a test waits that long, not serve's 30 s."""

    head_seconds = body_seconds = 0.5


def _trickle(sock: socket.socket, head: bytes, byte: bytes) -> bytes:
    """What the server answers a client that sends `head`, then `byte` every 0.1 s (for 10 s at
    most) until the server answers."""
    sock.sendall(head)
    for _ in range(100):
        if select.select([sock], [], [], 0.1)[0]:
            break
        sock.sendall(byte)
    return sock.makefile("rb").read()


@pytest.mark.parametrize(
    "head, byte, words",
    [
        (b"GET /v1/models HTTP/1.1\r\nX-Slow: ", b"y", "headers did not arrive within 0.5 s"),
        (
            b"POST /v1/completions HTTP/1.1\r\nContent-Length: 100000\r\n\r\n",
            b" ",
            "body stalled for 0.5 s or came slower than 16 KiB/s",
        ),
    ],
    ids=["head", "body"],
)
def test_a_request_sent_a_byte_at_a_time_is_answered_408(app, head, byte, words):
    """A byte every 0.1 s restarted the socket's 120 s timeout each time: the connection (and its
    slot under the cap) was held for as long as the client kept it up."""
    with in_process(app, Quick) as url, socket.create_connection(address(url), timeout=5) as s:
        answer = _trickle(s, head, byte)
    status, _, rest = answer.partition(b"\r\n")
    assert status == b"HTTP/1.1 408 Request Timeout", answer
    assert words in json.loads(rest.partition(b"\r\n\r\n")[2])["error"]["message"]


def test_slow_and_idle_connections_free_their_slots(app):
    """Connections that sent half a head, or nothing, filled the cap until the socket's timeout
    (120 s): every other client was answered 503 meanwhile."""
    with in_process(app, Quick, most_connections=2) as url, contextlib.ExitStack() as held:
        idle = held.enter_context(socket.create_connection(address(url), timeout=5))
        slow = held.enter_context(socket.create_connection(address(url), timeout=5))
        slow.sendall(b"GET /v1/models HTTP/1.1\r\n")
        assert request(url, "GET", "/health")[0] == 503
        assert slow.makefile("rb").read().startswith(b"HTTP/1.1 408")
        assert idle.recv(100) == b""  # closed unanswered: no request of its client is pending
        for client in (slow, idle):  # closed, as their clients do: the server's reads end
            client.close()
        for _ in range(100):  # a slot is free once the server's thread has closed it
            if request(url, "GET", "/health")[0] == 200:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the slots stayed taken")


class Second(Handler):
    head_seconds = body_seconds = 1


def test_a_kept_alive_connection_serves_requests_within_the_deadline(app):
    """The deadline of a head restarts at each answer: a client that pauses between requests (less
    than the deadline) keeps its connection."""
    with in_process(app, Second) as url:
        http, sockets = connection(url, timeout=5), []
        for _ in range(3):
            http.request("GET", "/v1/models")
            sockets.append(http.sock)
            response = http.getresponse()
            assert response.status == 200 and response.read()
            time.sleep(0.4)  # each pause under the second, together over it
        http.close()
    assert sockets[0] is sockets[1] is sockets[2]


def test_the_bodies_held_at_once_are_bounded(app):
    """Every connection could hold a 32 MB body, however many were open: 1,024 of them 32 GB."""
    two = json.dumps({"prompt": "x" * 300, "n": 2}).encode()  # read whole, then refused: a 400
    held = HeldBytes(1000)
    with in_process(app, held_bodies=held) as url:
        with socket.create_connection(address(url), timeout=5) as first:
            first.sendall(b"POST /v1/completions HTTP/1.1\r\nContent-Length: 800\r\n\r\n{")
            for _ in range(100):  # until the server has read its head
                if held.held:
                    break
                time.sleep(0.01)
            status, body = request(url, "POST", "/v1/completions", two)
            assert status == 503 and "retry later" in body["error"]["message"], body
        for _ in range(100):  # the first body's bytes are given back once its request ends
            if (status := request(url, "POST", "/v1/completions", two)[0]) != 503:
                break
            time.sleep(0.05)
        assert status == 400


def test_a_body_declared_large_and_sent_slowly_holds_only_what_has_come(app):
    """A body's declared length was counted as held before it came: a few clients declaring
    32 MB and sending a trickle had every other body refused (503) while they lasted."""
    two = json.dumps({"prompt": "hi", "n": 2}).encode()  # read whole, then refused: a 400
    held = HeldBytes(2 << 20)
    with in_process(app, held_bodies=held) as url:
        with socket.create_connection(address(url), timeout=5) as slow:
            slow.sendall(
                b"POST /v1/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n{" % (2 << 20)
            )
            for _ in range(100):  # until the server has read its head
                if held.held:
                    break
                time.sleep(0.01)
            assert request(url, "POST", "/v1/completions", two)[0] == 400


def test_a_head_over_128_kib_is_refused(app):
    """http.server takes 100 header lines of 64 KiB each: 6.5 MB a connection held in memory."""
    line = b"X-Big: " + b"a" * 60000 + b"\r\n"  # each line under http.server's own bound
    with in_process(app) as url, socket.create_connection(address(url), timeout=5) as s:
        s.sendall(b"GET /v1/models HTTP/1.1\r\n" + line * 3 + b"\r\n")
        answer = s.makefile("rb").read()
    assert answer.startswith(b"HTTP/1.1 431") and b"headers are over 128 KiB" in answer, answer


@pytest.mark.parametrize(
    "path, fields",
    [
        ("/v1/completions", {"prompt": "word " * 20000}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "word " * 20000}]}),
    ],
    ids=["text", "chat"],
)
def test_a_prompt_far_past_the_context_is_refused_before_it_is_tokenized(server, path, fields):
    """A 30 MB prompt was tokenized before the context refused it: 30 s here, every other
    request's tokenization waiting on the tokenizer's lock meanwhile."""
    body = json.dumps({**fields, "max_tokens": 1}).encode()
    status, answer = request(server[0], "POST", path, body)
    error = answer["error"]
    assert status == 400 and error["code"] == "context_length_exceeded", answer
    assert "over the 32,768 the model's context of 1024 tokens can hold" in error["message"]


@pytest.mark.parametrize(
    "head, status",
    [
        (b"Content-Length: 100\r\n", b"401"),  # no key
        (b"Authorization: Bearer k\r\nContent-Length: 40000000\r\n", b"413"),
        (b"Authorization: Bearer k\r\nContent-Length: 100\r\n", b"100"),
    ],
    ids=["no-key", "too-large", "sent"],
)
def test_a_request_its_head_refuses_is_answered_before_its_body_is_asked_for(head, status):
    """The server said `100 Continue`, then refused the request: curl sent its body into a
    connection closed under it, and said 'broken pipe', not why."""
    app = App(NoEngine(), "m", Sampling(), 8, 1024, api_key="k")
    with in_process(app) as url, socket.create_connection(address(url), timeout=5) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nExpect: 100-continue\r\n" + head + b"\r\n")
        assert s.makefile("rb").readline().split()[1] == status


def test_a_job_whose_client_left_during_its_prompt_stops_between_prefill_steps(local):
    """A client gone while its long prompt was computed held the engine until the prompt was
    done and a token made (minutes for a long prompt of a streamed model): only a token's check
    stopped it."""
    model, tokenizer = local
    job = Job(Completion(False, "m", 4, Sampling()), [i % 500 + 1 for i in range(900)], 4)
    seen = []

    def progress(done: int, total: int) -> None:
        seen.append(done)
        if done >= 64:
            job.cancelled.set()  # the client leaves after the prompt's first step

    options = {"prefill_step_size": 64, "prompt_progress_callback": progress}
    done = Engine(model, tokenizer, options=options).submit(job).events.get(timeout=60)
    assert isinstance(done, Done) and done.completion_tokens == 0, done
    assert seen == [0, 64]


# module-level: a copy of the tokenizer sees them too
LONG_TEXT_STARTS, LONG_TEXT_GOES_ON = threading.Event(), threading.Event()


class SlowTokenizer:
    """A tokenizer whose encoding of a long prompt takes until LONG_TEXT_GOES_ON is set."""

    bos_token = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if len(text) > LONG_PROMPT_BYTES:
            LONG_TEXT_STARTS.set()
            assert LONG_TEXT_GOES_ON.wait(30)
        return [1]


def test_a_short_prompt_is_not_kept_waiting_behind_a_long_ones_tokenization():
    """Every prompt was tokenized under one lock: a short one sent while a long one (megabytes,
    seconds to tokenize) was tokenized waited for it."""
    engine = NoEngine()
    engine.tokenizer = SlowTokenizer()
    app = App(engine, "m", Sampling(), 8, None)
    long = Completion(False, "m", 1, Sampling(), text="x" * (LONG_PROMPT_BYTES + 1))
    waiting = threading.Thread(target=app.job, args=(long,), daemon=True)
    waiting.start()
    short = threading.Thread(
        target=app.job, args=(Completion(False, "m", 1, Sampling(), text="hi"),)
    )
    short.start()
    short.join(timeout=30)
    finished = not short.is_alive()
    LONG_TEXT_GOES_ON.set()
    waiting.join(timeout=30)
    assert finished and not waiting.is_alive()


def test_a_refusal_before_the_body_is_read_reaches_a_client_still_sending_it():
    """A 401 (no key) to a 5 MB body: the server closed with the body unread, which sends a
    reset, and the client read 'connection reset' (every time here, at 5 MB), not the 401."""
    app = App(NoEngine(), "m", Sampling(), 8, 1024, api_key="k")
    with in_process(app) as url:
        http = connection(url, timeout=10)
        http.request("POST", "/v1/completions", body=b"x" * 5_000_000)
        assert http.getresponse().status == 401
        http.close()


def test_the_503_at_the_connection_cap_reaches_a_client_still_sending_its_body():
    """The 503 was sent and the connection closed with the request unread, which sends a reset:
    a client sending a 5 MB body read 'broken pipe' (5 times in 5 here), a 100-byte one at times."""
    app = App(NoEngine(), "m", Sampling(), 8, 1024)
    with in_process(app, most_connections=1) as url, socket.create_connection(address(url)):
        for _ in range(3):  # the one slot is held by the connection above
            http = connection(url, timeout=10)
            http.request("POST", "/v1/completions", body=b"x" * 5_000_000)
            assert http.getresponse().status == 503
            http.close()
