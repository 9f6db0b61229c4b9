"""Prompt caches on disk (`--prompt-cache-dir`): the KV cache of a long system prompt or of a
conversation outlives the process, so a restart does not compute its prefill again.

Files are mlx-lm's own prompt cache format (mlx_lm.models.cache.save_prompt_cache: safetensors,
which `mlx_lm.generate --prompt-cache-file` reads too), one token sequence each. A file is used
only for the model that wrote it: its metadata holds the model's identity (weights, compute dtype,
KV quantization) and the tokens it caches, and its name holds its crc32, checked before it is
loaded. A file that fails any check is removed with one log line, never computed with. Writes go
to a temporary name, are fsynced and renamed, so an interrupted write (Ctrl-C, a crash) leaves no
cache file, only a partial one that the next start removes; the folder is kept under its byte
bound by removing the least recently used files before a new one goes in, and a file is not
written where the disk would be left short (disk_files.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import mlx.nn as nn
from mlx_lm.models.cache import (
    can_trim_prompt_cache,
    load_prompt_cache,
    save_prompt_cache,
    trim_prompt_cache,
)

from ..errors import StreamerError, one_line
from ..io.durable import fsync_dir
from ..io.sizes import size_text
from ..loading.handle import streaming
from .disk_files import (
    DISK_RESERVE,
    PARTIAL,
    PREFIX,
    SUFFIX,
    crc32,
    create_private,
    data_bytes,
    folder_files,
    has_room,
    metadata_of,
    remove_partials,
)

log = logging.getLogger("streamer.server")


@dataclass
class Entry:
    path: Path
    tokens: tuple[int, ...]
    trimmable: bool


def model_identity(model: nn.Module, options: dict) -> str:
    """What a cached KV depends on besides its tokens: the weights (a repacked folder's own
    identity, or a download's config and shard sizes and times), the dtype it computed in, and
    the KV quantization."""
    handle = streaming(model)
    manifest = handle.manifest
    if hasattr(manifest, "model_identity"):
        weights = manifest.model_identity
    else:
        shards = {
            name: (size, (manifest.folder / name).stat().st_mtime_ns)
            for name, size in manifest.file_bytes.items()
        }
        weights = json.dumps({"config": manifest.config, "shards": shards}, sort_keys=True)
    kv = {k: options.get(k) for k in ("kv_bits", "kv_group_size", "quantized_kv_start")}
    content = json.dumps({"weights": weights, "dtype": handle.dtype, "kv": kv}, sort_keys=True)
    return hashlib.sha256(content.encode()).hexdigest()[:32]


class DiskCache:
    def __init__(self, folder: Path, identity: str, max_bytes: int):
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)  # conversations: this user's
        except OSError as e:
            raise StreamerError(f"--prompt-cache-dir {folder}: {e.strerror or e}") from None
        if not os.access(folder, os.W_OK):
            raise StreamerError(f"--prompt-cache-dir {folder}: not writable")
        self.folder, self.identity, self.max_bytes = folder, identity, max_bytes
        self.short_of_disk = False  # the last file was not written for want of disk space
        self.entries: dict[Path, Entry] = {}
        remove_partials(folder)
        for path in sorted(folder_files(folder, f"{PREFIX}*{SUFFIX}")):
            entry = self._entry(path)
            if entry is not None:
                self.entries[path] = entry
        if self.entries:
            log.info("%d prompt caches of this model on disk in %s", len(self.entries), folder)

    def fetch(self, tokens: list[int], longer_than: int) -> tuple[list, int] | None:
        """(the KV cache, how many of `tokens` it holds) from the file sharing the longest prefix
        with `tokens`, if longer than `longer_than`; None otherwise."""
        best, length = None, longer_than
        for entry in self.entries.values():
            shared = _shared(entry.tokens, tokens)
            if shared < len(entry.tokens) and not entry.trimmable:
                continue  # not a prefix, and mlx-lm cannot cut it back to one
            if shared > length:
                best, length = entry, shared
        if best is None:
            return None
        cache = self._load(best)
        if cache is None:
            return None
        if length < len(best.tokens):
            trim_prompt_cache(cache, len(best.tokens) - length)
        with contextlib.suppress(FileNotFoundError):  # removed since by a server sharing it
            os.utime(best.path)  # recently used: evicted last
        return cache, length

    def save(self, tokens: list[int], cache: list) -> None:
        """Write `cache` (of `tokens`) atomically, replacing any file of the same tokens, the
        least recently used files removed first to make room; not where it would pass the bound
        alone, or leave the disk short (disk_files.py)."""
        held = self._holding(tuple(tokens))
        if held is not None:  # the same answer again, or a turn asked again: not written again
            with contextlib.suppress(FileNotFoundError):
                os.utime(held.path)
            return
        key = hashlib.sha256(f"{self.identity}:{tokens}".encode()).hexdigest()[:24]
        partial = self.folder / f"{PARTIAL}{os.getpid()}-{key}{SUFFIX}"
        metadata = {
            "streamer_model": self.identity,
            "streamer_tokens": json.dumps(tokens),
            "streamer_trimmable": str(can_trim_prompt_cache(cache)),
        }
        try:
            if not self._room_for(data_bytes(cache)):
                return
            create_private(partial)  # mlx writes through a link, with the umask's mode
            save_prompt_cache(str(partial), cache, metadata)
            crc = crc32(partial)
            with open(partial, "rb") as f:
                os.fsync(f.fileno())
            for old in [p for p in self.entries if p.name.startswith(f"{PREFIX}{key}-")]:
                self._forget(old)
            size = partial.stat().st_size
            if size > self.max_bytes:  # its header passed the bound: it would go first
                partial.unlink()
                return
            self._bound(room=size)
            path = self.folder / f"{PREFIX}{key}-{crc:08x}{SUFFIX}"
            os.replace(partial, path)
            fsync_dir(self.folder)
        except Exception as e:  # a full disk (or a cache mlx-lm cannot save) costs the cache only
            partial.unlink(missing_ok=True)
            why = e.strerror if isinstance(e, OSError) and e.strerror else one_line(e)
            log.warning("prompt cache not written to %s: %s", self.folder, why)
            return
        entry = Entry(path, tuple(tokens), metadata["streamer_trimmable"] == "True")
        self.entries[path] = entry
        # a file of a prefix is this one cut back: gone, as mlx-lm's LRUPromptCache drops them
        # (a long chat kept every turn's file, and pushed the other caches out)
        if entry.trimmable:
            for shorter in [e for e in self.entries.values() if _prefix(e.tokens, entry.tokens)]:
                self._forget(shorter.path)

    def _holding(self, tokens: tuple[int, ...]) -> Entry | None:
        """A file that holds `tokens`' cache: theirs, or one that cuts back to it."""
        for entry in self.entries.values():
            if entry.tokens == tokens or (entry.trimmable and _prefix(tokens, entry.tokens)):
                return entry
        return None

    def _entry(self, path: Path) -> Entry | None:
        """The file's entry from its header alone; None for another model's file, or (removed
        with a log line) a damaged one."""
        try:
            metadata = metadata_of(path)
            if metadata.get("0.streamer_model") != self.identity:
                return None
            tokens = json.loads(metadata["0.streamer_tokens"])
            if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
                raise ValueError("its tokens are not a list of ids")
            return Entry(path, tuple(tokens), metadata.get("0.streamer_trimmable") == "True")
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
            self._damaged(path, e)
            return None

    def _load(self, entry: Entry) -> list | None:
        try:
            want = int(entry.path.name.removesuffix(SUFFIX).rsplit("-", 1)[1], 16)
            if crc32(entry.path) != want:
                raise ValueError("its crc32 does not match its name (the file changed)")
            cache, metadata = load_prompt_cache(str(entry.path), return_metadata=True)
            if metadata.get("streamer_model") != self.identity or json.loads(
                metadata.get("streamer_tokens", "null")
            ) != list(entry.tokens):
                raise ValueError("its metadata changed since it was listed")
            offsets = {c.offset for c in cache if hasattr(c, "offset")}
            if offsets and offsets != {len(entry.tokens)}:
                raise ValueError(f"it holds {sorted(offsets)} tokens, not {len(entry.tokens)}")
            return cache
        except FileNotFoundError:  # another server sharing the folder removed it
            self.entries.pop(entry.path, None)
        except Exception as e:  # whatever a damaged file makes mlx or mlx-lm raise
            self._damaged(entry.path, e)
        return None

    def _damaged(self, path: Path, error: Exception) -> None:
        log.warning("ignoring damaged prompt cache %s (%s); removed", path, one_line(error))
        self._forget(path)

    def _forget(self, path: Path) -> None:
        self.entries.pop(path, None)
        path.unlink(missing_ok=True)

    def _room_for(self, size: int) -> bool:
        """Whether a file of `size` bytes may be written: within the bound, and on a disk that
        keeps its reserve (said once until a file fits again: a full disk would log each turn)."""
        if size > self.max_bytes:
            return False
        room = has_room(self.folder, size)
        if not room and not self.short_of_disk:
            log.warning(
                "prompt caches not written to %s until its disk has %s free beyond the cache",
                self.folder,
                size_text(DISK_RESERVE),
            )
        self.short_of_disk = not room
        return room

    def _bound(self, room: int) -> None:
        """Remove the least recently used files (every model's) until the folder holds `room`
        bytes more within its bound."""
        files = []
        for path in folder_files(self.folder, f"{PREFIX}*{SUFFIX}"):
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            files.append((st.st_mtime_ns, st.st_size, path))
        total = sum(size for _, size, _ in files) + room
        for _, size, path in sorted(files):
            if total <= self.max_bytes:
                break
            self._forget(path)
            total -= size


def _prefix(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Whether `a` is a shorter start of `b`."""
    return len(a) < len(b) and b[: len(a)] == a


def _shared(a: tuple[int, ...], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
