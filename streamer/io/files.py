"""Opening the user's files: only regular files, never blocking.

A FIFO, device or socket where a shard, config.json, tokenizer file, manifest or expert file belongs
would make a plain open() or read() wait forever (a FIFO blocks until a writer appears). Every file
the tool reads is opened here with O_NONBLOCK and refused by its fstat unless it is a regular file.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import os
import stat
import weakref
from pathlib import Path

from ..errors import StreamerError

# Files of a download written for people, which no loader reads: a broken link to one (its blob
# never fetched, or removed) is no damage to the model.
FOR_PEOPLE = ["README*", "LICENSE*", "LICENCE*", "NOTICE*", "COPYING*", "USE_POLICY*", "*.md"]
# What the names of the files a model reads end with: a folder or a broken link so named is
# damage, not a subfolder (original/) or a stray link a download may hold
FILE_SUFFIXES = (".json", ".jsonl", ".jinja", ".model", ".tiktoken", ".txt", ".py", ".safetensors")
# The format llama.cpp, Ollama and LM Studio run: what their users pass first
GGUF = (
    "GGUF (llama.cpp's format, which Ollama and LM Studio run) is not read: streamer streams a "
    "model's safetensors checkpoint, an MLX-quantized one in place (`streamer pull org/name`, "
    "e.g. mlx-community/Qwen3-30B-A3B-4bit)"
)
_KINDS = {
    stat.S_IFIFO: "a FIFO (named pipe)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFDIR: "a directory",
}


def not_regular(path: Path | str, mode: int, what: str) -> StreamerError:
    kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
    return StreamerError(
        f"{path} is {kind}, not a regular file ({what}): replace it with the file."
    )


def open_regular(path: Path | str, what: str) -> int:
    """A read-only descriptor of `path`, which must be a regular file. OSErrors (missing file,
    permissions, symlink loops) propagate for the caller to word; a special file is refused."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        if e.errno == errno.ENXIO:  # opening a socket (or a FIFO without a reader on some systems)
            raise not_regular(path, os.stat(path).st_mode, what) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise not_regular(path, mode, what)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_regular(path: Path | str, what: str) -> None:
    """Refuse `path` unless it opens as a regular file (before handing it to a library's open)."""
    os.close(open_regular(path, what))


def read_bytes(path: Path | str, what: str, at_most: int = -1) -> bytes:
    """The bytes of regular file `path` (`what` it is, for refusals), `at_most` of them if
    given (-1: all)."""
    with os.fdopen(open_regular(path, what), "rb") as f:
        return f.read(at_most)


def check_folder_files(folder: Path | str, what: str) -> None:
    """Refuse a FIFO, socket or device among the files of `folder` (tokenizer files, configs,
    shards: libraries open them by name with a blocking open), and a folder or a broken link
    named as a file the model reads: the tokenizer's readers skip a tokenizer_config.json they
    cannot open, and repack left it out, without a word. Other subfolders and links are left to
    the readers."""
    with os.scandir(folder) as entries:
        for entry in entries:
            read = entry.name.endswith(FILE_SUFFIXES) and not for_people(entry.name)
            try:
                mode = os.stat(entry.path).st_mode
            except OSError as e:
                if read and entry.is_symlink():
                    raise broken_link(entry.path, e, what) from None
                continue
            if not (stat.S_ISREG(mode) or (stat.S_ISDIR(mode) and not read)):
                raise not_regular(entry.path, mode, what)


def gguf_refusal(path: Path | str) -> str | None:
    """Why `path` is refused if it is a GGUF file, or a folder of them without config.json."""
    path = Path(path)
    if os.path.isdir(path):  # Path.is_dir raises OSError for a part over 255 bytes
        held = not os.path.lexists(path / "config.json") and any(path.glob("*.gguf"))
    else:
        held = path.suffix.lower() == ".gguf"
    return f"{path}: {GGUF}." if held else None


def for_people(name: str) -> bool:
    """Whether a file named `name` is one written for people (a README), which no loader reads."""
    return any(fnmatch.fnmatch(name, pattern) for pattern in FOR_PEOPLE)


def broken_link(path: str, error: OSError, what: str) -> StreamerError:
    why = ", which is missing" if error.errno == errno.ENOENT else f": {error.strerror or error}"
    return StreamerError(
        f"cannot read {path} (a symbolic link to {os.readlink(path)}{why}; {what}): download the "
        "file again, or delete the link if the model does not need it."
    )


def check_utf8_path(path: Path | str, what: str) -> None:
    """MLX opens files by UTF-8 name: a path holding other bytes cannot be read by it."""
    text = str(Path(path).absolute())
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(text).decode("utf-8", "backslashreplace")
        raise StreamerError(
            f"{shown} ({what}) is not valid UTF-8, and MLX opens files only by UTF-8 names: "
            "rename the folder."
        ) from None


def check_tmpdir() -> None:
    """MLX's CPU backend compiles kernels into TMPDIR/mlx/VERSION/cpu and fails at the first
    token if it cannot: `temp_directory_path: No such file or directory` where TMPDIR names no
    folder, `cannot create directories: Permission denied` (a traceback) where it cannot write."""
    tmpdir = os.environ.get("TMPDIR")
    if not tmpdir:
        return
    if not os.path.isdir(tmpdir):
        raise StreamerError(
            f"TMPDIR is {tmpdir}, which is not a folder: MLX writes its compiled kernels there. "
            "Create it, or unset TMPDIR."
        )
    import mlx.core as mx

    kernels = Path(tmpdir, "mlx", mx.__version__, "cpu")
    while not kernels.exists() and kernels != Path(tmpdir):
        kernels = kernels.parent
    if not os.access(kernels, os.W_OK | os.X_OK):  # its permissions, or a read-only disk
        raise StreamerError(
            f"TMPDIR is {tmpdir}, where {kernels} cannot be written: MLX writes its compiled "
            "kernels there. Fix its permissions, or set TMPDIR to a writable folder."
        )


def close_when_collected(owner: object, fds: dict | list) -> weakref.finalize:
    """Close the descriptors in `fds` (a container `owner` may still add to) once `owner` is
    garbage collected, or when the returned finalizer is called: a model dropped without
    `model.streamer.close()` must not keep its files open (mlx-lm lowers the process's limit to
    2048 descriptors when it is imported)."""
    return weakref.finalize(owner, _close_all, fds)


def _close_all(fds: dict | list) -> None:
    for fd in list(fds.values() if isinstance(fds, dict) else fds):
        with contextlib.suppress(OSError):
            os.close(fd)
    fds.clear()
