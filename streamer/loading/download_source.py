"""Model assembly for a download streamed in place: an MLX-quantized checkpoint, no repack.

The same layers, read paths, budget and handle as a repacked model (load.py); only where the
experts lie differs (download.layouts: a handful of ranges per expert in the shards) and where the
checksums come from (the sidecar `streamer verify DIR --record` writes, io/checksums.py). Nothing
is written into the download folder.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import mlx.core as mx

from ..errors import StreamerError, refusal
from ..io.checkpoint import Checkpoint
from ..io.checksums import Checksums, default_sidecar, read_checksums
from ..io.expert_files import ExpertFiles
from ..io.integrity import file_stat, stat_change
from ..io.lock import lock_download_for_reading
from .download_folder import Download, layouts, open_download
from .hub import hub_name
from .options import LoadOptions
from .source import Source


def open_download_source(folder: Path, options: LoadOptions) -> Source:
    """The download read-locked while the model lives (`repack --delete-source` refuses), its
    index and headers checked against mlx-lm's model (download_folder.py). `options.checksums`:
    the sidecar, by default under the user cache folder; used, when it exists, to refuse shards
    changed since it was recorded, and needed by `verify_reads`."""
    if options.group is not None:
        raise StreamerError(
            f"{folder} is a download: expert-parallel runs need a repacked folder on every "
            "rank. Run `streamer repack` (and `streamer split` for each rank's share) first."
        )
    lock = lock_download_for_reading(folder)
    try:
        download, model, resident = open_download(folder)
        sidecar = options.checksums or default_sidecar(folder)
        recorded = _recorded(download, sidecar, options.verify_reads)
        placed = layouts(download)
    except BaseException:
        if lock is not None:
            lock.release()
        raise

    def resident_weights() -> dict[str, mx.array]:
        if options.verify_reads:
            _verify_resident(download, recorded)
        return resident

    return Source(
        folder=folder,
        contents=download,
        config=download.config,
        model=model,
        layouts=placed,
        lock=lock,
        checksums=[tuple(map(tuple, recorded.experts[layer.module])) for layer in download.layers]
        if options.verify_reads
        else None,
        shares=[None] * len(placed),
        open_files=lambda: ExpertFiles(placed),  # the slot path never maps them
        resident_weights=resident_weights,
        mismatch=lambda e: (
            f"{folder}: the non-expert weights do not match the model ({e}); download the "
            "model again."
        ),
    )


def _recorded(download: Download, sidecar: Path, verify_reads: bool) -> Checksums | None:
    """The sidecar's checksums if it exists (the shards must be as when it was recorded), or
    None; `verify_reads` needs them."""
    recorded = read_checksums(sidecar)
    folder = download.folder
    if recorded is None:
        if verify_reads:
            raise refusal(
                lambda spell: (
                    f"{spell('verify_reads')} needs checksums of {folder}, and none are recorded "
                    f"({sidecar}): run `streamer verify {hub_name(folder)} --record` once first."
                )
            )
        return None
    for shard in download.file_bytes:
        old = recorded.files.get(shard)
        if old is None or stat_change(old, file_stat(folder / shard)):
            raise StreamerError(
                f"{folder / shard} changed since its checksums were recorded in {sidecar}: run "
                f"`streamer verify {hub_name(folder)}` to check it, then `streamer verify "
                f"{hub_name(folder)} --record` to record the files as they are now (or delete that "
                "file to ignore it)."
            )
    if any(
        len(crcs := recorded.experts.get(layer.module, ())) != layer.num_experts
        or any(len(tensors) != len(layer.tensors) for tensors in crcs)  # each tensor checked
        for layer in download.layers
    ):
        raise StreamerError(
            f"{sidecar} does not describe {folder}'s experts: delete it and record it again."
        )
    return recorded


def _verify_resident(download: Download, recorded: Checksums) -> None:
    with Checkpoint(download.folder) as ckpt:
        for name in download.resident:
            info = ckpt.tensors[name]
            if zlib.crc32(ckpt.read(info)) != recorded.resident.get(name):
                raise StreamerError(
                    f"{info.path}: tensor '{name}' does not match its checksum: the file is "
                    f"corrupt. Run `streamer verify {hub_name(download.folder)}` to list every "
                    "bad tensor."
                )
