"""The HTTP side: routes, request bodies, server-sent events, OpenAI-style errors.

Standard-library `http.server`, as mlx-lm's server uses: a thread per connection, each of which
validates and tokenizes its request, queues it on the one `Engine`, then writes what the engine
produces. Bad input is answered with a 4xx before anything is queued.
"""

from __future__ import annotations

import itertools
import json
import socket
import time
from http.server import ThreadingHTTPServer
from queue import Empty
from urllib.parse import unquote, urlsplit

from .api import parse_completion
from .app import App
from .auth import check_key
from .connection import ClientGone, ConnectionCap, QuietHandler, client_gone
from .fields import ApiError, http_refusal, parse_body, server_failure
from .jobs import Done, Job, Step
from .output import Piece
from .request_body import declares_body, framing, read_body
from .responses import Answer, stats_json

POLL_SECONDS = 0.25  # how often a waiting handler checks that its client is still there
SOCKET_SECONDS = 120  # a client that takes none of its answer for this long is dropped
CHAT_PATHS = ("/v1/chat/completions", "/chat/completions")
TEXT_PATHS = ("/v1/completions", "/completions")
# without /v1 too, as the completions: a client whose base URL lacks it chatted, but its check
# of the connection (Open WebUI's lists the models) was a 404
MODELS_PATHS = ("/v1/models", "/models")


class Handler(QuietHandler):
    server: Server
    timeout = SOCKET_SECONDS  # for writes: a request's reads have deadlines (deadlines.py)
    # HTTP/1.1: a connection serves request after request, and `Expect: 100-continue` is
    # answered (curl sends it for a body over 1 KiB, then waited a second for the answer)
    protocol_version = "HTTP/1.1"

    def end_headers(self) -> None:
        # any origin, as mlx-lm's server allows by default: browser clients call it directly.
        # Browsers never let "*" cover Authorization (the Fetch standard): it is named, or a
        # preflight for a request with a key (OpenAI's JavaScript client always sends one) fails
        self.send_header("Access-Control-Allow-Origin", "*")
        self.send_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
        self.send_header("Access-Control-Allow-Headers", "Authorization, *")
        super().end_headers()

    def parse_request(self) -> bool:
        parsed = super().parse_request()
        if parsed and self.command != "POST" and declares_body(self.headers):
            self.close_connection = True  # its body is not read: it would be the next request
        return parsed

    def handle_expect_100(self) -> bool:
        """A request its head refuses is answered before its body is asked for: curl sent its
        body on `100 Continue`, into a connection closed under it (a broken pipe, not the 401)."""
        if self._refused():
            return False
        try:
            if self.command == "POST":
                framing(self.headers)
        except ApiError as e:
            self._error(e)
            return False
        return super().handle_expect_100()

    def _end_answer_headers(self) -> None:
        if self.close_connection:  # an HTTP/1.1 client keeps a connection unless told
            self.send_header("Connection", "close")
        self.end_headers()

    def do_OPTIONS(self) -> None:  # a browser's preflight
        self.send_response(204)
        self._end_answer_headers()

    def _not_allowed(self) -> None:
        """404 where nothing is served; else 405, with the Allow header HTTP requires of it."""
        route, method = self.route, self.command.replace("HEAD", "GET")  # HEAD has GET's head
        if route in CHAT_PATHS + TEXT_PATHS:
            served = ("POST",)
        elif (
            route == "/health" or route.rstrip("/") in MODELS_PATHS or self._names_the_model(route)
        ):
            served = ("GET", "HEAD")
        else:
            return self._error(ApiError(404, f"no such endpoint: {method} {route}"))
        allow = {"Allow": ", ".join((*served, "OPTIONS"))}
        self._error(
            ApiError(405, f"{method} is not allowed on {route}: use {served[0]}", headers=allow)
        )

    do_PUT = do_DELETE = do_PATCH = _not_allowed
    send_error = http_refusal  # a bad request line, TRACE, headers too long: JSON, not HTML

    @property
    def route(self) -> str:
        return urlsplit(self.path).path  # a query string (?api-version=...) changes nothing

    def _refused(self) -> bool:
        """Whether the request lacks the --api-key (then answered 401)."""
        try:
            check_key(self.server.app.api_key, self.route, self.headers.get("Authorization"))
        except ApiError as e:
            self._error(e)
            return True
        return False

    def do_GET(self) -> None:
        app, route = self.server.app, self.route
        if self._refused():
            return
        if route == "/health":
            healthy = app.engine.healthy
            self._json(200 if healthy else 503, {"status": "ok" if healthy else "unavailable"})
        elif route.rstrip("/") in MODELS_PATHS:
            self._json(200, {"object": "list", "data": [self._model()]})
        elif self._names_the_model(route):
            self._json(200, self._model())
        else:  # a completion is asked for by POST: a 405, as DELETE's
            self._not_allowed()

    # GET's answer without its body, as HTTP requires of a server: uptime monitors probe with
    # HEAD (/health was a 405, read as down)
    do_HEAD = do_GET

    def _names_the_model(self, route: str) -> bool:
        """Whether `route` is /v1/models/NAME (or /models/NAME) of the served model."""
        for path in MODELS_PATHS:
            if route.startswith(f"{path}/"):
                return unquote(route[len(path) + 1 :]) == self.server.app.model_id
        return False

    def _model(self) -> dict:
        # `created` too: typed clients (Rust's async-openai, ...) refused a model without it
        app = self.server.app
        model = {"id": app.model_id, "object": "model", "created": app.started}
        return {**model, "owned_by": "streamer"}

    def do_POST(self) -> None:
        chat = self.route in CHAT_PATHS
        if self._refused():
            return
        if not chat and self.route not in TEXT_PATHS:
            return self._not_allowed()
        try:
            app = self.server.app
            body = parse_body(read_body(self.headers, self.rfile, self.take_body_bytes))
            request = parse_completion(body, chat=chat, model=app.model_id, defaults=app.defaults)
            job = app.engine.submit(app.job(request, self.client_address[0]))
        except ApiError as e:
            self._error(e)
            return
        except Exception as e:  # a bug: the client still gets an answer, the log the traceback
            self._error(server_failure("the server failed on this request", e))
            return
        try:  # a client that goes away raises GONE, which ends the request quietly
            (self._stream if request.stream else self._whole)(job)
        finally:
            job.cancelled.set()  # a no-op once the job is done; else its generation stops

    def _events(self, job: Job):
        """The job's events as they come; ClientGone once the client hung up (checked every
        POLL_SECONDS, so a queued job or a long prompt notices too)."""
        checked = time.monotonic()
        while True:
            try:
                event = job.events.get(timeout=POLL_SECONDS)
            except Empty:
                if not self.server.app.engine.healthy:
                    raise ApiError(500, "the generation thread stopped") from None
                event = None
            if time.monotonic() - checked > POLL_SECONDS:
                if client_gone(self.connection):
                    raise ClientGone  # the finally of do_POST cancels the job
                checked = time.monotonic()
            if isinstance(event, ApiError):
                raise event
            if event is not None:
                yield event
            if isinstance(event, Done):
                return

    def _whole(self, job: Job) -> None:
        answer = Answer(job.request, self.server.app.engine.tokenizer.tool_parser)
        try:
            for event in self._events(job):
                if isinstance(event, Step):
                    answer.add(event.piece, event.tokens)
                elif isinstance(event, Done):
                    self._json(200, answer.whole(event))
        except ApiError as e:
            self._error(e)

    def _stream(self, job: Job) -> None:
        """Server-sent events. The status line waits for the first event, so that a request the
        generation refuses at once (a logit_bias past the vocabulary) gets its 4xx."""
        answer = Answer(job.request, self.server.app.engine.tokenizer.tool_parser)
        events = self._events(job)
        try:
            first = next(events)
        except ApiError as e:
            self._error(e)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.close_connection = True  # events of no length given: the stream ends as it closes
        self._end_answer_headers()
        try:
            for event in itertools.chain([first], events):
                if isinstance(event, Step):
                    self._event(answer.chunk(event.piece, event.tokens))
                else:
                    final = answer.chunk(Piece(), [], event.finish_reason)
                    final["streamer"] = stats_json(event.stats)
                    self._event(final)
                    if job.request.include_usage:
                        self._event(answer.usage_chunk(event))
        except ApiError as e:
            self._event(e.body())  # the status line is sent already: the error is an event
        self._send(b"data: [DONE]\n\n")

    def _event(self, body: dict) -> None:
        self._send(f"data: {json.dumps(body)}\n\n".encode())

    def _send(self, data: bytes) -> None:
        self.wfile.write(data)
        self.wfile.flush()

    def _json(self, status: int, body: dict, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self._end_answer_headers()
        if self.command != "HEAD":
            self._send(data)

    def _error(self, error: ApiError) -> None:
        self.close_connection = True  # an unread body may still be on the connection
        self._json(error.status, error.body(), error.headers)


class Server(ConnectionCap, ThreadingHTTPServer):
    daemon_threads = True
    # connections waiting to be accepted: socketserver's 5 reset the rest of a burst (64 at once
    # saw 17-44 resets); the kernel caps it at net.core.somaxconn. Accepted requests queue for
    # the one generation thread (engine.py).
    request_queue_size = socket.SOMAXCONN
    app: App
