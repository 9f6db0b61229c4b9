"""Model assembly for a download streamed in place: an MLX-quantized checkpoint, no repack.

The same layers, read paths, budget and handle as a repacked model (load.py); only where the
experts lie differs (download.layouts: a handful of ranges per expert in the shards) and where the
checksums come from (the sidecar `streamer verify DIR --record` writes, io/checksums.py). Nothing
is written into the download folder.
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import TYPE_CHECKING

import mlx.nn as nn

from ..cache.budget import check_budget
from ..errors import StreamerError
from ..expert_traffic import ExpertStats
from ..experts import StreamingExperts
from ..families.architectures import expert_containers, replace_modules
from ..io.checkpoint import Checkpoint
from ..io.checksums import Checksums, default_sidecar, read_checksums
from ..io.expert_files import ExpertFiles
from ..io.integrity import file_stat, stat_change
from ..io.lock import lock_download_for_reading
from .assembly import apply_budget, load_resident
from .backend import check_backend_computes, check_model_kernels
from .download_folder import Download, layouts, open_download
from .handle import Streaming, compute_dtype, release
from .options import LoadOptions
from .tokenizer import load_tokenizer

if TYPE_CHECKING:  # transformers comes with it: imported where the tokenizer is built
    from mlx_lm.tokenizer_utils import TokenizerWrapper


def load_in_place(folder: Path, options: LoadOptions) -> tuple[nn.Module, TokenizerWrapper]:
    """streamer.load for a download folder (see load.load). `options.checksums`: the sidecar, by
    default under the user cache folder; used, when it exists, to refuse shards changed since it
    was recorded, and needed by `verify_reads`."""
    read_path, why = options.read_path, options.read_path_why
    memory_budget, dtype, verify_reads = options.memory_budget, options.dtype, options.verify_reads
    checksums = options.checksums
    lock = lock_download_for_reading(folder)  # `repack --delete-source` refuses while held
    try:
        download, model, resident = open_download(folder)
        sidecar = Path(checksums) if checksums is not None else default_sidecar(folder)
        recorded = _recorded(download, sidecar, verify_reads)
        check_backend_computes(download.layers, dtype)
        check_model_kernels(model)
        if memory_budget is not None:
            check_budget(download, memory_budget, dtype)
        placed = layouts(download)
        files = ExpertFiles(placed) if read_path == "mapped" else None  # slots: never mapped
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    pools = []
    crcs = (
        [tuple(map(tuple, recorded.experts[layer.module])) for layer in download.layers]
        if verify_reads
        else None
    )
    try:
        stats = ExpertStats(moe_layers=len(download.layers))
        streaming = {
            module: StreamingExperts(
                container,
                placed[index],
                stats,
                dtype,
                files=files,
                checksums=crcs[index] if crcs is not None else None,
            )
            for index, (module, container) in enumerate(expert_containers(model).items())
        }
        replace_modules(model, streaming)
        if verify_reads:
            _verify_resident(download, recorded)
        load_resident(
            model,
            resident,
            dtype,
            lambda e: (
                f"{folder}: the non-expert weights do not match the model ({e}); download "
                "the model again."
            ),
        )
        layers = list(streaming.values())
        residency, pools = apply_budget(
            read_path,
            download,
            placed,
            layers,
            memory_budget,
            dtype,
            crcs,
            options.bypass_page_cache,
        )
        tokenizer = load_tokenizer(folder, options.trust_remote_code)
    except BaseException:
        release(pools, files, lock)
        raise
    context = download.config.get("max_position_embeddings")
    residency = f"{residency}; read path {read_path} ({why})"
    handle = Streaming(
        residency,
        download,
        read_path,
        files,
        stats,
        layers,
        context,
        lock,
        pools,
        dtype=compute_dtype(model),
    )
    model.streamer = handle
    return model, tokenizer


def _recorded(download: Download, sidecar: Path, verify_reads: bool) -> Checksums | None:
    """The sidecar's checksums if it exists (the shards must be as when it was recorded), or
    None; `verify_reads` needs them."""
    recorded = read_checksums(sidecar)
    folder = download.folder
    if recorded is None:
        if verify_reads:
            raise StreamerError(
                f"verify_reads needs checksums of {folder}, and none are recorded ({sidecar}): "
                f"run `streamer verify {folder} --record` once first."
            )
        return None
    for shard in download.file_bytes:
        old = recorded.files.get(shard)
        if old is None or stat_change(old, file_stat(folder / shard)):
            raise StreamerError(
                f"{folder / shard} changed since its checksums were recorded in {sidecar}: run "
                f"`streamer verify {folder}` to check it, then `streamer verify {folder} --record` "
                "to record the files as they are now (or delete that file to ignore it)."
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
                    f"corrupt. Run `streamer verify {download.folder}` to list every bad tensor."
                )
