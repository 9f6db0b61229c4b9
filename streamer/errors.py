"""The one exception type users see: every message names the file or tensor at fault and what to do."""


class StreamerError(Exception):
    """A problem with the user's input, checkpoint or repacked folder, explained in the message."""
