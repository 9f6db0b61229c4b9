"""A prompt cache on disk as a chain of files (disk_cache.py): a file holds the KV of the tokens
after `start` and names the file holding the tokens before, so a conversation's next turn writes
only its new tokens, not the whole conversation again (which made a chat's writes grow with the
square of its length).

mlx-lm's KVCache and QuantizedKVCache keep one key and value a token: a file holds those from
`start` on. Every other cache holds no part a token can be cut from (a RotatingKVCache's window
is rewritten in place, an ArraysCache holds a recurrent layer's state, a ChunkedKVCache drops its
front): each file holds it whole, as it stood at the file's last token. A CacheList is cut member
by member. A chain is read back by joining its files' KV parts, every other cache its last file's.
"""

from __future__ import annotations

import mlx.core as mx
from mlx.utils import tree_map
from mlx_lm.models.cache import CacheList, KVCache, QuantizedKVCache

PER_TOKEN = (KVCache, QuantizedKVCache)  # exact classes: one key and value a token, appendable


def layout(cache: list) -> str:
    """The classes of `cache`'s layers (CacheList's members within): a file continues only a
    file of the same layout (mlx-lm turns a KVCache into a QuantizedKVCache at
    quantized_kv_start: its earlier keys change too)."""
    return ",".join(_layout(c) for c in cache)


def _layout(cache) -> str:
    if isinstance(cache, CacheList):
        return f"CacheList({','.join(_layout(c) for c in cache.caches)})"
    return type(cache).__name__


def leaves(cache: list) -> list:
    """`cache`'s layers, CacheList's members in its place."""
    return [m for c in cache for m in (leaves(c.caches) if isinstance(c, CacheList) else [c])]


def held_tokens(cache: list, own: int, whole: int) -> bool:
    """Whether a file's `cache` holds the tokens its header says: `own` keys and values in each
    KV layer, `whole` tokens seen by each other layer that counts them."""
    for layer in leaves(cache):
        if type(layer) in PER_TOKEN:
            keys = layer.keys[0] if isinstance(layer.keys, (list, tuple)) else layer.keys
            if layer.offset != own or (own and (keys is None or keys.shape[-2] < own)):
                return False
        elif getattr(layer, "offset", whole) != whole:
            return False
    return True


def foreign_arrays(cache: list) -> str | None:
    """What in a file's `cache` no prompt of streamer's makes, whatever the model (a file made by
    hand or by another program): keys or values of several sequences, or not floats; None if
    nothing."""
    for layer in leaves(cache):
        for name in ("keys", "values"):
            held = getattr(layer, name, None)  # a quantized cache's: (data, scales, biases)
            arrays = list(held) if isinstance(held, (list, tuple)) else [held]
            if not arrays or not isinstance(arrays[0], mx.array):
                continue
            if arrays[0].ndim == 0 or arrays[0].shape[0] != 1:
                return f"its {name} are of {arrays[0].shape[:1]} sequences, not 1"
            if not mx.issubdtype(arrays[-1].dtype, mx.floating):
                return f"its {name} are {arrays[-1].dtype}, not floats"
    return None


def segment(cache: list, start: int) -> list:
    """What a file continuing `start` tokens holds of `cache`: its KV layers' keys and values from
    `start` on (and none past the offset: mlx-lm's buffers run to a multiple of 256), every other
    layer whole."""
    return [_segment(c, start) for c in cache]


def _segment(cache, start: int):
    if isinstance(cache, CacheList):
        return CacheList(*(_segment(c, start) for c in cache.caches))
    if type(cache) not in PER_TOKEN or cache.keys is None:
        return cache
    keys, values, offset, *rest = cache.state
    cut = tree_map(lambda a: a[..., start:offset, :], (keys, values))
    return type(cache).from_state((*cut, offset - start, *rest))


def joined(parts: list[tuple[list, int]]) -> list:
    """One cache from a chain's files, first to last, each with how many of its own tokens are
    used (the rest were cut back from by the file after it): the KV layers' parts end to end,
    every other layer the last file's."""
    return [
        _join([part[i] for part, _ in parts], [n for _, n in parts])
        for i in range(len(parts[-1][0]))
    ]


def _join(layers: list, used: list[int]):
    last = layers[-1]
    if isinstance(last, CacheList):
        members = zip(*(layer.caches for layer in layers))
        return CacheList(*(_join(list(m), used) for m in members))
    if type(last) not in PER_TOKEN or last.keys is None:
        return last
    kept = [
        tree_map(lambda a, n=n: a[..., :n, :], (c.keys, c.values)) for c, n in zip(layers, used)
    ]
    keys, values = (_concatenate([k[i] for k in kept]) for i in range(2))
    return type(last).from_state((keys, values, sum(used), *last.state[3:]))


def _concatenate(parts: list):
    """The parts end to end on the token axis (a quantized cache's are (data, scales, biases))."""
    if isinstance(parts[0], (list, tuple)):
        return tuple(_concatenate(list(p)) for p in zip(*parts))
    return mx.concatenate(parts, axis=-2)
