"""Model assembly: an mlx-lm model whose MoE layers stream their experts from a repacked folder."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import mlx.core as mx
import mlx.nn as nn

from ..cache.budget import check_budget
from ..errors import StreamerError
from ..expert_traffic import ExpertStats
from ..experts import StreamingExperts
from ..experts.parallel import ExpertShare
from ..families.architectures import (
    build_model,
    expert_containers,
    quantize_like_mlx_lm,
    replace_modules,
)
from ..families.config import check_config, check_layer_count
from ..io.expert_files import ExpertFiles, open_repacked
from ..io.expert_layout import LayerLayout, repacked_layout
from ..io.files import check_folder_files, check_tmpdir, check_utf8_path
from ..io.integrity import check_files
from ..io.lock import lock_for_reading
from ..io.manifest import MANIFEST_FILE, RESIDENT_FILE, Manifest, read_manifest
from ..io.safetensors import read_header
from ..io.tensor_crcs import verify_resident
from ..parallel.group import expert_shares
from .assembly import apply_budget, load_resident
from .backend import check_backend_computes, check_model_kernels
from .download_folder import is_download
from .handle import Streaming, compute_dtype, release
from .hub import is_repo_id, streamable
from .manifest_layers import check_layer, quantized
from .options import LoadOptions, load_options
from .tokenizer import load_tokenizer

if TYPE_CHECKING:  # mlx_lm.tokenizer_utils imports transformers: seconds, paid where a
    # tokenizer is built (tokenizer.py), not by a load refused before that
    from mlx_lm.tokenizer_utils import TokenizerWrapper


def load(
    path: str | Path,
    *,
    memory_budget: int | None = None,
    dtype: mx.Dtype | None = None,
    read_path: str | None = None,
    bypass_page_cache: bool = False,
    verify_reads: bool = False,
    trust_remote_code: bool = False,
    group: mx.distributed.Group | None = None,
    checksums: str | Path | None = None,
) -> tuple[nn.Module, TokenizerWrapper]:
    """Load a repacked model, or an MLX-quantized download in place (load_in_place.py): non-expert
    weights resident, experts streamed from disk. `path` may be org/name (loading/hub.py).

    `memory_budget`: bytes of experts to keep in memory. Enough for all of them: every layer runs
    resident (no syncs, no reads); less: the hottest experts are cached (LFU with aging) and the
    rest stream; 0: everything streams through the page cache. None: all experts if they fit in
    half the available memory, else 0. `model.streamer.residency` says what was chosen.
    `read_path`: "mapped" computes in place on the mapped expert files (the CPU default);
    "slots" reads experts into a bounded slot pool of `memory_budget` bytes and computes there
    (the Metal and CUDA default; a budget of 0 gives one layer's experts per shape class).
    `bypass_page_cache`: the slot path reads around the page cache (O_DIRECT on Linux, F_NOCACHE
    on macOS) instead of through it; off by default (bench/README.md says why).
    Returns an mlx-lm model (usable with mlx_lm.generate / generate_step) and its tokenizer;
    `model.streamer` (handle.Streaming) holds the streaming side: stats, files, `close()`.
    Sizes, file times and the layout are always checked; `verify_reads` also checks the crc32 of
    the non-expert weights now and of each expert whenever its bytes come from the disk (its first
    read, and again after the page cache dropped them; the slot path: every read).
    `trust_remote_code` lets a tokenizer that ships its own Python code (Kimi K2's) run it.
    `group` (an mx.distributed group of several ranks, e.g. `mx.distributed.init()` under
    mlx.launch): run expert-parallel, each rank computing its share of every layer's experts (the
    folder is a shard written by `streamer split`, or the full model, shared out by interleaving).
    Every rank must call load, and then run the same computations in the same order.
    `checksums`: a download's checksum sidecar, if not the default one (io/checksums.py).
    """
    options = load_options(
        memory_budget=memory_budget,
        dtype=dtype,
        read_path=read_path,
        bypass_page_cache=bypass_page_cache,
        verify_reads=verify_reads,
        trust_remote_code=trust_remote_code,
        group=group,
        checksums=checksums,
    )
    return load_decided(path, options)


def load_decided(path: str | Path, options: LoadOptions) -> tuple[nn.Module, TokenizerWrapper]:
    """`load` with its options already decided (the CLI decides them from its flags)."""
    if not isinstance(path, (str, os.PathLike)):
        raise StreamerError(f"path must be a folder name (str or Path), got {path!r}.")
    folder = streamable(path) if is_repo_id(path) else Path(path)  # org/name: pulled or cached
    check_utf8_path(folder, "the model folder")
    check_tmpdir()
    if is_download(folder):
        if options.group is not None:
            raise StreamerError(
                f"{folder} is a download: expert-parallel runs need a repacked folder on every "
                "rank. Run `streamer repack` (and `streamer split` for each rank's share) first."
            )
        from .load_in_place import load_in_place

        return load_in_place(folder, options)
    dtype, verify_reads, group = options.dtype, options.verify_reads, options.group
    read_path, why = options.read_path, options.read_path_why
    memory_budget = options.memory_budget
    manifest = read_manifest(folder)
    folder_lock = lock_for_reading(folder)  # held while the model lives: `repack --force` refuses
    check_folder_files(folder, "a file of the repacked model")
    check_files(folder, manifest)
    config = check_config(manifest.config, folder / MANIFEST_FILE)
    tokenizer = load_tokenizer(folder, options.trust_remote_code)  # before the slow part: fail fast
    resident_path = folder / RESIDENT_FILE
    names = read_header(resident_path)  # clear errors for a truncated or corrupt file
    if set(names) != set(manifest.resident_crc32):
        raise StreamerError(
            f"{resident_path} holds other tensors than manifest.json lists; repack the model."
        )
    modules = [layer.module + "." for layer in manifest.layers]
    check_layer_count(config, [*names, *modules], folder / MANIFEST_FILE)
    model = build_model(config, folder / MANIFEST_FILE)
    containers = expert_containers(model)
    modules = [layer.module for layer in manifest.layers]
    if list(containers) != modules:
        raise StreamerError(
            f"{folder / MANIFEST_FILE} lists MoE layers {modules[:3]}... but the model has "
            f"{list(containers)[:3]}...: the manifest does not match its config; repack the model."
        )
    check_backend_computes(manifest.layers, dtype)
    check_model_kernels(model)
    if memory_budget is not None:
        check_budget(manifest, memory_budget, dtype)
    layouts = [repacked_layout(folder, i, layer) for i, layer in enumerate(manifest.layers)]
    files = open_repacked(folder, manifest) if read_path == "mapped" else None
    pools = []
    try:
        stats, layers = _assemble(
            folder, manifest, config, model, containers, layouts, files, dtype, verify_reads, group
        )
        checksums = [layer.expert_crc32 for layer in manifest.layers] if verify_reads else None
        residency, pools = apply_budget(
            read_path,
            manifest,
            layouts,
            layers,
            memory_budget,
            dtype,
            checksums,
            options.bypass_page_cache,
        )
    except BaseException:
        release(pools, files, folder_lock)
        raise
    residency = f"{residency}; read path {read_path} ({why})"
    context = config.get("max_position_embeddings")
    model.streamer = Streaming(
        residency,
        manifest,
        read_path,
        files,
        stats,
        layers,
        context,
        folder_lock,
        pools,
        dtype=compute_dtype(model),
    )
    return model, tokenizer


def _assemble(
    folder: Path,
    manifest: Manifest,
    config: dict,
    model: nn.Module,
    containers: dict[str, nn.Module],
    layouts: list[LayerLayout],
    files: ExpertFiles | None,
    dtype: mx.Dtype | None,
    verify_reads: bool,
    group: mx.distributed.Group | None,
) -> tuple[ExpertStats, list[StreamingExperts]]:
    """Streaming layers in place of the expert containers, then the resident weights."""
    totals = []
    for index, container in enumerate(containers.values()):
        layer = manifest.layers[index]
        for projection, params in layer.quantization.items():
            if params:
                container[projection] = quantized(container, projection, params, folder)
        totals.append(check_layer(folder, index, layer, container))
    records = expert_shares(group, folder, manifest, totals)  # every rank's folder checked
    stats = ExpertStats(moe_layers=len(containers))
    streaming: dict[str, StreamingExperts] = {}
    for index, (module_path, container) in enumerate(containers.items()):
        layer = manifest.layers[index]
        checksums = layer.expert_crc32 if verify_reads else None
        share = None if records is None else ExpertShare(records[index], group, layer.expert_ids)
        streaming[module_path] = StreamingExperts(
            container, layouts[index], stats, dtype, files=files, checksums=checksums, share=share
        )
    replace_modules(model, streaming)
    resident_path = folder / RESIDENT_FILE
    if verify_reads:
        problems = verify_resident(folder, manifest)
        if problems:
            raise StreamerError(
                f"{folder / problems[0].file}: {problems[0].what}: the file is corrupt; "
                "repack the model."
            )
    weights = mx.load(str(resident_path))
    quantize_like_mlx_lm(model, config, weights)
    load_resident(
        model,
        weights,
        dtype,
        lambda e: f"{resident_path} does not match the model: {e}; repack the model.",
    )
    return stats, list(streaming.values())
