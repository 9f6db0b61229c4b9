"""`streamer.load`: an mlx-lm model whose MoE layers stream their experts from a repacked folder
or a download, assembled in one order whichever the source (source.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import mlx.core as mx
import mlx.nn as nn

from ..cache.budget import check_budget
from ..cpu_cores import split_linears
from ..errors import ArgumentError, StreamerError
from ..expert_traffic import ExpertStats
from ..experts import StreamingExperts
from ..families.architectures import expert_containers, replace_modules
from ..families.config import context_length
from ..io.descriptors import check_open_files
from ..io.expert_files import ExpertFiles
from ..io.files import check_tmpdir, check_utf8_path
from ..io.manifest import not_a_model
from ..io.reads import DESCRIPTORS
from .assembly import apply_residency, load_resident
from .backend import available_memory, check_backend_computes, check_model_kernels
from .download_folder import is_download
from .download_source import open_download_source
from .handle import Streaming, compute_dtype, release
from .hub import is_repo_id, streamable
from .options import LoadOptions, as_flag, check_unhonoured, load_options
from .repacked_source import open_repacked_source
from .residency import layer_shapes, plan_residency
from .source import Source
from .tokenizer import embedded_tokens, load_tokenizer

if TYPE_CHECKING:  # mlx_lm.tokenizer_utils imports transformers: seconds, paid where a
    # tokenizer is built (tokenizer.py), not by a load refused before that
    from mlx_lm.tokenizer_utils import TokenizerWrapper


def load(
    path_or_hf_repo: str | Path,
    tokenizer_config: dict | None = None,
    model_config: dict | None = None,
    adapter_path: str | None = None,
    lazy: bool = False,
    return_config: bool = False,
    revision: str | None = None,
    trust_remote_code: bool = False,
    *,
    memory_budget: int | str | None = None,  # bytes, or a size such as "8G"
    dtype: mx.Dtype | str | None = None,  # mx.bfloat16 or "bfloat16"
    read_path: str | None = None,
    bypass_page_cache: bool = False,
    verify_reads: bool = False,
    group: mx.distributed.Group | None = None,
    checksums: str | Path | None = None,
    cuda_misses: str | None = None,
    threads: int | None = None,
) -> tuple[nn.Module, TokenizerWrapper] | tuple[nn.Module, TokenizerWrapper, dict]:
    """Load a repacked model, or an MLX-quantized download in place: non-expert
    weights resident, experts streamed from disk. `path_or_hf_repo` (mlx_lm.load's name): a
    folder, or org/name (loading/hub.py).
    mlx_lm.load's arguments come first, in its order: `tokenizer_config` (extra arguments for
    the tokenizer) and `return_config` (return the model's config too) as mlx-lm takes them;
    `model_config`, `adapter_path`, `lazy=True` and `revision`, which streamer cannot honour,
    are refused by name (options.check_unhonoured says why for each).

    `memory_budget`: bytes of experts to keep in memory. Enough for all of them: every layer runs
    resident (no syncs, no reads); less: the hottest experts are cached (LFU with aging) and the
    rest stream; 0: everything streams through the page cache. None: all experts if they fit in
    half the available memory, else 0. `model.streamer.residency` says what was chosen.
    `read_path`: "mapped" computes in place on the mapped expert files (the CPU default);
    "slots" reads experts into a bounded slot pool of `memory_budget` bytes and computes there
    (the Metal and CUDA default; a budget of 0 gives a few calls' experts per shape class, on
    CUDA one layer's).
    `bypass_page_cache`: the slot path reads around the page cache (O_DIRECT on Linux, F_NOCACHE
    on macOS) instead of through it; off by default (bench/findings.md,
    "Page cache or not", says why).
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
    `cuda_misses`: on CUDA, where the slot path's misses come from (cache/landing.py): "staged",
    "mapped", "registered", "pinned" or "gathered" (None: "gathered", the default; a bench
    switch, bench/worker.py --cuda-misses); elsewhere misses are read into their slots.
    `threads`: on the CPU backend, how many cores a token's large matmuls are cut across (None:
    every core this process may use, shared by the ranks a launch runs on this host; 1: one, as
    mlx-lm computes); GPUs take no other value.
    """
    check_unhonoured(path_or_hf_repo, model_config, adapter_path, lazy, revision)
    return_config = as_flag(return_config, "return_config")
    options = load_options(
        tokenizer_config=tokenizer_config,
        memory_budget=memory_budget,
        dtype=dtype,
        read_path=read_path,
        bypass_page_cache=bypass_page_cache,
        verify_reads=verify_reads,
        trust_remote_code=trust_remote_code,
        group=group,
        checksums=checksums,
        cuda_misses=cuda_misses,
        threads=threads,
    )
    model, tokenizer = load_decided(path_or_hf_repo, options)
    return (model, tokenizer, model.streamer.config) if return_config else (model, tokenizer)


def load_decided(path: str | Path, options: LoadOptions) -> tuple[nn.Module, TokenizerWrapper]:
    """`load` with its options already decided (the CLI decides them from its flags): the folder
    opened as its Source (a download, or a repacked folder), then the one assembly."""
    if not isinstance(path, (str, os.PathLike)):
        raise ArgumentError(f"path must be a folder name (str or Path), got {path!r}.")
    path = os.path.expanduser(path)  # "~/models/x", as a shell would read it
    folder = streamable(path) if is_repo_id(path) else Path(path)  # org/name: pulled or cached
    check_utf8_path(folder, "the model folder")
    if not os.path.isdir(folder):  # said before a look inside: a part over 255 bytes raised OSError
        raise StreamerError(not_a_model(Path(folder)))
    check_tmpdir()
    opened = open_download_source if is_download(folder) else open_repacked_source
    return _assemble(opened(folder, options), options)


def _assemble(source: Source, options: LoadOptions) -> tuple[nn.Module, TokenizerWrapper]:
    """Either source, in one order: what this backend cannot compute refused, the tokenizer built
    (before the slow part: fail fast), streaming layers in place of the expert containers, the
    resident weights loaded, then the residency plan made and applied; the handle attached."""
    model, dtype = source.model, options.dtype
    files, pools = None, []
    try:
        check_backend_computes(source.contents.layers, dtype)
        check_model_kernels(model)
        if options.memory_budget is not None:
            check_budget(source.contents, options.memory_budget, dtype)
        tokenizer = load_tokenizer(
            source.folder,
            options.trust_remote_code,
            options.tokenizer_config,
            embedded_tokens(model),
        )
        mapped = options.read_path == "mapped"
        check_open_files(
            (p for layout in source.layouts for p in layout.files), 1 if mapped else DESCRIPTORS
        )
        files = source.open_files() if mapped else None
        stats, layers = _streaming_layers(source, files, dtype, options.threads)
        load_resident(model, source.resident_weights(), dtype, source.mismatch)
        split_linears(model, options.threads)
        shapes = layer_shapes(source.contents.layers, source.layouts, dtype)
        plan = plan_residency(
            shapes,
            options.memory_budget,
            options.read_path,
            options.read_path_why,
            available_memory(),
            options.bypass_page_cache,
            options.cuda_misses,
        )
        pools = apply_residency(plan, source.layouts, layers, source.checksums)
    except BaseException:
        release(pools, files, source.lock)
        raise
    model.streamer = Streaming(
        plan=plan,
        manifest=source.contents,
        files=files,
        stats=stats,
        layers=layers,
        config=source.config,
        context_length=context_length(source.config),  # a VLM's in its text_config
        folder_lock=source.lock,
        pools=pools,
        dtype=compute_dtype(model),
        load_dtype=dtype,
        threads=options.threads,
        threads_why=options.threads_why,
    )
    return model, tokenizer


def _streaming_layers(
    source: Source, files: ExpertFiles | None, dtype: mx.Dtype | None, cores: int
) -> tuple[ExpertStats, list[StreamingExperts]]:
    """A streaming layer in place of each expert container, sharing one set of counters."""
    stats = ExpertStats(moe_layers=len(source.layouts))
    containers = expert_containers(source.model)
    streaming = {
        module: StreamingExperts(
            container,
            source.layouts[index],
            stats,
            dtype,
            files=files,
            checksums=source.checksums[index] if source.checksums is not None else None,
            share=source.shares[index],
            cores=cores,
        )
        for index, (module, container) in enumerate(containers.items())
    }
    replace_modules(source.model, streaming)
    return stats, list(streaming.values())
