"""What a load is asked for, decided once: `streamer.load`'s keywords and the CLI's loading flags
both become one frozen LoadOptions, every value checked in one order before any file is read."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import mlx.core as mx

from ..arguments import check_flag, parse_dtype, parse_size
from ..cache.landing import CUDA_MISSES, CUDA_MISSES_DEFAULT
from ..errors import StreamerError
from .backend import default_dtype, read_path_for_backend


@dataclass(frozen=True)
class LoadOptions:
    """A load's choices, each made once: the loader and the residency plan only read them."""

    memory_budget: int | None  # bytes of experts kept in memory; None: the read path's default
    dtype: mx.Dtype | None  # what the model computes in; None: each tensor's own (a GPU's default)
    read_path: str  # "mapped" or "slots": how the experts reach the compute, for this backend
    read_path_why: str  # why that read path ("asked for", or the backend's default)
    checksums: Path | None  # a download's checksum sidecar; None: the default one
    trust_remote_code: bool  # a tokenizer's own Python code may run
    verify_reads: bool  # each expert's crc32 checked whenever it is read from the disk
    bypass_page_cache: bool  # the slot path reads around the page cache
    group: mx.distributed.Group | None  # expert-parallel: this rank's group; None alone
    cuda_misses: str = CUDA_MISSES_DEFAULT  # on CUDA, where a slot miss's bytes come from


def load_options(
    *,
    memory_budget: object = None,
    dtype: object = None,
    read_path: object = None,
    bypass_page_cache: object = False,
    verify_reads: object = False,
    trust_remote_code: object = False,
    group: object = None,
    checksums: object = None,
    cuda_misses: object = None,
    option: str = "",
) -> LoadOptions:
    """`streamer.load`'s keywords checked and decided, in this order, before any file is read.
    `option`: how the caller spells a name in a refusal ("--" for the CLI's flags)."""

    def name(n: str) -> str:
        return option + (n.replace("_", "-") if option else n)

    budget = None if memory_budget is None else parse_size(memory_budget, name("memory_budget"))
    compute = parse_dtype(dtype)
    for flag, value in (
        ("verify_reads", verify_reads),
        ("trust_remote_code", trust_remote_code),
        ("bypass_page_cache", bypass_page_cache),
    ):
        check_flag(value, name(flag))
    path, why = read_path_for_backend(read_path, name("read_path"))
    if checksums is not None and not isinstance(checksums, (str, os.PathLike)):
        raise StreamerError(f"checksums must be a file name (str or Path), got {checksums!r}.")
    if checksums is not None and not os.path.isfile(checksums):
        raise StreamerError(
            f"{name('checksums')} {checksums}: no such file; `streamer verify DIR --record "
            "--checksums FILE` writes one (leave it out for the default sidecar)."
        )
    if group is not None and not isinstance(group, mx.distributed.Group):
        raise StreamerError(
            f"group must be an mx.distributed group (mx.distributed.init()), got {group!r}."
        )
    misses = CUDA_MISSES_DEFAULT if cuda_misses is None else cuda_misses
    if misses not in CUDA_MISSES:
        raise StreamerError(
            f"{name('cuda_misses')} must be one of {', '.join(CUDA_MISSES)} (None: "
            f"{CUDA_MISSES_DEFAULT}), not {cuda_misses!r}."
        )
    return LoadOptions(
        memory_budget=budget,
        dtype=compute if compute is not None else default_dtype(),
        read_path=path,
        read_path_why=why,
        checksums=None if checksums is None else Path(checksums),
        trust_remote_code=trust_remote_code,
        verify_reads=verify_reads,
        bypass_page_cache=bypass_page_cache,
        group=group,
        cuda_misses=misses,
    )
