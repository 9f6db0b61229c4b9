"""`streamer generate`: one answer from a streamed model, printed as it is made."""

from __future__ import annotations

import argparse
import sys

from .. import __version__
from ..arguments import check_token_ids, vocabulary
from ..defaults import PREFILL_STEP
from ..errors import StreamerError
from ..progress import PrefillProgress
from .drafting import add_drafting, check_drafting, draft_options
from .interrupts import raising_on_ctrl_c, status_of
from .kv_options import add_kv_cache, add_max_kv_size, check_kv_fits, kv_options
from .options import (
    add_loading,
    add_model,
    add_prefill_step_size,
    add_prompt,
    add_template,
    load_options,
    model_folder,
    prefill_option,
)
from .output import emit
from .prompt_text import check_template_flags, prompt, text_flags

TEMPLATE_FLAGS = ("--system-prompt", "--chat-template-config")  # read by the chat template alone


def add_parser(sub) -> None:
    p = sub.add_parser(
        "generate", help="generate text from a repacked model or an MLX download (in place)"
    )
    add_model(p)
    add_prompt(p, None)
    p.add_argument(
        "--chat",
        action="store_true",
        help="the prompt is a chat message: refuse a model without a chat template",
    )
    add_template(p)
    add_max_kv_size(p)
    p.add_argument(
        "--extra-eos-token",
        nargs="+",
        default=[],
        metavar="TOKEN",
        help="more tokens that end the answer (text or id)",
    )
    add_prefill_step_size(p)
    p.add_argument(
        "--verbose",
        type=lambda text: text.lower() not in ("false", "f"),  # mlx_lm.generate's str2bool
        default=True,
        metavar="BOOL",
        help="False: the answer alone, without the residency and stats lines (as mlx_lm.generate)",
    )
    add_kv_cache(p)
    add_drafting(p)
    add_loading(p)
    p.set_defaults(run=generate)


def generate(args: argparse.Namespace) -> int:
    text = prompt(args)  # before the slow imports: bad input fails fast
    text_flags(args)
    if args.chat and args.ignore_chat_template:
        raise StreamerError(
            "--chat asks for the chat template and --ignore-chat-template for none: pass one."
        )
    check_template_flags(args, TEMPLATE_FLAGS)
    prefill_option(args)
    kv_options(args)
    check_drafting(args)
    from ..loading.load import load_decided
    from ..parallel.agreement import check_same_settings, command_settings
    from ..parallel.group import launched_group, shared_seed

    group = args.group = launched_group()  # started by mlx.launch: expert-parallel
    rank = group.rank() if group else 0
    options = load_options(args, group)
    model, tokenizer = load_decided(model_folder(args, group), options)
    if rank == 0 and args.verbose:
        print(f"[streamer] {model.streamer.residency}", file=sys.stderr)
    if group is not None and rank == 0 and args.verbose:
        print(
            f"[streamer] expert-parallel over {group.size()} ranks: each computes its share of "
            "every MoE layer's routed experts",
            file=sys.stderr,
        )
    args.drafting = draft_options(args, model, tokenizer)
    for token in args.extra_eos_token:
        if _integer(token):  # an id, as mlx-lm's add_eos_token reads one
            check_token_ids([int(token)], "--extra-eos-token", vocabulary(tokenizer))
        try:
            tokenizer.add_eos_token(token)
        except ValueError as e:
            raise StreamerError(f"--extra-eos-token: {e}") from None
    if args.chat and not tokenizer.has_chat_template:
        raise StreamerError(
            f"--chat: {args.model} has no chat template (tokenizer_config.json has no "
            "chat_template): drop --chat to continue the prompt as plain text."
        )
    check_template_flags(args, TEMPLATE_FLAGS, tokenizer.has_chat_template)
    if tokenizer.has_chat_template and not args.ignore_chat_template:
        from .chat import check_system_message, check_template_variables, template_fails, templated

        check_system_message(tokenizer, args.system_prompt)
        check_template_variables(tokenizer, args.chat_template_config, "--chat-template-config")
        variables, context = args.chat_template_config, model.streamer.context_length
        try:
            text = templated(tokenizer, text, args.system_prompt, variables, context)
        except StreamerError:  # past its bounds (server/template_bounds.py): said as it is
            raise
        except Exception as e:  # jinja2's errors, or whatever the template raises
            raise template_fails(args.model, e) from e
        if not text:  # refused as "the prompt is empty", which it was not
            raise template_fails(args.model, "it renders the prompt as nothing")
    if group is not None:  # every rank must compute the same tokens (its tokenizer's own too)
        computed = {
            "the templated prompt": text,
            "the prompt's token ids": tokenizer.encode(text),
            "the end-of-text token ids": sorted(tokenizer.eos_token_ids),
        }
        check_same_settings(group, command_settings(args, model, __version__, **computed))
        args.seed = shared_seed(group, args.seed)
    return stream(model, tokenizer, text, args)


def _integer(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def stream(model, tokenizer, prompt: str, args: argparse.Namespace) -> int:
    """Print the answer as it comes, then the run's stats line; Ctrl-C ends it with 130 (SIGTERM
    with 143)."""
    from ..generate import stream_generate
    from ..run_stats import run_stats, settled

    group = getattr(args, "group", None)
    shown = group is None or group.rank() == 0  # rank 0 prints for the group
    stats = None
    drafting = getattr(args, "drafting", {})  # `streamer demo` has no drafting flags
    progress = PrefillProgress()  # a bar while a long prompt prefills, drafting or not
    prefill = {"prompt_progress_callback": progress} if shown else {}
    kv = kv_options(args) if hasattr(args, "kv_bits") else {}
    check_kv_fits(model, kv)
    try:
        with raising_on_ctrl_c():  # from here Ctrl-C stops the answer, with its stats
            for response in stream_generate(
                model,
                tokenizer,
                prompt,
                args.max_tokens,
                temp=args.temp,
                top_p=args.top_p,
                top_k=args.top_k,
                min_p=args.min_p,
                seed=args.seed,
                prefill_step_size=getattr(args, "prefill_step_size", PREFILL_STEP),  # demo: none
                **kv,
                **drafting,
                **prefill,
            ):
                if shown:
                    emit(response.text, end="")
                stats = response.stats
    except KeyboardInterrupt as e:
        progress.close()
        if shown:
            print("\n[interrupted]", file=sys.stderr)
            print((settled(model, stats) if stats else run_stats(model)).line(), file=sys.stderr)
        return status_of(e)
    line = stats.line() if stats is not None else None
    if group is not None and stats is not None:
        from ..parallel.group import group_stats_line

        line = f"{line} | {group_stats_line(group, model, stats)}"  # every rank takes part
    if shown:
        emit()
        if line is not None and getattr(args, "verbose", True):  # demo has no --verbose
            print(line, file=sys.stderr)
    return 0
