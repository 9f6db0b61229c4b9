"""The streaming expert layer (layer.py) and its compute modes, one module each."""

from .layer import StreamingExperts
from .mapped import RECHECK_CALLS

__all__ = ["RECHECK_CALLS", "StreamingExperts"]
