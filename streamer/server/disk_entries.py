"""The entries of --prompt-cache-dir's files (disk_cache.py) as their headers give them
(disk_format.py): each file's own tokens, the file it continues (disk_segments.py), and the chains
they make."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import mlx.nn as nn

from ..loading.handle import streaming


@dataclass
class Entry:
    """A file and its own tokens, those after the `start` tokens its parent's chain holds (each
    entry keeps its own only: a long chat's entries would hold its tokens once a turn)."""

    path: Path
    own: tuple[int, ...]
    trimmable: bool
    start: int = 0
    parent: Path | None = None  # the file holding the tokens before `start`
    layout: str | None = None  # its caches' classes; None: a file of the first format (whole)

    @property
    def end(self) -> int:
        """The tokens its chain holds, up to and with its own."""
        return self.start + len(self.own)


def model_identity(model: nn.Module, options: dict) -> str:
    """What a cached KV depends on besides its tokens: the weights (a repacked folder's own
    identity, or a download's config and shard sizes and times), the dtype it computed in, and
    the KV quantization and bound."""
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
    if options.get("max_kv_size") is not None:  # a rotating cache holds its last tokens alone
        kv["max_kv_size"] = options["max_kv_size"]
    content = json.dumps({"weights": weights, "dtype": handle.dtype, "kv": kv}, sort_keys=True)
    return hashlib.sha256(content.encode()).hexdigest()[:32]


def chained(headers: dict[Path, Entry]) -> dict[Path, Entry]:
    """The entries of the files read at start whose chain is whole: a file gone or damaged,
    another layout, a start its parent does not hold or a loop leaves out those after it."""
    entries: dict[Path, Entry] = {}
    for path in sorted(headers):
        chain, at = [], path
        while at not in entries and at in headers and at not in chain:
            chain.append(at)
            at = headers[at].parent
            if at is None:
                break
        if at is not None and at not in entries:
            continue  # gone, or a loop
        for at in reversed(chain):
            own, before = headers[at], entries.get(headers[at].parent)
            if (
                before is None
                and own.start == 0
                or (
                    before
                    and before.layout == own.layout
                    and before.start < own.start <= before.end
                )
            ):
                entries[at] = own
            else:
                break
    return entries


def matched(entries: dict[Path, Entry], tokens: list[int]) -> dict[Path, int]:
    """How many of `tokens` each entry's chain begins with (their shared prefix), each file's
    own tokens compared once."""
    found: dict[Path, int] = {}
    for entry in entries.values():
        todo, at = [], entry
        while at.path not in found:
            todo.append(at)
            if at.parent is None:
                break
            at = entries[at.parent]
        for at in reversed(todo):
            before = found[at.parent] if at.parent is not None else 0
            if at.parent is not None and before < at.start:
                found[at.path] = before  # parted before this file's own tokens
            else:
                found[at.path] = at.start + _common(at.own, tokens[at.start :])
    return found


def continued(
    entries: dict[Path, Entry], matches: dict[Path, int], tokens: list[int], shape: str
) -> tuple[Entry | None, int]:
    """The file of `entries` a new one for `tokens` continues, and how many tokens the new one
    starts after: the file of the same layout sharing the longest prefix (`matches`), cut back
    to it (the file holding that prefix's end), where the tokens it holds past it (read for
    nothing) are no more than those the new file is spared. (None, 0): a whole file."""
    best, length = None, 0
    for entry in entries.values():
        if entry.layout == shape and matches[entry.path] > length:
            best, length = entry, matches[entry.path]
    length = min(length, len(tokens) - 1)  # a file holds a token at least
    while best is not None and best.start >= length:
        best = entries.get(best.parent)
    if best is None or best.end - length > length:
        return None, 0
    return best, length


def holding(entries: dict[Path, Entry], matches: dict[Path, int], length: int) -> Entry | None:
    """The entry of a file that holds the cache of the `length` tokens `matches` was made for:
    theirs, or one that cuts back to them."""
    for entry in entries.values():
        if matches[entry.path] == length and (entry.end == length or entry.trimmable):
            return entry
    return None


def chain_of(entries: dict[Path, Entry], entry: Entry) -> list[Entry]:
    """The files `entry`'s cache is read from, first to last."""
    chain = [entry]
    while chain[-1].parent is not None:
        chain.append(entries[chain[-1].parent])
    return chain[::-1]


def unused_prefixes(entries: dict[Path, Entry], matches: dict[Path, int], end: int) -> list[Path]:
    """The files whose chains begin a new file's `end` tokens (`matches`: as many as they hold)
    that no file continues once those listed before them are gone (a chat's earlier files of
    the first format, say): the new file cuts back to each."""
    prefixes = [e for e in entries.values() if matches.get(e.path) == e.end < end]
    unused: list[Path] = []
    for shorter in sorted(prefixes, key=lambda e: -e.end):  # a chain's end first
        if not any(e.parent == shorter.path and e.path not in unused for e in entries.values()):
            unused.append(shorter.path)
    return unused


def _common(a: tuple[int, ...], b: list[int]) -> int:
    """The length of the prefix `a` and `b` share."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
