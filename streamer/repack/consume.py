"""`repack --delete-source`: delete each source shard as soon as the repack no longer needs it.

A shard is deleted only once everything the repack takes from it is written, fsynced and recorded
in the progress sidecar: the resident file (which reads every shard) and every MoE layer with an
expert tensor in that shard. So the extra disk a repack needs at any moment is about what it has
written beyond what it has deleted: the resident file plus a shard or so, instead of the whole
model. Before a shard goes, a stand-in is kept in `.DST.partial/consumed/`: its header at the
shard's original size with the data left as a hole (a few KB on disk), so the tensor table, and
with it `--resume`, stays whole. A failure never deletes anything more, and the partial folder
that holds the only copy of deleted shards' data is never removed by a failure or a restart.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from ..errors import StreamerError
from ..io.checkpoint import Checkpoint
from ..io.durable import fsync_dir
from ..io.lock import FolderLock, lock_source_for_deleting
from ..io.sizes import size_text
from .recipe import Recipe
from .resume_sidecar import ResumeSidecar

CONSUMED = "consumed"


def stand_ins(partial: Path) -> dict[str, Path]:
    """The stand-ins of the shards an interrupted `--delete-source` repack has deleted."""
    folder = partial / CONSUMED
    return {p.name: p for p in sorted(folder.iterdir())} if folder.is_dir() else {}


def layers_by_shard(recipe: Recipe) -> dict[Path, set[int]]:
    """Every source shard -> the MoE layers (by index) with an expert tensor in it."""
    index = {module: i for i, module in enumerate(recipe.containers)}
    sources = recipe.sources
    needs: dict[Path, set[int]] = {info.path: set() for info in sources.ckpt.tensors.values()}
    for (module, _, _), info in sources.stacked.items():
        needs[info.path].add(index[module])
    for (module, _, _), per in sources.per_expert.items():
        for info in per.values():
            needs[info.path].add(index[module])
    for module, group in sources.fused.items():
        for info in group.values():
            needs[info.path].add(index[module])
    return needs


def disk_peaks(
    recipe: Recipe, sidecar: ResumeSidecar, layer_bytes: list[int], resident_bytes: int
) -> tuple[int, int]:
    """The most disk the rest of the repack takes beyond what is already written: keeping the
    source, and deleting each shard once consumed (the resident file first, then layer by layer,
    `layer_bytes` each)."""
    needs = layers_by_shard(recipe)
    sizes = {
        path: path.stat().st_size
        for path in needs
        if path.name not in recipe.sources.ckpt.stand_ins
    }
    done = set(sidecar.layers)
    steps = ([] if sidecar.resident is not None else [(None, resident_bytes)]) + [
        (i, size) for i, size in enumerate(layer_bytes) if i not in done
    ]
    keep = sum(size for _, size in steps)
    extra = peak = 0
    for layer, size in steps:
        extra += size
        peak = max(peak, extra)
        if layer is not None:
            done.add(layer)
        for path in [p for p in sizes if needs[p] <= done]:
            extra -= sizes.pop(path)
    return keep, peak


class SourceConsumer:
    """Deletes the source shards of `ckpt` as the repack into `partial` records its progress."""

    def __init__(self, ckpt: Checkpoint, recipe: Recipe, partial: Path, log):
        self.ckpt, self.partial, self.log = ckpt, partial, log
        self.needs = layers_by_shard(recipe)
        self._lock: FolderLock | None = lock_source_for_deleting(ckpt.folder)
        for path in self.needs:
            if path.name in ckpt.stand_ins:
                continue
            if path.is_symlink() or path.stat().st_nlink > 1:
                self.release()
                raise StreamerError(
                    f"{path} is a link (a Hugging Face cache snapshot?): deleting it would free no "
                    "space. Repack without --delete-source and delete the download afterwards "
                    "(e.g. `huggingface-cli delete-cache`), or download with --local-dir."
                )
        if not os.access(ckpt.folder, os.W_OK):
            self.release()
            raise StreamerError(
                f"{ckpt.folder} is not writable: --delete-source cannot delete its shards."
            )

    def collect(self, sidecar: ResumeSidecar) -> None:
        """Delete every shard whose data is all recorded in `sidecar` (none before the resident
        file, which reads from every shard)."""
        if sidecar.resident is None:
            return
        for path, layers in self.needs.items():
            if path.name in self.ckpt.stand_ins or not layers <= sidecar.layers.keys():
                continue
            self._stand_in(path)
            self.ckpt.release(path)
            size = path.stat().st_size
            path.unlink()
            fsync_dir(self.ckpt.folder)
            self.log(
                f"[repack] deleted source shard {path.name} ({size_text(size)}): "
                "all of its data is written"
            )

    def _stand_in(self, path: Path) -> None:
        folder = self.partial / CONSUMED
        folder.mkdir(exist_ok=True)
        with open(path, "rb") as f:
            head = f.read(8)
            header = head + f.read(struct.unpack("<Q", head)[0])
            size = os.fstat(f.fileno()).st_size
        tmp = folder / f".{path.name}.tmp"
        with open(tmp, "wb") as f:
            f.write(header)
            f.truncate(size)  # a hole: the table's offsets stay valid, the disk holds the header
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, folder / path.name)
        fsync_dir(folder)
        self.ckpt.stand_ins[path.name] = folder / path.name

    def release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None
