"""streamer: run MoE language models larger than RAM by streaming their experts from SSD."""

from .errors import StreamerError
from .model import load

__all__ = ["StreamerError", "load"]
