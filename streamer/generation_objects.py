"""mlx-lm's generation arguments that take objects (the tokenizer, functions, caches, a stream),
refused by name rather than as a TypeError or AttributeError deep in its loop."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.tokenizer_utils import TokenizerWrapper
from transformers import PreTrainedTokenizerBase

from .errors import ArgumentError
from .input_embeddings import check_input_embeddings
from .kv_quantization import check_prompt_cache

_STREAMS = (mx.Stream, mx.ThreadLocalStream, mx.Device, mx.DeviceType)


def check_tokenizer(tokenizer: object) -> None:
    """The tokenizer streamer.load returned, or a transformers tokenizer (mlx-lm wraps one); None
    or another object was an AttributeError ('NoneType' object has no attribute 'bos_token')."""
    if not isinstance(tokenizer, (TokenizerWrapper, PreTrainedTokenizerBase)):
        raise ArgumentError(
            "tokenizer must be the one streamer.load returned with the model "
            f"(got a {type(tokenizer).__name__})."
        )


def check_objects(model: nn.Module, kwargs: dict, prompt_tokens: int) -> None:
    """Functions (or None), logits_processors a list of them, prompt_cache one cache a layer (as
    make_prompt_cache makes), stream an MLX stream or device this MLX has, input_embeddings a
    vector a prompt token."""
    check_input_embeddings(model, kwargs.get("input_embeddings"), prompt_tokens)
    for name in ("sampler", "prompt_progress_callback"):
        if kwargs.get(name) is not None and not callable(kwargs[name]):
            raise ArgumentError(f"{name} must be a function or None (got {kwargs[name]!r:.60}).")
    processors = kwargs.get("logits_processors")
    if processors is not None and not (
        isinstance(processors, (list, tuple)) and all(map(callable, processors))
    ):
        raise ArgumentError(
            "logits_processors must be a list of functions (tokens, logits) -> logits, or None "
            f"(got {processors!r:.60})."
        )
    if kwargs.get("prompt_cache") is not None:
        check_prompt_cache(model, kwargs["prompt_cache"])
    if "stream" in kwargs:
        _check_stream(kwargs["stream"])


def _check_stream(stream: object) -> None:
    """An MLX stream, or a device this MLX has: mx.gpu without a GPU backend was MLX's
    ValueError ([default_stream] Cannot get gpu stream without gpu backend) from the loop."""
    if not isinstance(stream, _STREAMS):
        raise ArgumentError(
            f"stream must be an MLX stream or device, such as mx.cpu (got {stream!r:.60})."
        )
    if isinstance(stream, (mx.Device, mx.DeviceType)) and not mx.is_available(stream):
        raise ArgumentError(
            f"stream {stream}: this MLX has no such device; use mx.cpu or leave stream out."
        )
