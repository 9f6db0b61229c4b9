"""`streamer chat`'s options and start: the model loaded behind the server's engine, then the
conversation (chat.py, imported once the flags are checked: it imports mlx-lm's generate)."""

from __future__ import annotations

import argparse
import sys

from ..defaults import MAX_TOKENS
from ..errors import StreamerError
from ..progress import PrefillProgress
from .drafting import add_drafting, check_drafting, draft_options
from .interrupts import raising_on_ctrl_c
from .kv_options import (
    add_kv_cache,
    add_max_kv_size,
    add_prompt_cache_dir,
    check_kv_fits,
    disk_option,
    kv_options,
)
from .options import (
    add_loading,
    add_model,
    add_prefill_step_size,
    add_sampling,
    add_template,
    check_sampling_flags,
    load_options,
    model_folder,
    prefill_option,
)
from .prompt_text import CLOSED_STDIN, check_template_flags, no_prompt_flags, text_flags
from .serve import same_settings


def add_parser(sub) -> None:
    p = sub.add_parser(
        "chat",
        help="a conversation in the terminal with a repacked model or an MLX download",
        not_taken=no_prompt_flags("chat"),
    )
    add_model(p)
    p.add_argument(
        "--max-tokens", "-m", type=int, default=MAX_TOKENS, help="per answer"
    )  # mlx_lm.chat's -m
    add_sampling(p)
    add_template(p)
    add_prompt_cache_dir(p)
    add_prefill_step_size(p)
    add_max_kv_size(p)
    add_kv_cache(p)
    add_drafting(p)
    add_loading(p)
    p.set_defaults(run=chat)


def chat(args: argparse.Namespace) -> None:
    if sys.stdin is None:
        raise StreamerError(CLOSED_STDIN.format("chat reads the conversation"))
    if hasattr(sys.stdin, "reconfigure"):  # a text stream: a line not UTF-8 refused, not fatal
        sys.stdin.reconfigure(errors="surrogateescape")
    text_flags(args)
    check_template_flags(args, ("--chat-template-config",))  # a system prompt is text without one
    check_sampling_flags(args)
    options = {**kv_options(args), **prefill_option(args)}
    check_drafting(args)
    from ..parallel.group import launched_group
    from ..server import open_engine, open_model
    from ..server.api import Sampling

    group = args.group = launched_group()  # started by mlx.launch: rank 0 talks
    disk = disk_option(args, group)
    loading = load_options(args, group)
    model, tokenizer, context = open_model(model_folder(args, group), loading)
    from .chat import (  # after a refusal
        chat,
        check_system_message,
        check_template,
        check_template_variables,
    )

    if tokenizer.has_chat_template and not args.ignore_chat_template:
        check_template(tokenizer, context, args.model)
        check_system_message(tokenizer, args.system_prompt)
        check_template_variables(tokenizer, args.chat_template_config, "--chat-template-config")
    check_template_flags(args, ("--chat-template-config",), tokenizer.has_chat_template)

    check_kv_fits(model, options)
    options.update(draft_options(args, model, tokenizer))
    options["prompt_progress_callback"] = PrefillProgress()  # a bar while a turn prefills
    same_settings(args, model)
    engine = open_engine(model, tokenizer, 2, group, options, disk)
    if group is not None and group.rank() != 0:
        return engine.follow()
    template = tokenizer.has_chat_template and not args.ignore_chat_template
    if not tokenizer.has_chat_template:
        print(
            "[chat] the model has no chat template: the conversation is plain text", file=sys.stderr
        )
    sampling = Sampling(
        temperature=args.temp, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p, seed=args.seed
    )
    try:
        with raising_on_ctrl_c():  # Ctrl-C stops an answer; at the prompt it ends the chat
            chat(
                engine,
                system_prompt=args.system_prompt,
                template=template,
                template_variables=args.chat_template_config,
                max_tokens=args.max_tokens,
                context=context,
                sampling=sampling,
            )
    finally:
        engine.close()
