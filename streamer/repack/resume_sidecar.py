"""Resumable repacking: a sidecar in the `.DST.partial` folder records the work already finished.

The repacker records the resident file and each MoE layer only after that file is fsynced, so
whatever the sidecar lists is complete on disk, whenever the process was killed. `--resume`
continues an interrupted repack only if the source checkpoint and options are the ones it started
with (a hash of config.json, the tensor table and the options) and no file it read was written
since (a shard, hf_quant_config.json: its size and modification time, as a new revision of the
model may keep every size). A recorded file is kept only if it is what this run would write and
its bytes match the recorded crc32s (keep_verified): a damaged or edited sidecar costs the files
it misdescribes, never a published folder that load refuses.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import StreamerError
from ..io.checkpoint import Checkpoint
from ..io.durable import write_json_atomic
from ..io.json_file import read_json_object
from ..io.manifest import (
    FORMAT_VERSION,
    RESIDENT_FILE,
    Manifest,
    MoeLayer,
    layer_from_json,
    layer_to_json,
)
from ..io.tensor_crcs import verify_layer, verify_resident
from .recipe import Recipe
from .records import matches_recipe

SIDECAR_FILE = "progress.json"


@dataclass(frozen=True)
class SourceIdentity:
    """What an interrupted repack must find again to resume: `digest`, a hash of config.json, the
    tensor table and the options; `files`, each file read's [size, mtime_ns] by name
    (Checkpoint.file_stamps)."""

    digest: str
    files: dict[str, list[int] | None] = field(default_factory=dict)


def source_identity(ckpt: Checkpoint, options: dict) -> SourceIdentity:
    """What determines the repacked bytes: config.json, the tensor table, the options, and the
    bytes of the files read as their sizes and modification times tell them."""
    digest = hashlib.sha256()
    digest.update((ckpt.folder / "config.json").read_bytes())
    table = sorted(
        (
            name,
            info.path.name,
            info.dtype,
            list(info.shape),
            info.start,
            info.end,
            info.path.stat().st_size,
        )
        for name, info in ckpt.tensors.items()
    )
    digest.update(json.dumps([FORMAT_VERSION, options, table]).encode())
    return SourceIdentity(digest.hexdigest(), ckpt.file_stamps())


class OtherSource(StreamerError):
    """A resume refused: the source or the options are not those the interrupted repack started
    with (its work is of no use to this one)."""


class SourceChanged(OtherSource):
    """A source file written since the interrupted repack started: `file` names it."""

    def __init__(self, file: str):
        super().__init__(
            f"source file {file} changed since this repack started (its modification time or "
            "size differ: a new revision?), so its layers would mix with the ones written: "
            "restore that file, or rerun without --resume to start over."
        )
        self.file = file


def _check_files(recorded: dict | None, identity: SourceIdentity) -> None:
    """Refuse a file written, or one come or gone, since the repack started (a sidecar from
    before files were recorded has none to compare)."""
    if recorded is None:
        return
    for name in sorted(recorded.keys() | identity.files.keys()):
        now = identity.files.get(name, [])
        if now is not None and recorded.get(name, []) != now:  # None: a deleted shard's stand-in
            raise SourceChanged(name)


class ResumeSidecar:
    """What an (interrupted) repack into `folder` has finished: the resident file and MoE layers."""

    def __init__(self, folder: Path, identity: SourceIdentity):
        self.folder = Path(folder)
        self.identity = identity
        self.resident: dict[str, int] | None = None  # crc32 per resident tensor, once written
        self.layers: dict[int, MoeLayer] = {}

    @classmethod
    def load(cls, folder: Path, identity: SourceIdentity) -> ResumeSidecar | None:
        """The recorded sidecar (None if there is none); refuses one from another source or
        options."""
        path = Path(folder) / SIDECAR_FILE
        if not path.exists():
            return None
        state = read_json_object(path, "rerun without --resume to start over.")
        if state.get("source") != identity.digest:
            raise OtherSource(
                f"{folder} was started from a different checkpoint or with other options "
                "(config.json, the tensors or --quantize differ): rerun without --resume to start "
                "over."
            )
        sidecar = cls(folder, identity)
        resident, layers = state.get("resident"), state.get("layers", {})
        damaged = StreamerError(f"{path} is damaged: rerun without --resume to start over.")
        files = state.get("files")
        if files is not None and not isinstance(files, dict):
            raise damaged
        _check_files(files, identity)
        if resident is not None and not (
            isinstance(resident, dict)
            and all(type(crc) is int and 0 <= crc < 1 << 32 for crc in resident.values())
        ):
            raise damaged
        if not isinstance(layers, dict) or not all(
            isinstance(i, str) and i.isdigit() and len(i) < 6 for i in layers
        ):
            raise damaged
        sidecar.resident = resident
        for index, entry in layers.items():
            try:
                layer = layer_from_json(entry, path)
            except StreamerError:
                raise damaged from None
            if sidecar._complete(layer.file, layer.file_bytes):
                sidecar.layers[int(index)] = layer
        if sidecar.resident is not None and not (Path(folder) / RESIDENT_FILE).exists():
            sidecar.resident = None
        return sidecar

    def keep_verified(self, recipe: Recipe, log) -> None:
        """Forget any recorded file that is not what this recipe writes or whose bytes do not match
        their recorded crc32s (a damaged or hand-edited sidecar, a file changed since): it is
        written again, so a resumed repack never publishes what load would refuse. This reads
        the kept files once."""
        if self.resident is not None:
            names = {name for name, _ in recipe.resident_items()}
            kept = Manifest(recipe.config, self.resident, (), {})
            if set(self.resident) != names or verify_resident(self.folder, kept):
                log(f"[repack] {RESIDENT_FILE} does not match its record: writing it again")
                self.resident = None
        for index, layer in sorted(self.layers.items()):
            if not matches_recipe(recipe, index, layer) or verify_layer(self.folder, index, layer):
                log(f"[repack] layer {index + 1} does not match its record: writing it again")
                del self.layers[index]

    def _complete(self, file: str, size: int) -> bool:
        path = self.folder / file
        return path.exists() and path.stat().st_size == size

    @property
    def started(self) -> bool:
        return self.resident is not None

    def record_resident(self, crc32: dict[str, int]) -> None:
        self.resident = crc32
        self._save()

    def record_layer(self, index: int, layer: MoeLayer) -> None:
        self.layers[index] = layer
        self._save()

    def _save(self) -> None:
        state = {
            "source": self.identity.digest,
            "files": self.identity.files,
            "resident": self.resident,
            "layers": {str(i): layer_to_json(layer) for i, layer in sorted(self.layers.items())},
        }
        write_json_atomic(self.folder / SIDECAR_FILE, state)

    def remove(self) -> None:
        (self.folder / SIDECAR_FILE).unlink(missing_ok=True)
