"""`streamer serve`: an OpenAI-compatible server (`streamer chat`, which runs the same engine, is
chat_command.py's)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .. import __version__
from ..arguments import check_at_least
from ..defaults import MAX_TOKENS, PROMPT_CACHE_SIZE
from ..errors import StreamerError
from .drafting import add_drafting, check_drafting, draft_options
from .interrupts import end_interrupted, raising_on_ctrl_c
from .kv_options import (
    add_kv_cache,
    add_prompt_cache_dir,
    check_kv_fits,
    disk_option,
    kv_options,
)
from .options import (
    add_loading,
    add_model,
    add_prefill_step_size,
    check_sampling_flags,
    load_options,
    model_folder,
    option_group,
    prefill_option,
    size,
)
from .prompt_text import (
    no_prompt_flags,
    template_variables,
)

API_KEY_ENV = "STREAMER_API_KEY"
# The memory the kept KV caches may take by default, as llama.cpp's server's --cache-ram: their
# number alone (--prompt-cache-size) let ten long conversations' caches outgrow the memory
PROMPT_CACHE_BYTES = "8G"


def add_parser(sub) -> None:
    p = sub.add_parser(
        "serve",
        help="an OpenAI-compatible HTTP server for a streamed model",
        not_taken=no_prompt_flags("serve"),
    )
    add_model(p)
    p.add_argument(
        "--served-model-name",
        metavar="NAME",
        help="the model's name in /v1/models and in answers (default: --model's folder name, or "
        "the org/name given); a request may name any model, or none",
    )
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default: 127.0.0.1, this machine only; 0.0.0.0: every "
        "interface, then set --api-key)",
    )
    p.add_argument(
        "--api-key",
        metavar="KEY",
        help="require `Authorization: Bearer KEY` on every endpoint but /health (default: "
        f"${API_KEY_ENV} if set, else no key; other users of the machine see a flag's value in "
        "`ps`, not the environment's)",
    )
    p.add_argument("--port", type=int, default=8080, help="0: any free port (printed)")
    p.add_argument(
        "--max-client-connections",
        type=int,
        metavar="N",
        help="connections one client address may hold open at once, past which it is answered "
        "429 (default: a quarter of the server's, which are half the open-file limit; it holds a "
        "quarter of the request bodies' bytes too; 0: no limit of its own, as behind a reverse "
        "proxy, where every client has the proxy's address)",
    )
    p.add_argument(
        "--chat-template-args",
        metavar="JSON",
        help="the chat template's variables where a request's chat_template_kwargs does not set "
        "them, as mlx_lm.server's: e.g. '{\"enable_thinking\": false}' (Qwen3: no thinking)",
    )
    unset = p.add_argument_group("a request's defaults")
    unset.add_argument(
        "--max-tokens", type=int, default=MAX_TOKENS, help="when a request sets none"
    )
    unset.add_argument("--temp", type=float, default=0.0, help="when a request sets none")
    unset.add_argument("--top-p", type=float, default=1.0, help="when a request sets none")
    unset.add_argument("--top-k", type=int, default=0, help="when a request sets none (0: off)")
    unset.add_argument("--min-p", type=float, default=0.0, help="when a request sets none (0: off)")
    caches = option_group(p, "prompt caches")
    caches.add_argument(
        "--prompt-cache-size",
        type=int,
        default=PROMPT_CACHE_SIZE,
        metavar="N",
        help="KV caches kept for reuse",
    )
    caches.add_argument(
        "--prompt-cache-bytes",
        type=size,
        default=PROMPT_CACHE_BYTES,
        metavar="SIZE",
        help="at most this much memory for the KV caches kept for reuse, the least recently used "
        f"dropped first (default: {PROMPT_CACHE_BYTES})",
    )
    add_prompt_cache_dir(p)
    add_prefill_step_size(p)
    add_kv_cache(p)
    add_drafting(p)
    add_loading(p)
    p.set_defaults(run=serve)


def serve(args: argparse.Namespace) -> None:
    check_sampling_flags(args)  # the defaults of every request: a bad one would fail them all
    if not 0 <= args.port <= 65535:
        raise StreamerError(f"--port must be from 0 (any free port) to 65535 (got {args.port}).")
    check_at_least(args.prompt_cache_size, "--prompt-cache-size", 0)
    if args.max_client_connections is not None:
        check_at_least(args.max_client_connections, "--max-client-connections", 0)
    options = {**kv_options(args), **prefill_option(args)}
    check_drafting(args)
    if args.served_model_name is not None and not args.served_model_name.strip():
        raise StreamerError("--served-model-name is empty: give a value, or leave the flag out.")
    api_key = api_key_option(args)
    variables = args.chat_template_args
    variables = {} if variables is None else template_variables(variables, "--chat-template-args")
    from ..parallel.group import launched_group
    from ..server import check_listening, open_engine, open_model, serve, start_logging
    from ..server.api import Sampling

    start_logging()
    group = args.group = launched_group()  # started by mlx.launch: rank 0 serves
    disk = disk_option(args, group)
    if group is None or group.rank() == 0:
        check_listening(args.host, args.port)
    loading = load_options(args, group)
    folder = model_folder(args, group)
    model, tokenizer, context = open_model(folder, loading)
    if tokenizer.has_chat_template:
        from .chat import check_template_bounds, check_template_variables

        check_template_bounds(tokenizer, context)
        check_template_variables(tokenizer, variables, "--chat-template-args")
    check_kv_fits(model, options)
    options.update(draft_options(args, model, tokenizer))
    same_settings(args, model)
    engine = open_engine(
        model, tokenizer, args.prompt_cache_size, group, options, disk, args.prompt_cache_bytes
    )
    if group is not None and group.rank() != 0:
        return engine.follow()
    defaults = Sampling(temperature=args.temp, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p)
    try:
        with raising_on_ctrl_c():  # Ctrl-C stops serving: the engine closes, other ranks are told
            serve(
                engine,
                args.served_model_name or served_name(args.model, folder),
                context,
                host=args.host,
                port=args.port,
                defaults=defaults,
                max_tokens=args.max_tokens,
                api_key=api_key,
                template_kwargs=variables,
                client_connections=args.max_client_connections,
            )
    except KeyboardInterrupt as e:  # the generation thread may be mid-answer, in MLX
        end_interrupted(e)


def same_settings(args: argparse.Namespace, model) -> None:
    """Under a group, every rank's options alike (rank 0 sends each request's own)."""
    if args.group is not None:
        from ..parallel.agreement import check_same_settings, command_settings

        check_same_settings(args.group, command_settings(args, model, __version__))


def api_key_option(args: argparse.Namespace) -> str | None:
    """--api-key, else $STREAMER_API_KEY, checked that a client can send it."""
    from ..server.auth import non_ascii_note, usable_key

    key, source = args.api_key, "--api-key"
    if key is None:
        key, source = os.environ.get(API_KEY_ENV), f"${API_KEY_ENV}"
    key = None if key is None else usable_key(key, source)
    note = non_ascii_note(key)
    if note:
        print(note, file=sys.stderr)
    return key


def served_name(given: str, folder: Path) -> str:
    """The name a model is served under by default: the org/name given, else the folder's name
    (rank 0's under mlx.launch, which is the rank that serves)."""
    given = given.replace("{rank}", "0")
    if Path(given) != Path(folder):  # looked up in the hub cache: its snapshot is a hash
        return given
    return os.path.basename(os.path.abspath(given))
