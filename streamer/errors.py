"""The one exception type users see: every message names the file or tensor at fault and what
to do."""


class StreamerError(Exception):
    """A problem with the user's input, checkpoint or repacked folder, explained in the message."""


def one_line(error: object, limit: int = 300) -> str:
    """A foreign exception's message as one line (libraries' messages span lines), shortened."""
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
