"""The `.DST.partial` folder a repack writes into: opened (or picked up to resume), checked for
space, renamed into place when complete, and kept or removed after a failure."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

from ..errors import StreamerError
from ..io.checkpoint import INDEX_FILE, TOKENIZER_FILES, has_tokenizer_files
from ..io.durable import fsync_dir, next_step, write_failure
from ..io.files import check_utf8_path
from ..io.json_file import encode_tagged_floats, read_json_object
from ..io.lock import lock_directory, repack_in_use
from ..io.manifest import FORMAT, MANIFEST_FILE
from ..io.sizes import size_text
from .consume import stand_ins
from .resume_sidecar import ResumeSidecar, SourceChanged, SourceIdentity

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".msgpack", ".h5", ".ckpt")


NAME_MAX = 255  # bytes in one name on Linux's and macOS's file systems


def partial_folder(dst: Path) -> Path:
    return dst.parent / f".{dst.name}.partial"


def check_name_lengths(dst: Path) -> None:
    """Every name in `dst`, and the partial folder's beside it, within NAME_MAX bytes: past it
    the first look at the path raised OSError (a traceback), and nothing could be written."""
    names = [*dst.absolute().parts, partial_folder(dst).name]
    long = next((name for name in names if len(os.fsencode(name)) > NAME_MAX), None)
    if long is not None:
        raise StreamerError(
            f"{dst}: the name {long[:24]}... is over {NAME_MAX} bytes (counting the .partial "
            "folder repack writes beside it): choose a shorter destination."
        )


# A partial folder holding the source shards --delete-source deleted can neither resume nor, as the
# sidecar's errors advise, start over
ONLY_COPY = (
    "{partial} cannot resume ({why}) and holds the only copy of source shards deleted by "
    "--delete-source, so it cannot start over: {fix}"
)
FRESH = "delete that folder and download the model again"  # else it refuses every repack


def open_partial(
    partial: Path, identity: SourceIdentity, resume: bool, log
) -> tuple[int | None, ResumeSidecar]:
    """Lock the `.DST.partial` folder against other repacks and pick up its sidecar if resuming."""
    check_not_in_the_way(partial)
    if partial.exists():
        fd = lock_directory(partial)
        try:
            sidecar = ResumeSidecar.load(partial, identity) if resume else None
        except StreamerError as e:
            if fd is not None:
                os.close(fd)
            if not stand_ins(partial):
                raise
            why = "its progress.json is damaged, or was written for other sources or options"
            fix = f"rerun the command that started it, with its options; else {FRESH}."
            if isinstance(e, SourceChanged):
                why = f"source file {e.file} changed since it started"
                fix = f"restore that file as it was; else {FRESH}."
            raise StreamerError(ONLY_COPY.format(partial=partial, why=why, fix=fix)) from e
        except BaseException:
            if fd is not None:
                os.close(fd)
            raise
        if sidecar is not None:
            log(f"[repack] resuming {partial}: {len(sidecar.layers)} MoE layer(s) already done")
            return fd, sidecar
        if stand_ins(partial):  # its progress file gone by hand: never remove the only copy
            if fd is not None:
                os.close(fd)
            why, fix = "it has no progress.json", f"{FRESH} to repack it."
            raise StreamerError(ONLY_COPY.format(partial=partial, why=why, fix=fix))
        log(
            f"[repack] removing the unfinished repack in {partial}"
            + ("" if resume else " (--resume continues one)")
        )
        shutil.rmtree(partial)
        if fd is not None:
            os.close(fd)
    elif resume:
        log("[repack] nothing to resume: starting from the beginning")
    make_partial(partial)
    return lock_directory(partial), ResumeSidecar(partial, identity)


def check_not_in_the_way(partial: Path) -> None:
    """Refuse a `.DST.partial` that is not unfinished work of ours: a file, a link, or a folder
    with files but no experts/ (which ours hold from the start): someone else's, not removed."""
    if os.path.lexists(partial) and (partial.is_symlink() or not partial.is_dir()):
        raise StreamerError(
            f"{partial} is in the way: it is a file, not an unfinished repack; remove it."
        )
    if partial.is_dir() and not (partial / "experts").is_dir() and any(partial.iterdir()):
        what = "a folder without experts/, not an unfinished repack"
        raise StreamerError(f"{partial} is in the way: it is {what}; move it away.")


def make_partial(partial: Path) -> None:
    """Create `.DST.partial/experts`; a disk that refuses (read-only, no permission, a parent
    that is a file) is one line."""
    try:
        (partial / "experts").mkdir(parents=True)
    except FileExistsError:  # made by another repack into the same destination, just now
        raise repack_in_use(partial) from None
    except OSError as e:
        raise StreamerError(
            f"cannot create {partial}: {e.strerror or e}; choose a destination on a writable "
            "disk, or fix the permissions of its folder."
        ) from e


def check_free_space(partial: Path, left: int) -> None:
    """Refuse up front when the disk cannot hold the `left` bytes still to write."""
    free = shutil.disk_usage(partial).free
    if left > free:
        raise StreamerError(
            f"not enough disk space in {partial.parent}: the repacked model needs about "
            f"{size_text(left)} more, {size_text(free)} is free. Free space or choose a "
            "destination on another disk."
        )


def failed(
    error: BaseException,
    partial: Path,
    sidecar: ResumeSidecar,
    num_layers: int,
    needed_bytes: int,
    log,
) -> BaseException:
    """Keep the finished work after an interruption, an I/O error (disk full...) or a crash so that
    --resume continues it; delete it after a StreamerError (bad input: nothing worth keeping).
    Returns the error to raise: an OSError becomes a StreamerError saying what to do."""
    consumed = stand_ins(partial) if partial.exists() else {}
    keep = consumed or (not isinstance(error, StreamerError) and sidecar.started)
    if not keep or not partial.exists():
        shutil.rmtree(partial, ignore_errors=True)
        if isinstance(error, OSError):  # the first file failed: nothing is left to resume
            return _io_failed(error, partial, needed_bytes, "run the same command again.")
        return error
    done = f"{len(sidecar.layers)}/{num_layers} MoE layers are kept in {partial}"
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
    return _io_failed(error, partial, needed_bytes, f"{again}. ({done}.)")


def _io_failed(error: OSError, partial: Path, needed_bytes: int, then: str) -> StreamerError:
    why, fix = write_failure(error, partial.parent)
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        why += f" (the repacked model needs about {size_text(needed_bytes)} in all)"
    return StreamerError(f"repacking failed: {why}. {next_step(fix, then)}")


def warn_without_tokenizer(src: Path, log) -> None:
    """A repacked model without tokenizer files loads nowhere: say so before the long write."""
    if not has_tokenizer_files(src):
        log(
            f"[repack] warning: {src} has no tokenizer files ({', '.join(TOKENIZER_FILES)}): "
            "the repacked model cannot be loaded until you copy them from the original model "
            "into the destination."
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
        json.dump(encode_tagged_floats(dict(sorted(config.items()))), f, indent=2)


def check_destination(src: Path, dst: Path, force: bool) -> None:
    """`--force` replaces only a complete streamer output that is neither SRC nor around it."""
    try:
        source, target = src.resolve(), dst.resolve()
    except (OSError, RuntimeError) as e:  # a symlink loop on the way
        raise StreamerError(f"cannot resolve {dst} or {src}: {e}; check the paths.") from e
    if target == source or source in target.parents or target in source.parents:
        raise StreamerError(
            f"{dst} is the source folder, inside it or around it ({src}): choose a destination "
            "outside the source."
        )
    if target.parent.exists() and not target.parent.is_dir():
        raise StreamerError(f"{dst.parent} is a file, not a folder: choose another destination.")
    check_utf8_path(dst, "the destination")
    if not os.path.lexists(dst):
        return
    if not force:
        raise StreamerError(
            f"{dst} already exists: choose another destination or pass --force to replace it."
        )
    if not is_streamer_output(dst):
        raise StreamerError(
            f"{dst} is not a folder written by `streamer repack` (no streamer manifest.json): "
            "--force replaces only those. Remove it yourself if it should go."
        )


def is_streamer_output(folder: Path) -> bool:
    """A directory (not a link) with a streamer manifest: what --force may replace."""
    if folder.is_symlink() or not folder.is_dir():
        return False
    try:
        return read_json_object(folder / MANIFEST_FILE, "").get("format") == FORMAT
    except StreamerError:
        return False


def publish(partial: Path, dst: Path, replace: bool = False) -> None:
    """Rename the complete `partial` folder to `dst`, durably. With `replace`, an old streamer
    output at `dst` is moved aside and deleted; anything else found there (a folder created
    while the repack ran) is left alone and the repack fails, keeping its work for --resume."""
    fsync_dir(partial / "experts")
    fsync_dir(partial)
    old = dst.parent / f".{dst.name}.old"
    if os.path.lexists(dst):
        if not (replace and is_streamer_output(dst)):
            raise FileExistsError(
                errno.EEXIST,
                "it appeared while repacking and was left alone; move it away",
                str(dst),
            )
        if os.path.lexists(old):  # left by a repack killed while publishing
            if not is_streamer_output(old):
                raise FileExistsError(errno.EEXIST, "it is in the way; move it away", str(old))
            shutil.rmtree(old)
        os.replace(dst, old)
    os.replace(partial, dst)
    fsync_dir(dst.parent)
    shutil.rmtree(old, ignore_errors=True)
