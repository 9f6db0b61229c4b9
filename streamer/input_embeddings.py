"""The `input_embeddings` keyword checked against the model it is given to, before mlx-lm reads
it: an int was a TypeError in mlx-lm's generate_step (`len()`), an array of another width a
ValueError from MLX's rms_norm in the first layer."""

from __future__ import annotations

import inspect

import mlx.core as mx
import mlx.nn as nn

from .errors import ArgumentError

# What mlx-lm's models name their token embedding (Gemma 4's embed_tokens_per_layer and GPT-2's
# position table, other widths, are not these)
TOKEN_EMBEDDINGS = {"embed_tokens", "wte", "word_embeddings", "embeddings", "tok_embeddings"}


def embedding_width(model: nn.Module) -> int | None:
    """The width of the vectors `model`'s token embedding gives its first layer (its hidden
    size), quantized or not; None where it has none by those names."""
    for path, module in model.named_modules():
        if path.rpartition(".")[2] not in TOKEN_EMBEDDINGS:
            continue
        if isinstance(module, nn.QuantizedEmbedding):
            return module.dims
        if isinstance(module, nn.Embedding):
            return module.weight.shape[1]
    return None


def check_input_embeddings(model: nn.Module, value: object, prompt_tokens: int) -> None:
    """`value` (None: not given) as mlx-lm's models take it: one vector a prompt token, each as
    wide as the model's embedding makes them; with no prompt tokens, in place of the prompt."""
    if value is None:
        return
    if "input_embeddings" not in inspect.signature(model.__call__).parameters:
        raise ArgumentError(  # mlx-lm's own test, else its ValueError mid-call
            f"input_embeddings: this model ({type(model).__module__.rpartition('.')[2]} in "
            "mlx-lm) takes no embeddings in place of tokens; give the prompt alone."
        )
    width = embedding_width(model)
    shape = f"({prompt_tokens or 'n'}, {width if width is not None else 'hidden size'})"
    if not isinstance(value, mx.array) or value.ndim != 2:
        got = f"an array of shape {value.shape}" if isinstance(value, mx.array) else repr(value)
        raise ArgumentError(
            f"input_embeddings must be an mx.array of shape {shape}, one vector a prompt token "
            f"(got {got:.60})."
        )
    rows = prompt_tokens or max(value.shape[0], 1)  # no prompt: at least one vector
    if value.shape[0] != rows or (width is not None and value.shape[1] != width):
        raise ArgumentError(
            f"input_embeddings has shape {value.shape}, but this model takes {shape}: one vector "
            f"a prompt token ({prompt_tokens or 'n'}), each as wide as its embedding's ({width})."
        )
