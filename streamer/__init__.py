"""streamer: run MoE language models larger than RAM by streaming their experts from SSD."""

from .errors import StreamerError
from .generate import Response, RunStats, generate, stream_generate
from .model import load

__all__ = ["StreamerError", "Response", "RunStats", "generate", "load", "stream_generate"]
