"""`streamer serve`: an OpenAI-compatible HTTP server over one streamed model.

Endpoints: POST /v1/chat/completions, POST /v1/completions (streamed as server-sent events or
whole), GET /v1/models, GET /health. See http.py (requests and answers) and engine.py (the one
generation thread, the prompt cache).
"""

from __future__ import annotations

import errno
import logging
import sys
from pathlib import Path

from ..defaults import MAX_TOKENS
from .api import Sampling


def open_model(folder: Path, options):
    """The model, its tokenizer and its context length in tokens (None if config.json has none);
    `options`: the load's decided options (loading/options.py), its group this rank's share of an
    expert-parallel group (streamer/server/group_engine.py)."""
    from ..loading.load import load_decided

    model, tokenizer = load_decided(folder, options)
    group = options.group
    if group is None or group.rank() == 0:
        print(f"[streamer] {model.streamer.residency}", file=sys.stderr)
    return model, tokenizer, model.streamer.context_length


def open_engine(
    model,
    tokenizer,
    prompt_cache_size: int,
    group=None,
    options: dict | None = None,
    disk: tuple[Path, int] | None = None,
    prompt_cache_bytes: int | None = None,
):
    """The engine that computes the requests: under a group, every rank's (the ranks other than
    0 then call its `follow()`); `options`: streamer.generate's keywords for every request;
    `disk`: (folder, byte bound) of the prompt caches kept on disk, one process's alone (the CLI
    refuses it under a group: kv_options.disk_option); `prompt_cache_bytes`: the bound of those
    kept in memory (None: their number alone)."""
    from .engine import Engine

    if group is None:
        on_disk = prompt_cache_on_disk(model, options, disk)
        return Engine(model, tokenizer, prompt_cache_size, options, on_disk, prompt_cache_bytes)
    from .group_engine import GroupEngine

    return GroupEngine(model, tokenizer, prompt_cache_size, group, options, prompt_cache_bytes)


def prompt_cache_on_disk(model, options: dict | None, disk: tuple[Path, int] | None):
    """The prompt caches on disk (disk_cache.py) for this model, or None."""
    if disk is None:
        return None
    from .disk_cache import DiskCache
    from .disk_entries import model_identity

    return DiskCache(Path(disk[0]), model_identity(model, options or {}), disk[1], model)


def start_logging() -> None:
    """The server's and the engine's log lines on stderr, from before the model loads."""
    logging.basicConfig(level=logging.INFO, format="[serve] %(message)s", stream=sys.stderr)


def serve(
    engine,
    name: str,
    context: int | None,
    *,
    host: str = "127.0.0.1",
    port: int = 8080,
    defaults: Sampling | None = None,
    max_tokens: int = MAX_TOKENS,
    api_key: str | None = None,
    template_kwargs: dict | None = None,
    client_connections: int | None = None,
) -> None:
    """Answer requests with `engine` (open_engine's; rank 0's under an expert-parallel group),
    its model served as `name` (whatever name a request gives), until interrupted; with
    `api_key`, only to requests that carry it; `template_kwargs`: the chat template's variables
    where a request's chat_template_kwargs leaves them out; `client_connections`: the most one
    client address holds open (None: the server's share, 0: no limit of its own). The engine is
    closed at the end, whatever ends it (under a group that tells the other ranks to stop)."""
    from .app import App

    app = App(engine, name, defaults or Sampling(), max_tokens, context, api_key, template_kwargs)
    try:
        httpd = listening(host, port)
        httpd.app = app
        if client_connections is not None:
            httpd.share_per_client(client_connections)
        if api_key is None and not _loopback(host):
            print(
                f"[serve] {host} is reachable from other machines and no --api-key is set: "
                "anyone who reaches the port can use the model",
                file=sys.stderr,
            )
        print(
            f"[serve] {name}: listening on http://{host}:{httpd.server_port}/v1",
            file=sys.stderr,
            flush=True,
        )
        try:
            httpd.serve_forever()
        finally:
            httpd.server_close()
    finally:
        engine.close()


def listening(host: str, port: int):
    """The server's socket, bound to host:port and listening, or why not in one line."""
    from ..errors import StreamerError
    from .http import Handler, Server

    try:
        return Server((host, port), Handler)
    except OSError as e:
        fix = (
            "another process listens there: stop it, or give another --port (0: any free one)"
            if e.errno == errno.EADDRINUSE
            else "check --host and --port"
        )
        raise StreamerError(f"cannot listen on {host}:{port}: {e.strerror or e}; {fix}.") from None


def check_listening(host: str, port: int) -> None:
    """Whether the server could listen on host:port, said before the model loads (minutes for a
    large one) rather than after: the address is taken and given back at once."""
    listening(host, port).server_close()


def _loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False
