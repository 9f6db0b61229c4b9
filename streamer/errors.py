"""The one exception type users see: every message names the file or tensor at fault and what
to do."""


class StreamerError(Exception):
    """A problem with the user's input, checkpoint or repacked folder, explained in the message.
    `flags`: the message as the command line says it, where it names an argument that the Python
    API spells otherwise (`--dtype float32` for `dtype='float32'`); the CLI prints that one."""

    def __init__(self, message: str = "", flags: str | None = None):
        super().__init__(message)
        self.flags = flags


def one_line(error: object, limit: int = 300) -> str:
    """A foreign exception's message as one line (libraries' messages span lines), shortened."""
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
