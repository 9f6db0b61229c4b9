"""Prompt caches on disk (`--prompt-cache-dir`): the KV cache of a long system prompt or of a
conversation outlives the process, so a restart does not compute its prefill again.

Files are mlx-lm's own prompt cache format (mlx_lm.models.cache.save_prompt_cache: safetensors),
chained: a file holds the KV of the tokens after those of the file it continues, so a
conversation's turn writes its new tokens only (disk_segments.py; docs/format.md). A file is used
only for the model that wrote it: its metadata holds the model's identity (weights, compute dtype,
KV quantization) and its tokens (disk_format.py), and its name holds its crc32, checked before it is
loaded. A file that fails any check is removed with one log line (with the files continuing it),
never computed with. Writes go to a temporary name, are fsynced and renamed, the file continued
already in place, so an interrupted write (Ctrl-C, a crash) leaves no cache file, only a partial
one that the next start removes; the folder is kept under its byte bound by removing the least
recently used files before a new one goes in, and a file is not written where the disk would be
left short (disk_files.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
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
from .disk_entries import Entry, chain_of, chained, continued, holding, matched, unused_prefixes
from .disk_files import (
    CACHE_NAME,
    DISK_RESERVE,
    PARTIAL,
    PREFIX,
    SUFFIX,
    cache_files,
    check_contents,
    crc32,
    create_private,
    data_bytes,
    folder_files,
    has_room,
    remove_partials,
    removed,
)
from .disk_format import LaterFormat, check_loaded, file_metadata, header_entry
from .disk_segments import PER_TOKEN, joined, layout, leaves, segment

log = logging.getLogger("streamer.server")


class DiskCache:
    def __init__(self, folder: Path, identity: str, max_bytes: int, model: nn.Module | None = None):
        """`model`: the one whose layers, heads and widths a file's caches must have (a file made
        by hand passes the checks of its name and header); None: files checked alone."""
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)  # conversations: this user's
        except OSError as e:
            raise StreamerError(f"--prompt-cache-dir {folder}: {e.strerror or e}") from None
        self.folder, self.identity, self.max_bytes, self.model = folder, identity, max_bytes, model
        self.short_of_disk = False  # the last file was not written for want of disk space
        self.entries: dict[Path, Entry] = {}
        remove_partials(folder)
        headers = {}
        for path in sorted(folder_files(folder, CACHE_NAME)):
            if (header := self._header(path)) is not None:
                headers[path] = header
        self.entries = chained(headers)
        for path in sorted(headers.keys() - self.entries.keys()):
            self._damaged(path, ValueError("the file it continues is gone or not its own"))
        if self.entries:
            log.info("%d prompt caches of this model on disk in %s", len(self.entries), folder)

    def fetch(self, tokens: list[int], longer_than: int) -> tuple[list, int] | None:
        """(the KV cache, how many of `tokens` it holds) from the file sharing the longest prefix
        with `tokens`, if longer than `longer_than`; None otherwise."""
        best, length, matches = None, longer_than, matched(self.entries, tokens)
        for entry in self.entries.values():
            common = matches[entry.path]
            if common < entry.end and not entry.trimmable:
                continue  # not a prefix, and mlx-lm cannot cut it back to one
            if common > length:
                best, length = entry, common
        if best is None:
            return None
        cache = self._load(best)
        if cache is None:
            return None
        if length < best.end:
            trim_prompt_cache(cache, best.end - length)
        self._touch(best)
        return cache, length

    def save(self, tokens: list[int], cache: list) -> None:
        """Write `cache` (of `tokens`) atomically, continuing the file that holds most of them
        where that is worth it, the least recently used files removed first to make room; not
        where it would pass the bound alone, or leave the disk short (disk_files.py)."""
        matches = matched(self.entries, tokens)
        held = holding(self.entries, matches, len(tokens))
        if held is not None:  # the same answer again, or a turn asked again: not written again
            self._touch(held)
            return
        shape = layout(cache)
        per_token = any(type(c) in PER_TOKEN for c in leaves(cache))  # else nothing to share
        parent, start = continued(self.entries, matches, tokens, shape) if per_token else (None, 0)
        part = segment(cache, start)
        key = hashlib.sha256(f"{self.identity}:{tokens}".encode()).hexdigest()[:24]
        partial = self.folder / f"{PARTIAL}{os.getpid()}-{key}{SUFFIX}"
        trimmable = can_trim_prompt_cache(cache)
        name = parent.path.name if parent else ""
        metadata = file_metadata(self.identity, tokens[start:], start, name, shape, trimmable)
        try:
            if not self._room_for(data_bytes(part)):
                return
            create_private(partial)  # mlx writes through a link, with the umask's mode
            save_prompt_cache(str(partial), part, metadata)
            crc = crc32(partial)
            with open(partial, "rb") as f:
                os.fsync(f.fileno())
            for old in [p for p in self.entries if p.name.startswith(f"{PREFIX}{key}-")]:
                self._forget(old)
            size = partial.stat().st_size
            if parent is not None:
                self._touch(parent)  # its chain is in use: removed last
            if size > self.max_bytes or not self._bound(room=size, keep=parent):
                partial.unlink()  # no room within the bound, or its chain had to go
                return
            path = self.folder / f"{PREFIX}{key}-{crc:08x}{SUFFIX}"
            os.replace(partial, path)
        except Exception as e:  # a full disk (or a cache mlx-lm cannot save) costs the cache only
            partial.unlink(missing_ok=True)
            why = e.strerror if isinstance(e, OSError) and e.strerror else one_line(e)
            log.warning("prompt cache not written to %s: %s", self.folder, why)
            return
        own = tuple(tokens[start:])
        self.entries[path] = Entry(path, own, trimmable, start, parent and parent.path, shape)
        for shorter in unused_prefixes(self.entries, matches, len(tokens)) if trimmable else []:
            self._forget(shorter)  # the new file cuts back to it, as mlx-lm drops them from memory
        self._sync_folder()

    def _sync_folder(self) -> None:
        """The folder's renames and removals made to survive a power loss. A failure leaves the
        new file in place, used now and at the next start, only perhaps lost to a power loss."""
        try:
            fsync_dir(self.folder)
        except OSError as e:
            log.warning(
                "prompt cache written to %s, but its folder could not be synced (%s): a power "
                "loss may lose it",
                self.folder,
                e.strerror or e,
            )

    def _touch(self, entry: Entry) -> None:
        """Mark `entry`'s files recently used: evicted last."""
        for link in chain_of(self.entries, entry):
            with contextlib.suppress(OSError):  # removed since by a server sharing it, or fixed
                os.utime(link.path)

    def _header(self, path: Path) -> Entry | None:
        """The file's entry from its header alone, with its own tokens; None for another model's
        file, a later streamer's (with a log line), or (removed with a log line) a damaged one."""
        try:
            return header_entry(path, self.identity)
        except FileNotFoundError:  # removed since it was listed, by a server sharing the folder
            return None
        except LaterFormat as e:  # the bound still counts it: removed when least recently used
            log.warning("ignoring prompt cache %s (%s); left in place", path, one_line(e))
            return None
        except (OSError, ValueError, KeyError, TypeError, RecursionError) as e:
            self._damaged(path, e)
            return None

    def _load(self, entry: Entry) -> list | None:
        """`entry`'s cache, its chain's files joined; None where one is gone or damaged."""
        chain = chain_of(self.entries, entry)
        parts = []
        for link, end in zip(chain, [c.start for c in chain[1:]] + [entry.end]):
            cache = self._read(link)
            if cache is None:
                return None
            parts.append((cache, end - link.start))
        return joined(parts)

    def _read(self, entry: Entry) -> list | None:
        """The cache `entry`'s own file holds, checked against its name and header."""
        try:
            check_contents(entry.path)  # as long as its header says, the crc32 its name gives
            cache, metadata = load_prompt_cache(str(entry.path), return_metadata=True)
            check_loaded(cache, metadata, entry, self.identity, self.model)
            return cache
        except Exception as e:  # whatever a damaged file makes mlx or mlx-lm raise
            if entry.path.exists():
                self._damaged(entry.path, e)
            else:  # another server sharing the folder removed it (mlx says "Failed to open")
                self._forget(entry.path)
        return None

    def _damaged(self, path: Path, error: Exception) -> None:
        done = "removed" if path in self._forget(path) else "left in place"
        log.warning("ignoring damaged prompt cache %s (%s); %s", path, one_line(error), done)

    def _forget(self, path: Path) -> list[Path]:
        """Forget the file at `path` and every file continuing it (of no use without it),
        removing them; those now gone."""
        gone = [path]
        for at in gone:  # grows as it goes: a chain's files, each once
            gone += [e.path for e in self.entries.values() if e.parent == at]
        for at in gone:
            self.entries.pop(at, None)
        return [at for at in gone if removed(at)]

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

    def _bound(self, room: int, keep: Entry | None) -> bool:
        """Remove the least recently used files (every model's) until the folder holds `room`
        bytes more within its bound; whether it does (files it cannot remove may fill it), with
        `keep`'s file (the one a new file continues) still there."""
        sizes = cache_files(self.folder)
        total = sum(size for _, size in sizes.values()) + room
        for path in sorted(sizes, key=sizes.get):
            if total <= self.max_bytes:
                break
            if path in sizes:
                for gone in self._forget(path):
                    total -= sizes.pop(gone, (0, 0))[1]
        return total <= self.max_bytes and (keep is None or keep.path in self.entries)
