"""The KV caches of finished sequences kept in memory (serve's and chat's): mlx-lm's LRUPromptCache,
but the cache a prompt extends is taken out of those kept, not copied.

LRUPromptCache hands out a deep copy of what it keeps (the sequence computed next extends it in
place), so every turn of a conversation copied the whole conversation's KV cache: 9 copies growing
from 256 to 688 KiB over 10 turns of the tests' tiny model, gigabytes a turn for a long chat of
a large one. A cache that is a prefix of the prompt (and can be trimmed) would be dropped anyway
once the sequence that extends it is kept (insert_cache drops a kept prefix of what it inserts),
so it is taken out instead. One engine thread fetches and keeps (engine.py): no two sequences hold
a cache at once. A cache longer than the prompt, trimmed to it, stays kept and is copied, as one
that cannot be trimmed (a hybrid model's) is.

Taking an entry out reaches into LRUPromptCache's private trie, LRU order and byte counts: its
public methods copy whatever they hand out, and drop entries only least recently used first.
mlx-lm is pinned; tests/test_server_prompt_cache.py names the private part a new pin changed.
"""

from __future__ import annotations

from typing import Any

from mlx_lm.models.cache import LRUPromptCache, can_trim_prompt_cache


class PromptCache(LRUPromptCache):
    def fetch_nearest_cache(self, model: Any, tokens: list[int]) -> tuple[list | None, list[int]]:
        """The KV cache of the longest kept prefix of `tokens` (or of a kept longer sequence,
        trimmed) and the tokens after it, as LRUPromptCache chooses them."""
        found = self._trie.search(model, tokens)
        prefix = found.exact if found.exact is not None else found.shorter
        if prefix is None or (found.exact is None and self._longer_is_nearer(model, found)):
            return super().fetch_nearest_cache(model, tokens)
        entry = self._trie.get(model, prefix)
        if not can_trim_prompt_cache(entry.prompt_cache):
            return super().fetch_nearest_cache(model, tokens)
        self._trie.pop(model, prefix)
        self._lru.remove(model, prefix)
        self._n_bytes -= entry.nbytes
        self._n_bytes_by_type[entry.cache_type] -= entry.nbytes
        return entry.prompt_cache, tokens[len(prefix) :]

    def _longer_is_nearer(self, model: Any, found) -> bool:
        """Whether LRUPromptCache hands out a kept longer sequence, trimmed, over the prefix."""
        shorter = len(found.shorter) if found.shorter is not None else 0
        return (
            found.longer is not None
            and found.common_prefix > shorter
            and can_trim_prompt_cache(self._trie.get(model, found.longer).prompt_cache)
        )
