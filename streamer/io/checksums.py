"""Checksums of a download streamed in place, kept in a small sidecar file outside the download.

A download carries no per-tensor checksums, and a repack's manifest does not exist for it, so
`streamer verify DIR --record` computes a crc32 of every non-expert tensor and of every expert's
slice of every stacked tensor and writes them here, with the size and time of every shard.

Where: by default under the user's cache folder (`$STREAMER_CACHE_DIR`, else
`~/Library/Caches/streamer` on macOS, `$XDG_CACHE_HOME/streamer` or `~/.cache/streamer`),
named after the download folder and a hash of its absolute path. Not in the download folder: it
is often not ours to write (a Hugging Face cache snapshot is managed by huggingface_hub, whose
files are links into a content-addressed blob store; a shared or read-only volume), and a file
added there would be mistaken for part of the model by tools that sync or hash the folder. Not
beside it either: beside a snapshot is the hub cache's list of revisions. `checksums=PATH`
(`--checksums PATH`) puts it anywhere the user chooses, the download folder included.
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import StreamerError
from .durable import write_json_atomic
from .files import read_bytes
from .json_file import parse_json_object

FORMAT = "streamer-checksums"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class Checksums:
    folder: str  # the download folder, as an absolute path, when recorded
    files: dict[str, dict[str, int]]  # shard -> {"size", "mtime_ns"} when recorded
    resident: dict[str, int]  # source tensor name -> crc32
    experts: dict[str, list[list[int]]]  # MoE module -> [expert][tensor] crc32, in layer order

    def to_json(self) -> dict:
        return {"format": FORMAT, "format_version": FORMAT_VERSION, **self.__dict__}


def cache_dir() -> Path:
    if os.environ.get("STREAMER_CACHE_DIR"):
        return Path(os.environ["STREAMER_CACHE_DIR"])
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "streamer"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "streamer"


def default_sidecar(folder: Path | str) -> Path:
    """Where the checksums of the download at `folder` live unless the user names a file."""
    resolved = Path(folder).resolve()
    key = hashlib.sha256(os.fsencode(resolved)).hexdigest()[:16]
    return cache_dir() / "checksums" / f"{resolved.name}-{key}.json"


def write_checksums(path: Path, checksums: Checksums) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, checksums.to_json())


def read_checksums(path: Path) -> Checksums | None:
    """The recorded checksums, None if `path` does not exist; a damaged sidecar is refused."""
    fix = "delete it and record it again."
    try:
        raw = read_bytes(path, "a checksum file")  # a FIFO there is refused, not waited on
    except FileNotFoundError:
        return None
    except OSError as e:
        raise StreamerError(f"{path} cannot be read ({e.strerror or e}): {fix}") from e
    data = parse_json_object(raw, str(path), fix)
    try:
        if data["format"] != FORMAT or data["format_version"] != FORMAT_VERSION:
            raise ValueError(f"format {data['format']!r} version {data['format_version']!r}")
        checksums = Checksums(
            str(data["folder"]),
            {
                str(n): {"size": int(s["size"]), "mtime_ns": int(s["mtime_ns"])}
                for n, s in data["files"].items()
            },
            {str(n): int(c) for n, c in data["resident"].items()},
            {str(m): [[int(c) for c in e] for e in crcs] for m, crcs in data["experts"].items()},
        )
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise StreamerError(
            f"{path} is not a checksum file this streamer reads ({type(e).__name__}: {e}): "
            "delete it and record it again with `streamer verify DIR --record`."
        ) from e
    return checksums


def hub_blob_sha256(path: Path) -> str | None:
    """The sha256 a Hugging Face cache names a shard's blob by (`blobs/<sha256>`), if it is one:
    a checksum the download does carry, for the whole file."""
    real = path.resolve()
    name = real.name
    hexadecimal = len(name) == 64 and all(c in "0123456789abcdef" for c in name)
    if real.parent.name == "blobs" and hexadecimal:
        return name
    return None


def file_sha256(path: Path, chunk: int = 1 << 24) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()
