"""Trimming the target's KV cache back to the kept tokens after a verify pass, sliding-window
caches included.

mlx-lm trims a RotatingKVCache only while it holds fewer tokens than its window
(`is_trimmable`), and `trim_prompt_cache` then trims nothing at all, silently: mlx-lm 0.32.2's own
speculative decoding of gpt-oss (sliding-window layers) keeps the rejected drafts in the cache and
its greedy output leaves plain greedy output at the first rejection once the window is full. But
right after a pass of several tokens a rotating cache is in temporal order, its window then the
pass (mlx-lm's `_update_concat`), so the pass's last n entries can be dropped exactly. The loop
trims only right after a pass (never after a single-token step, whose in-place write may have
evicted the window's oldest token).
"""

from __future__ import annotations

from mlx_lm.models.cache import RotatingKVCache

from ..errors import StreamerError


def check_trimmable(cache: list, own: list | None = None) -> None:
    """Refuse, before the prompt is computed, a cache no pass could be trimmed back in, and a
    window the model's own cache (`own`, make_prompt_cache's) has not: a prompt_cache made with
    max_kv_size, where passes see other keys than single steps (wrong tokens, or MLX's
    broadcast ValueError once the prompt is longer than the window)."""
    for c, o in zip(cache, own or cache):
        if isinstance(c, RotatingKVCache) and _window(c) != _window(o):
            raise StreamerError(
                f"prompt_cache holds a RotatingKVCache of {c.max_size} tokens (as max_kv_size "
                "makes it), which speculative decoding cannot use: drafting into a bounded KV "
                "cache is not checked exact yet; give a cache of make_prompt_cache(model)."
            )
    kinds = sorted({type(c).__name__ for c in cache if not _trimmable(c)})
    if kinds:
        raise StreamerError(
            f"speculative decoding trims the KV cache after each pass, and {', '.join(kinds)} "
            "cannot be trimmed (state-space or linear-attention layers keep no per-token "
            "entries): decode this model without a draft."
        )


def trim(cache: list, n: int) -> None:
    """Drop the last `n` tokens of every layer's cache, the last update having been a pass."""
    if n <= 0:
        return
    for c in cache:
        if isinstance(c, RotatingKVCache) and not c.is_trimmable():
            if c._idx != c.keys.shape[2]:  # not as a pass leaves it: nothing can say what it lost
                raise StreamerError("internal: a sliding-window cache trimmed after a single step")
            c.keys, c.values = c.keys[..., : c._idx - n, :], c.values[..., : c._idx - n, :]
            c.offset -= n
            c._idx -= n
        else:
            c.trim(n)


def _window(c) -> tuple:
    return getattr(c, "max_size", None), getattr(c, "keep", None)


def _trimmable(c) -> bool:
    return isinstance(c, RotatingKVCache) or c.is_trimmable()
