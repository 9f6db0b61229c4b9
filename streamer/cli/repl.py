"""The chat's input, read as a REPL reads it: line editing and history (readline) on a terminal,
`/commands`, and messages of several lines between two lines of `\"\"\"` (as Ollama's)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TextIO

from ..errors import StreamerError
from ..io.checksums import cache_dir
from .prompt_text import UNREADABLE_STDIN

BLOCK = '"""'
COMMANDS = {
    "/help": "this list",
    "/reset": "start the conversation over (also /clear)",
    "/stats": "the last answer's figures",
    "/quit": "end the chat (also /exit, /bye, or Ctrl-D)",
}
# other spellings: /bye and /clear are Ollama's (`ollama run`), /? its help too
ALIASES = {"/exit": "/quit", "/bye": "/quit", "/clear": "/reset", "/?": "/help"}
HELP = (
    "; ".join(f"{name} {what}" for name, what in COMMANDS.items())
    + f". A message of several lines goes between two lines of {BLOCK}; a message that starts "
    "with / is typed as //..."
)
HISTORY_LINES = 1000


class Reader:
    """Lines typed at the prompt. On a terminal (stdin and stdout both) through `input()` with
    readline loaded: the line can be edited, earlier lines come back with the arrow keys, and
    they are kept in the user's cache folder for the next chat. Otherwise a plain readline of
    `stdin`, the prompt on stderr (stdout holds only the answers)."""

    def __init__(self, stdin: TextIO, stderr: TextIO):
        self.stdin, self.stderr = stdin, stderr
        self.readline = None
        if stdin is sys.stdin and stdin.isatty() and sys.stdout.isatty():
            try:
                import readline
            except ImportError:  # Python built without it (some Windows, some minimal builds)
                readline = None
            self.readline = readline
            self.history = cache_dir() / "chat_history"
            self._load_history()

    def line(self, prompt: str) -> str | None:
        """One line without its newline; None at the end of input (Ctrl-D), after a newline so
        that what follows starts on a line of its own."""
        if self.readline is not None:
            try:
                return input(prompt)
            except EOFError:
                print(file=sys.stdout, flush=True)
                return None
        print(prompt, end="", file=self.stderr, flush=True)
        try:
            line = self.stdin.readline()
        except OSError as e:
            print(file=self.stderr, flush=True)  # the error's line after the prompt's
            raise StreamerError(
                UNREADABLE_STDIN.format("chat reads the conversation", e.strerror)
            ) from None
        if not line:
            print(file=self.stderr, flush=True)
            return None
        return line.removesuffix("\n")

    def message(self) -> str | None:
        """What the user typed: one line, or the lines between two lines of three quotes."""
        line = self.line(">> ")
        if line is None or line.strip() != BLOCK:
            return line
        lines = []
        while (line := self.line(".. ")) is not None and line.strip() != BLOCK:
            lines.append(line)
        return "\n".join(lines)

    def close(self) -> None:
        if self.readline is None:
            return
        try:
            self.history.parent.mkdir(parents=True, exist_ok=True)
            self.readline.set_history_length(HISTORY_LINES)
            self.readline.write_history_file(self.history)
        except OSError:
            pass  # a read-only home: the history is this session's only

    def _load_history(self) -> None:
        try:
            self.readline.read_history_file(Path(self.history))
        except OSError:
            pass  # no history yet


def not_text(text: str) -> str | None:
    """Why a line read with surrogate escapes (the chat's stdin) is not UTF-8 text, in words;
    None if it is."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        char = ord(text[e.start])
        what = f"byte 0x{char - 0xDC00:02x}" if 0xDC80 <= char <= 0xDCFF else repr(text[e.start])
        return (
            f"the message is not valid UTF-8 ({what} at character {e.start}), not sent: check "
            "the terminal's or the file's encoding"
        )
    return None


def command(text: str) -> tuple[str | None, str]:
    """(the command, "") for a line that is one, else (None, the message): `//...` is a message
    that starts with `/`; an unknown `/word` is ("?", the line): refused, not sent."""
    stripped = text.strip()
    if stripped.startswith("//"):
        return None, text.replace("//", "/", 1)
    if not stripped.startswith("/") or "\n" in stripped:
        return None, text
    name = ALIASES.get(stripped.split()[0], stripped.split()[0])
    return (name, "") if name in COMMANDS else ("?", stripped)
