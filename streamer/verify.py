"""`streamer verify`: recompute every checksum of a repacked folder and name each bad tensor."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

from .io.integrity import Problem, data_files, file_stat, stat_change, verify_folder
from .io.lock import lock_for_replacing
from .io.manifest import read_manifest, write_manifest


def verify(
    folder: str | Path,
    *,
    refresh: bool = False,
    log=lambda msg: print(msg, file=sys.stderr, flush=True),
) -> list[Problem]:
    """Every problem found in `folder` (empty: all data matches the manifest).

    Files whose contents all check out but whose size or time differ from the manifest's record
    (a copy that did not keep file times) are problems too, since load refuses them; `refresh`
    records their current size and time instead, so the folder loads again.
    """
    folder = Path(folder)
    manifest = read_manifest(folder)
    problems = verify_folder(folder, manifest, log)
    stale = [
        name
        for name, recorded in manifest.files.items()
        if stat_change(recorded, _stat(folder / name))
    ]
    if (
        refresh and not problems and (stale or not manifest.files)
    ):  # older manifests have no record yet
        lock = lock_for_replacing(
            folder
        )  # no model may be loaded from it while its manifest changes
        try:
            files = {name: file_stat(folder / name) for name in data_files(manifest)}
            write_manifest(folder, dataclasses.replace(manifest, files=files))
        finally:
            if lock is not None:
                lock.release()
        log(f"[verify] recorded the current size and time of {len(files)} file(s) in manifest.json")
    elif stale:
        problems += [
            Problem(
                name,
                "changed after repack (size or time differs from manifest.json); if its checksums "
                "pass, `streamer verify --refresh` records the new time",
            )
            for name in stale
        ]
    return problems


def _stat(path: Path) -> dict[str, int] | None:
    try:
        return file_stat(path)
    except OSError:
        return None
