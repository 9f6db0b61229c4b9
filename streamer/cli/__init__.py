"""`streamer` command line: one module per command; this one parses and dispatches."""

from __future__ import annotations

import argparse
import difflib
import errno
import re
import sys
import time

from .. import __version__
from ..errors import StreamerError
from . import chat_command, demo, generate, info, launch, plan, pull, repack, serve, verify
from .demo import DEMO_MODEL
from .interrupts import exiting_on_ctrl_c, interrupt_in, interrupted_status
from .mlx_lm_flags import mlx_lm_only
from .output import (
    OutputFailed,
    emit,
    error_line,
    report,
    set_up_output,
    silence_output,
)

__all__ = ["DEMO_MODEL", "main", "parser"]

NO_MODEL = (
    "repack a downloaded MoE checkpoint with `streamer repack SRC DST` and pass --model DST, or "
    "run `streamer demo` to see the whole pipeline on a built-in model"
)
SIZE_UNIT = re.compile(r"[KMGT]i?B?$", re.IGNORECASE)  # what follows a size's number
# Other tools' commands for what a streamer command does (mlx_lm.convert, `ollama run`, `ollama
# show`, `lms get`): typed by their users, they get ours as a did-you-mean
THEIR_COMMANDS = {"convert": "repack", "run": "chat", "show": "info", "get": "pull"}


class DefaultsShown(argparse.HelpFormatter):
    """Help that ends with an option's default where it has one worth saying (not a flag's False,
    not None: those help texts say what happens without them)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        unsaid = (
            default is None or default is False or default == [] or default == argparse.SUPPRESS
        )
        if "default" in text or unsaid or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)" if text else "default: %(default)s"


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose errors are the one line every other error is (`streamer: error:
    ...`, exit 2), with where to look instead of the usage block. Its subcommands' parsers are
    of this class too (add_subparsers makes its parent's class), help showing defaults."""

    def __init__(self, *args, not_taken: dict[str, str] | None = None, **kwargs):
        kwargs.setdefault("formatter_class", DefaultsShown)
        super().__init__(*args, **kwargs)
        self._words: list[str] = []
        # options another command takes that this one refuses with why (chat's --prompt):
        # argparse said "ambiguous option" where they begin longer options of this one
        self._not_taken = not_taken or {}

    def parse_known_args(self, args=None, namespace=None):
        self._words = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def parse_args(self, args=None, namespace=None):
        # an unknown option after a complete command is the subcommand's to report (argparse's
        # top parser said it, pointing to `streamer --help`, without a did-you-mean)
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            commands = self._subparsers._group_actions[0].choices if self._subparsers else {}
            command = commands.get(getattr(parsed, "command", None), self)
            command.error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed

    def error(self, message: str):
        words = [w.split("=", 1)[0] for w in self._words[: _end(self._words)]]
        taken_elsewhere = [self._not_taken[w] for w in words if w in self._not_taken]
        if taken_elsewhere:
            raise StreamerError(f"{taken_elsewhere[0]} (see `{self.prog} --help`)")
        if message.startswith("argument command: invalid choice: "):
            message += self._command_meant(message.split("'")[1])
        # argparse finds a required option missing before it reports an unknown one: `--promt
        # hi` said "--prompt is required", hiding the typo
        unknown = [w for w in self._words[: _end(self._words)] if self._unknown_option(w)]
        if unknown and message.startswith(("the following arguments are required", "unrec")):
            message = f"unrecognized arguments: {' '.join(unknown)}"
            close = difflib.get_close_matches(unknown[0].split("=")[0], self._option_names(), 1)
            message += f" (did you mean {close[0]}?)" if close else ""
            message = mlx_lm_only(unknown[0]) or message
        if message.startswith("unrecognized arguments: "):
            message += self._size_in_two_words(message.split()[2])
        if " has no unit, so it counts bytes" in message:  # arguments.parse_size's
            message += self._size_in_two_words()
        if message.endswith(": expected one argument"):
            message += self._value_taken_for_an_option(message)
        if message.startswith("the following arguments are required") and "--model" in message:
            first = self._words[0] if self._words else "-"  # `chat MODEL`, as `ollama run MODEL`
            given = f"give the model as --model {first}" if first[:1] != "-" else NO_MODEL
            message += f" ({given})"
        raise StreamerError(f"{message} (see `{self.prog} --help`)")

    def _command_meant(self, typed: str) -> str:
        commands = list(self._subparsers._group_actions[0].choices)
        close = difflib.get_close_matches(typed, commands, 1) or [THEIR_COMMANDS.get(typed)]
        return f" (did you mean {close[0]}?)" if close[0] else ""

    def _size_in_two_words(self, extra: str | None = None) -> str:
        """`--memory-budget 8 GB`, as sizes are written in prose: argparse left the unit over
        (`extra`), or refused the number alone as bytes (None: any unit that follows it)."""
        words = self._words[: _end(self._words)]
        for option, number, unit in zip(words, words[1:], words[2:]):
            action = self._option_string_actions.get(option)
            sized = action and action.metavar == "SIZE"
            if sized and extra in (None, unit) and SIZE_UNIT.match(unit):
                return f" (write the size as one word: {option} {number}{unit})"
        return ""

    def _value_taken_for_an_option(self, message: str) -> str:
        """argparse takes a value that begins with '-' (`--memory-budget -1G`) for an option and
        says none was given: show how to give it."""
        option = message.split(":")[0].split()[-1].split("/")[-1]
        words = self._words[: _end(self._words)]
        for word, value in zip(words, words[1:]):
            if word == option and self._unknown_option(value):
                theirs = mlx_lm_only(value)  # `--quantize --q-bits 4`, as mlx_lm.convert's
                return (
                    f": {theirs}"
                    if theirs
                    else f": {value!r} was read as an option; write {option}={value}"
                )
        return ""

    def _option_names(self) -> list[str]:
        return [name for name in self._option_string_actions if name.startswith("--")]

    def _unknown_option(self, word: str) -> bool:
        """Whether `word` is an option this parser has no use for (not a value: "-", "-5")."""
        if not word.startswith("-") or word == "-" or self._negative_number_matcher.match(word):
            return False
        name = word.split("=", 1)[0]
        known = self._option_string_actions
        return name not in known and not (
            self.allow_abbrev and name.startswith("--") and any(k.startswith(name) for k in known)
        )


def _end(words: list[str]) -> int:
    """Where the options end: at `--`, after which every word is a value."""
    return words.index("--") if "--" in words else len(words)


def parser() -> argparse.ArgumentParser:
    ap = Parser(
        prog="streamer", description="Run MoE LLMs larger than RAM by streaming experts from SSD."
    )
    ap.add_argument("--version", action="version", version=f"streamer {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)
    # in the order a first run takes them (the README's), then the rest
    demo.add_parser(sub)
    plan.add_parser(sub)
    pull.add_parser(sub)
    generate.add_parser(sub)
    chat_command.add_parser(sub)
    serve.add_parser(sub)
    repack.add_parsers(sub)
    info.add_parser(sub)
    verify.add_parser(sub)
    launch.add_parser(sub)  # last: it knows the other commands' names
    for summary in sub._choices_actions:  # a command's --help opens with what it does
        command = sub.choices[summary.dest]
        command.description = command.description or summary.help
    return ap


# How long the other ranks wait before ending on a fault rank 0 says for the group: a rank that
# ended first would have the launcher stop rank 0 before it said why (it finds the fault at the
# same collective, milliseconds apart); the launcher stops them once rank 0 has ended.
RANK_0_SAYS_SECONDS = 5


def main(argv: list[str] | None = None) -> int:
    """Run one command; errors are one line on stderr (exit 2), Ctrl-C exits 130 at any point
    (SIGTERM 143, SIGHUP 129),
    and a closed or full output ends quietly, as Unix tools end."""
    # called as the program (no argv given), a Ctrl-C once the command is done is ignored; in a
    # process that goes on, the caller's handler comes back
    if argv is None:  # the program: its output is its own to set up
        set_up_output()
    with exiting_on_ctrl_c(restore=argv is not None):
        return _run(argv)


def _run(argv: list[str] | None) -> int:
    args = None
    try:
        if not (sys.argv[1:] if argv is None else argv):  # `streamer` alone: what --help says
            emit(parser().format_help().rstrip())
            return 0
        args = parser().parse_args(argv)
        return args.run(args) or 0
    except StreamerError as e:
        if getattr(args, "group", None) is not None:  # rank 0 is told which rank failed, and why
            from ..parallel.group import tell_failure

            tell_failure(args.group, e)
        line = error_line(args, e)
        if not line:  # a fault every rank found, which rank 0 says: leave it the time to
            time.sleep(RANK_0_SAYS_SECONDS)
            return 2
        return report(line, 2)
    except RuntimeError as e:  # under mlx.launch, a rank that ended fails the others' collectives
        if getattr(args, "group", None) is None:
            raise
        from ..parallel.group import peer_gone

        gone = peer_gone(e)
        if gone is None:
            raise
        line = error_line(args, gone)
        return report(line, 2) if line else 2
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM/SIGHUP (interrupts.Terminated)
        return interrupted_status(e)
    except ImportError as e:
        interrupt = interrupt_in(e)
        if interrupt is None:
            raise
        # Ctrl-C while a compiled extension (mlx's) initialises surfaces as its ImportError
        return interrupted_status(interrupt)
    except OutputFailed as e:
        silence_output()  # nothing more can be written there, nor flushed at exit
        if e.error.errno == errno.EPIPE:  # `streamer generate ... | head -c 3`: reader is done
            return 141  # what a shell reports for a tool ended by SIGPIPE
        return report(f"streamer: error: cannot write the output: {e.error.strerror}", 1)
    except BrokenPipeError:  # stderr's reader went away (`2>&1 | head`)
        silence_output()
        return 141
