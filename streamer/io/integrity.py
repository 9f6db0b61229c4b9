"""Is a repacked folder still what the repacker wrote? The cheap checks made at every load.

Every data file exists with the size the manifest implies and, when the manifest recorded them,
the same size and modification time as when it was written (a file edited, truncated or
half-copied since is refused, naming it). `streamer verify` recomputes every crc32
(tensor_crcs.py).
"""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import StreamerError
from .copy_check import sample_matches
from .files import open_regular
from .manifest import RESIDENT_FILE, Manifest

# FAT/exFAT keep file times to 2 s, and a disk remounted later reports the rounded time: a file
# is "changed" when its size differs or its time moved by more than that.
MTIME_TOLERANCE_NS = 2_000_000_000


def file_stat(path: Path) -> dict[str, int]:
    st = os.stat(path)
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def stat_change(recorded: dict[str, int], now: dict[str, int] | None) -> str | None:
    """What differs between a file's recorded and current size and time: "size",
    "modification time" or None."""
    if now is None or now["size"] != recorded["size"]:
        return "size"
    if abs(now["mtime_ns"] - recorded["mtime_ns"]) > MTIME_TOLERANCE_NS:
        return "modification time"
    return None


def data_files(manifest: Manifest) -> list[str]:
    """Relative paths of the files holding weights: the resident file and one per MoE layer."""
    return [RESIDENT_FILE, *(layer.file for layer in manifest.layers)]


def check_files(folder: Path, manifest: Manifest) -> None:
    """Refuse a folder whose data files are missing, of the wrong size, or changed since
    repacking."""
    folder = Path(folder)
    for index, layer in enumerate(manifest.layers):
        path = folder / layer.file
        size = file_size(path, f"the expert file of MoE layer {index} ({layer.module})")
        check_expert_file_size(path, size, layer.file_bytes, f"MoE layer {index} ({layer.module})")
    file_size(folder / RESIDENT_FILE, "the non-expert weights")
    for name, recorded in manifest.files.items():
        what = stat_change(recorded, recorded_stat(folder / name))
        if what == "size":
            raise StreamerError(
                f"{folder / name} changed after it was repacked (its size differs from the one "
                "recorded in manifest.json); repack the model."
            )
        if what and not sample_matches(folder, manifest, name):  # a new time: copied, or edited?
            raise StreamerError(
                f"{folder / name} changed after it was repacked (its modification time differs "
                "from the one recorded in manifest.json and sampled checksums do not match); "
                f"repack the model (`streamer verify {folder}` names each bad tensor)."
            )


def recorded_stat(path: Path) -> dict[str, int]:
    """file_stat of a file the manifest's "files" lists: one it lists but the folder lacks (a
    hand-edited manifest) was a FileNotFoundError traceback at load."""
    try:
        return file_stat(path)
    except OSError as e:
        raise StreamerError(
            f"{path}, recorded in manifest.json, cannot be read ({e.strerror or e}); "
            "repack the model."
        ) from None


def check_expert_file_size(
    path: Path, size: int, expected: int, layer: str, remedy: str = "repack the model"
) -> None:
    """Refuse an expert file whose size is not the one the manifest (or the download's header)
    implies for `layer`."""
    if size != expected:
        source = "the manifest" if remedy == "repack the model" else "the download's headers"
        raise StreamerError(
            f"{path} holds {size} bytes but {source} expects {expected} for {layer}: "
            f"the file is truncated or was changed; {remedy}."
        )


def file_size(path: Path, what: str) -> int:
    try:
        fd = open_regular(path, what)
    except FileNotFoundError:
        raise StreamerError(f"{path} is missing: it holds {what}; repack the model.") from None
    except OSError as e:
        raise StreamerError(
            f"cannot open {path} ({what}): {e.strerror or e}; repack the model."
        ) from e
    try:
        return os.fstat(fd).st_size
    finally:
        os.close(fd)
