"""The prompt and other text flags, read as UTF-8 text (from the arguments' bytes or stdin's)
and checked before the model is loaded."""

from __future__ import annotations

import argparse
import os
import sys

from ..arguments import check_request
from ..errors import StreamerError
from .input_relay import INPUT_ENDS
from .options import check_sampling_flags

EXAMPLE = '{"enable_thinking": false}'  # a template variable, in the refusals
CLOSED_STDIN = "{} from standard input, which is closed: give it a file or a pipe (`< FILE`)."
# where chat's and serve's prompts come from, said to generate's --prompt and -p given to them
PROMPTS_COME = {
    "chat": "type each message at its >> prompt, or pipe them in (`echo hi | streamer chat "
    "--model M`); `streamer generate --prompt` answers one",
    "serve": "each request carries its own",
}
# opened only for writing (`0>FILE`) or failing to read: the read's OSError was a traceback
UNREADABLE_STDIN = (
    "{} from standard input, which cannot be read ({}): give it a file or a pipe (`< FILE`)."
)


def prompt(args: argparse.Namespace) -> str:
    """The prompt as UTF-8 text, from --prompt or (with `--prompt -`) from stdin's bytes.

    Arguments reach Python as text decoded with surrogate escapes; os.fsencode recovers the bytes
    the shell passed, so invalid UTF-8 is reported here instead of failing inside the tokenizer.
    An empty prompt or a --max-tokens below 1 (but -1, mlx-lm's no limit) is refused before the
    model is loaded.
    """
    if args.prompt == "-" and sys.stdin is None:
        raise StreamerError(CLOSED_STDIN.format("--prompt - reads the prompt"))
    if args.prompt == "-" and _input_never_ends():
        raise StreamerError(
            "--prompt - reads standard input to its end, which never comes under mlx.launch "
            "(it does not pass the end on), nor on another host than streamer launch's: give "
            'the prompt as --prompt "$(cat FILE)".'
        )
    try:
        raw = sys.stdin.buffer.read() if args.prompt == "-" else os.fsencode(args.prompt)
    except OSError as e:
        what = UNREADABLE_STDIN.format("--prompt - reads the prompt", e.strerror)
        raise StreamerError(what) from None
    text = _utf8(raw, "the prompt")
    if args.prompt != "-":  # typed `\n` and `\t` are a newline and a tab, as mlx_lm.generate reads
        text = text.replace("\\n", "\n").replace("\\t", "\t")
    check_sampling_flags(args, no_limit=True)
    how = " with --prompt (or `--prompt -` for stdin)"
    check_request(text, args.max_tokens, option="--max-tokens", how=how)
    return text


def _input_never_ends() -> bool:
    """A rank of mlx.launch (mlx 0.32.4 relays input, never its end) or one on another host than
    streamer launch's (its input is the terminal `ssh -tt` opens there): input_relay.py."""
    launched = any(v in os.environ for v in ("MLX_RANK", "MLX_WORLD_SIZE"))
    return launched and INPUT_ENDS not in os.environ


def text_flags(args: argparse.Namespace) -> None:
    """--system-prompt and --extra-eos-token checked as the prompt is: bytes that are not UTF-8
    reached the template as lone surrogates (a traceback in the tokenizer, or every chat turn
    refused), and the tokenizer, after loading, as "surrogates not allowed"."""
    if args.system_prompt is not None:
        _utf8(os.fsencode(args.system_prompt), "--system-prompt")
    for token in getattr(args, "extra_eos_token", []):
        _utf8(os.fsencode(token), "--extra-eos-token")
    if args.chat_template_config is not None:
        args.chat_template_config = template_variables(
            args.chat_template_config, "--chat-template-config"
        )


def template_variables(text: str, option: str) -> dict:
    """The JSON object `option` gives (--chat-template-config, --chat-template-args): the
    template's own variables, never apply_chat_template's arguments (which would change what it
    returns)."""
    from ..io.json_file import parse_json
    from ..server.messages import TEMPLATE_ARGUMENTS

    variables = parse_json(os.fsencode(text), option, f"give an object such as {EXAMPLE}.")
    if not isinstance(variables, dict):
        raise StreamerError(f"{option} must be a JSON object such as {EXAMPLE} (got {text}).")
    clash = sorted(TEMPLATE_ARGUMENTS.intersection(variables))
    if clash:
        raise StreamerError(
            f"{option}: {', '.join(clash)} is apply_chat_template's own argument, not a variable "
            "of the template: leave it out."
        )
    return variables


def _utf8(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise StreamerError(
            f"{what} is not valid UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start}): "
            "pass UTF-8 text (check the file's or terminal's encoding)."
        ) from None


def check_template_flags(
    args: argparse.Namespace, flags: tuple[str, ...], has_template: bool | None = None
) -> None:
    """Refuse `flags` that only the chat template reads where none is applied, rather than drop
    them without a word: with --ignore-chat-template (before the load) or for a model without one
    (`has_template` False, after it)."""
    given = [flag for flag in flags if getattr(args, flag[2:].replace("-", "_")) is not None]
    if given and args.ignore_chat_template:
        raise StreamerError(
            f"{given[0]} goes into the chat template, which --ignore-chat-template leaves out: "
            "drop one of them."
        )
    if given and has_template is False:
        raise StreamerError(
            f"{given[0]}: {args.model} has no chat template to put it in (tokenizer_config.json "
            "has no chat_template): leave it out."
        )


def no_prompt_flags(command: str) -> dict[str, str]:
    """The parser's `not_taken` of a command that takes its prompts otherwise than generate."""
    return dict.fromkeys(("--prompt", "-p"), f"{command} takes no prompt: {PROMPTS_COME[command]}")
