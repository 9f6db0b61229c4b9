"""The `.DST.partial` folder a repack writes into: opened (or picked up to resume), checked for
space, renamed into place when complete, and kept or removed after a failure."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

from ..errors import StreamerError
from ..io.checkpoint import INDEX_FILE
from ..io.durable import fsync_dir
from ..io.lock import lock_directory
from .consume import stand_ins
from .progress import Progress

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5", ".ckpt")


def partial_folder(dst: Path) -> Path:
    return dst.parent / f".{dst.name}.partial"


def open_partial(partial: Path, identity: str, resume: bool, log) -> tuple[int | None, Progress]:
    """Lock the `.DST.partial` folder against other repacks and pick up its progress if resuming."""
    if partial.exists():
        fd = lock_directory(partial, "writing the same destination")
        try:
            progress = Progress.load(partial, identity) if resume else None
        except BaseException:
            if fd is not None:
                os.close(fd)
            raise
        if progress is not None:
            log(f"[repack] resuming {partial}: {len(progress.layers)} MoE layer(s) already done")
            return fd, progress
        log(
            f"[repack] removing the unfinished repack in {partial}"
            + ("" if resume else " (--resume continues one)")
        )
        shutil.rmtree(partial)
        if fd is not None:
            os.close(fd)
    elif resume:
        log("[repack] nothing to resume: starting from the beginning")
    (partial / "experts").mkdir(parents=True)
    return lock_directory(partial, "writing the same destination"), Progress(partial, identity)


def check_free_space(partial: Path, left: int) -> None:
    """Refuse up front when the disk cannot hold the `left` bytes still to write."""
    free = shutil.disk_usage(partial).free
    if left > free:
        raise StreamerError(
            f"not enough disk space in {partial.parent}: the repacked model needs about "
            f"{left / 1e9:.2f} GB more, {free / 1e9:.2f} GB is free. Free space or choose a "
            "destination on another disk."
        )


def failed(
    error: BaseException,
    partial: Path,
    progress: Progress,
    num_layers: int,
    needed_bytes: int,
    log,
) -> BaseException:
    """Keep the finished work after an interruption, an I/O error (disk full...) or a crash so that
    --resume continues it; delete it after a StreamerError (bad input: nothing worth keeping).
    Returns the error to raise: an OSError becomes a StreamerError saying what to do."""
    consumed = stand_ins(partial) if partial.exists() else {}
    keep = consumed or (not isinstance(error, StreamerError) and progress.started)
    if not keep or not partial.exists():
        shutil.rmtree(partial, ignore_errors=True)
        return error
    done = f"{len(progress.layers)}/{num_layers} MoE layers are kept in {partial}"
    again = (
        f"run the same command with --resume to continue (or delete {partial} to reclaim its space)"
    )
    if consumed:
        done += f" (with all the data of the {len(consumed)} source shard(s) deleted so far)"
        again = "run the same command with --resume to continue"
    if not isinstance(error, OSError):
        what = "interrupted" if isinstance(error, KeyboardInterrupt) else "failed"
        log(f"[repack] {what}: {done}; {again}.")
        return error
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return StreamerError(
            f"the disk holding {partial.parent} is full: the repacked model needs about "
            f"{needed_bytes / 1e9:.2f} GB in all. Free space, then {again}. ({done}.)"
        )
    where = f" ({error.filename})" if error.filename else ""
    return StreamerError(
        f"repacking failed with an I/O error: {error.strerror or error}{where}. {done}; {again}."
    )


def copy_side_files(src: Path, out: Path) -> None:
    """Tokenizer, generation config, chat template...: every small file that is not weights."""
    for path in src.iterdir():
        if (
            path.is_file()
            and path.name not in ("config.json", INDEX_FILE)
            and not path.name.endswith(WEIGHT_SUFFIXES)
        ):
            shutil.copy2(path, out / path.name)


def write_config(out: Path, config: dict) -> None:
    with open(out / "config.json", "w", encoding="utf-8") as f:
        json.dump(dict(sorted(config.items())), f, indent=2)


def publish(partial: Path, dst: Path) -> None:
    """Rename the complete `partial` folder to `dst` (replacing an old one), durably."""
    fsync_dir(partial / "experts")
    fsync_dir(partial)
    old = dst.parent / f".{dst.name}.old"
    if dst.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(dst, old)
    os.replace(partial, dst)
    fsync_dir(dst.parent)
    shutil.rmtree(old, ignore_errors=True)
