"""The files of --prompt-cache-dir (disk_cache.py) and the disk they are on: the folder's byte
bound is checked against the free space at start, and a cache file is written only where the disk
keeps DISK_RESERVE free after it, so a server up for days never fills the disk (the system's swap
and other programs need it too)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import stat
import zlib
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten

from ..errors import StreamerError
from ..io.sizes import size_text

PREFIX, SUFFIX, PARTIAL = "prompt-", ".safetensors", ".partial-"
# the names the cache writes (KEY: 24 hex digits, CRC: 8): prompt-KEY-CRC.safetensors, and
# .partial-PID-KEY.safetensors while one is written; any other file is the user's, left alone
CACHE_NAME = re.compile(rf"{PREFIX}[0-9a-f]{{24}}-[0-9a-f]{{8}}{re.escape(SUFFIX)}")
PARTIAL_NAME = re.compile(rf"{re.escape(PARTIAL)}([0-9]+)-[0-9a-f]{{24}}{re.escape(SUFFIX)}")
MAX_HEADER = 64 << 20  # a safetensors header longer than this is not one of ours
DISK_RESERVE = 1 << 30  # left free on the disk whatever the bound

log = logging.getLogger("streamer.server")


def free_bytes(folder: Path) -> int:
    """The free bytes of the disk that holds `folder` (or would: its nearest existing parent)."""
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return shutil.disk_usage(folder).free


def check_room(folder: Path, max_bytes: int, held: int) -> None:
    """Refuse a bound the disk cannot hold: what it has free and the `held` bytes of cache files
    already in `folder` (which the bound counts), less DISK_RESERVE."""
    free = free_bytes(folder)
    room = free + held - DISK_RESERVE
    if max_bytes > room:
        fits = f"give --prompt-cache-disk {size_text(room)} or less, or " if room > 0 else ""
        raise StreamerError(
            f"--prompt-cache-disk {size_text(max_bytes)} does not fit on the disk of {folder}: "
            f"it has {size_text(free)} free and {size_text(held)} of prompt caches, and "
            f"{size_text(DISK_RESERVE)} is left free: {fits}free space on that disk."
        )


def data_bytes(cache: list) -> int:
    """The bytes of the arrays `cache`'s file holds (the file adds a header)."""
    leaves = tree_flatten([c.state for c in cache])
    return sum(x.nbytes for _, x in leaves if isinstance(x, mx.array))


def has_room(folder: Path, size: int) -> bool:
    """Whether a file of `size` bytes leaves DISK_RESERVE free on `folder`'s disk."""
    return free_bytes(folder) - size >= DISK_RESERVE


def check_bound(folder: Path, max_bytes: int) -> None:
    """Refuse at start a bound the disk of `folder` cannot hold beside the files already there."""
    try:
        held = sum(path.stat().st_size for path in folder_files(folder, CACHE_NAME))
        check_room(folder, max_bytes, held)
    except OSError as e:  # a parent the user may not search, say
        raise StreamerError(f"--prompt-cache-dir {folder}: {e.strerror or e}") from None


def check_private(folder: Path) -> None:
    """Refuse what is no folder (a file, a broken link), one this user cannot write, and a folder
    another user may write to (or owns): a file planted there would be loaded as a conversation's
    KV cache, and a link planted under a name about to be written would have the write land on
    whatever it points to."""
    try:
        st = folder.stat()
    except FileNotFoundError:  # created by DiskCache, this user's own
        check_creatable(folder)
        return
    except OSError as e:  # a loop of links, a name too long, a parent that is no folder
        raise StreamerError(f"--prompt-cache-dir {folder}: {e.strerror or e}") from None
    if not stat.S_ISDIR(st.st_mode):
        raise StreamerError(f"--prompt-cache-dir {folder} is not a folder.")
    if st.st_uid != os.getuid():
        raise StreamerError(
            f"--prompt-cache-dir {folder} belongs to another user, who could plant cache files "
            "in it: give a folder of your own."
        )
    if st.st_mode & stat.S_IWOTH:
        raise StreamerError(
            f"--prompt-cache-dir {folder} may be written by any user (mode "
            f"{stat.S_IMODE(st.st_mode):o}), who could plant cache files in it: give a folder of "
            f"your own, or `chmod o-w {folder}`."
        )
    if not os.access(folder, os.W_OK):
        raise StreamerError(
            f"--prompt-cache-dir {folder} is not writable (its permissions, or a read-only disk): "
            "give a folder you may write to."
        )


def check_creatable(folder: Path) -> None:
    """Refuse a folder DiskCache could not make, once the model is loaded: one under a link to
    nothing (mkdir would say "File exists"), or whose nearest existing folder this user cannot
    write (a link to a read-only disk, say)."""
    at = folder
    while not os.path.lexists(at):
        at = at.parent
    if at.is_symlink() and not at.exists():
        named = folder if at == folder else f"{folder}: {at}"
        raise StreamerError(
            f"--prompt-cache-dir {named} is a link to {os.readlink(at)}, which does not exist: "
            "give a folder."
        )
    if not os.access(at, os.W_OK):
        raise StreamerError(
            f"--prompt-cache-dir {folder} cannot be made: {at} is not writable (its permissions, "
            "or a read-only disk): give a folder you may write to."
        )


def create_private(path: Path) -> None:
    """A new empty file at `path` that only this user may read (a cache file holds a
    conversation's tokens); never through a link or over a file already there."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))


def metadata_of(path: Path) -> dict:
    with open(path, "rb") as f:
        header, _ = _header(f)
    if not isinstance(header.get("__metadata__"), dict):
        raise ValueError("no metadata in its header")
    return header["__metadata__"]


def check_contents(path: Path) -> None:
    """ValueError unless the cache file at `path` is as long as its header says (one grown sparse
    to terabytes was read through for its crc32) and has the crc32 its name gives."""
    with open(path, "rb") as f:
        header, length = _header(f)
        size = os.fstat(f.fileno()).st_size
    tensors = [t for name, t in header.items() if name != "__metadata__"]
    said = 8 + length + max((t["data_offsets"][1] for t in tensors), default=0)
    if size != said:
        raise ValueError(f"it is {size} bytes, and its header says {said}")
    if crc32(path) != int(path.name.removesuffix(SUFFIX).rsplit("-", 1)[1], 16):
        raise ValueError("its crc32 does not match its name (the file changed)")


def _header(f) -> tuple[dict, int]:
    """The safetensors header of the file open as `f` (at its start), and its length."""
    n = int.from_bytes(f.read(8), "little")
    if not 0 < n <= MAX_HEADER:
        raise ValueError(f"a safetensors header of {n} bytes")
    header = json.loads(f.read(n))
    if not isinstance(header, dict):
        raise ValueError("its header is not a JSON object")
    return header, n


def crc32(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(16 << 20):
            crc = zlib.crc32(chunk, crc)
    return crc


def remove_partials(folder: Path) -> None:
    """Partial files of writes that never finished: their process is gone."""
    for path in folder_files(folder, PARTIAL_NAME):
        if _gone(int(PARTIAL_NAME.fullmatch(path.name)[1])):
            removed(path)


def removed(path: Path) -> bool:
    """Whether the cache's file at `path` is gone, removed now or before; where it cannot be (a
    file of another user in a sticky folder, an immutable one, a disk remounted read-only), it
    is left in place with a log line."""
    try:
        path.unlink(missing_ok=True)
    except OSError as e:
        log.warning("prompt cache %s cannot be removed (%s); left in place", path, e.strerror or e)
        return False
    return True


def cache_files(folder: Path) -> dict[Path, tuple[int, int]]:
    """Each cache file of `folder` (every model's): (its mtime_ns, its size)."""
    found = {}
    for path in folder_files(folder, CACHE_NAME):
        with contextlib.suppress(FileNotFoundError):  # removed since by a server sharing it
            st = path.stat()
            found[path] = (st.st_mtime_ns, st.st_size)
    return found


def folder_files(folder: Path, name: re.Pattern) -> list[Path]:
    """The files (or links to them) whose whole name is `name`: a folder or special file under a
    cache file's name is not one of ours, and unlinking it raised at start."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:  # not made yet (DiskCache makes it)
        return []
    return [folder / n for n in names if name.fullmatch(n) and (folder / n).is_file()]


def _gone(pid: int) -> bool:
    """Whether the process that wrote a partial file has ended (never this one). A number past
    any pid (os.kill's OverflowError was a traceback at start) is no name we write: left alone."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError):
        return False
    return False
