"""What a load is asked for, decided once: `streamer.load`'s keywords and the CLI's loading flags
both become one frozen LoadOptions, every value checked in one order before any file is read."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import mlx.core as mx

from ..arguments import DTYPE_NAMES
from ..cache.landing import CUDA_MISSES, CUDA_MISSES_DEFAULT
from ..errors import ArgumentError
from ..io.sizes import parse_size
from .backend import default_dtype, read_path_for_backend, threads_for_backend
from .hub import is_repo_id


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
    threads: int = 1  # the CPU cores a token's large matmuls are cut across (cpu_cores.py)
    threads_why: str = ""  # why that many ("asked for", or the default); "": a GPU's, unsaid
    tokenizer_config: dict = field(default_factory=dict)  # the tokenizer's extra arguments


def load_options(
    *,
    tokenizer_config: object = None,
    memory_budget: object = None,
    dtype: object = None,
    read_path: object = None,
    bypass_page_cache: object = False,
    verify_reads: object = False,
    trust_remote_code: object = False,
    group: object = None,
    checksums: object = None,
    cuda_misses: object = None,
    threads: object = None,
    option: str = "",
) -> LoadOptions:
    """`streamer.load`'s keywords checked and decided, in this order, before any file is read.
    `option`: how the caller spells a name in a refusal ("--" for the CLI's flags)."""

    def name(n: str) -> str:
        return option + (n.replace("_", "-") if option else n)

    if tokenizer_config is not None and not (
        isinstance(tokenizer_config, dict) and all(isinstance(k, str) for k in tokenizer_config)
    ):
        raise ArgumentError(
            "tokenizer_config must be a dict of AutoTokenizer's arguments, as mlx_lm.load takes "
            f"(got {tokenizer_config!r:.60})."
        )
    budget = None if memory_budget is None else parse_size(memory_budget, name("memory_budget"))
    compute = parse_dtype(dtype)
    verify_reads = as_flag(verify_reads, name("verify_reads"))
    tokenizer_config = dict(tokenizer_config or {})
    trust_remote_code = _trusted(
        as_flag(trust_remote_code, name("trust_remote_code")), tokenizer_config
    )
    bypass_page_cache = as_flag(bypass_page_cache, name("bypass_page_cache"))
    path, why = read_path_for_backend(read_path, name("read_path"))
    cores, cores_why = threads_for_backend(threads, name("threads"))
    if checksums is not None and not isinstance(checksums, (str, os.PathLike)):
        raise ArgumentError(f"checksums must be a file name (str or Path), got {checksums!r}.")
    if checksums is not None and not os.path.isfile(checksums):
        raise ArgumentError(
            f"{name('checksums')} {checksums}: no such file; `streamer verify DIR --record "
            "--checksums FILE` writes one (leave it out for the default sidecar)."
        )
    if group is not None and not isinstance(group, mx.distributed.Group):
        raise ArgumentError(
            f"group must be an mx.distributed group (mx.distributed.init()), got {group!r}."
        )
    misses = CUDA_MISSES_DEFAULT if cuda_misses is None else cuda_misses
    if misses not in CUDA_MISSES:
        raise ArgumentError(
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
        threads=cores,
        threads_why=cores_why,
        tokenizer_config=tokenizer_config,
    )


def _trusted(keyword: bool, tokenizer_config: dict) -> bool:
    """Whether a tokenizer's own code may run: trust_remote_code, or mlx_lm.load's way to say it,
    tokenizer_config's "trust_remote_code" (taken out of it: decided here alone)."""
    if "trust_remote_code" not in tokenizer_config:
        return keyword
    said = as_flag(
        tokenizer_config.pop("trust_remote_code"), "tokenizer_config's trust_remote_code"
    )
    if keyword and not said:
        raise ArgumentError(
            "trust_remote_code=True and tokenizer_config's trust_remote_code False disagree: give "
            "it once (trust_remote_code=True lets the tokenizer's own code run)."
        )
    return said


def check_unhonoured(
    path: object, model_config: object, adapter_path: object, lazy: object, revision: object
) -> None:
    """mlx_lm.load's arguments that streamer cannot honour, refused with why and what to do
    rather than ignored. None (and mlx-lm's defaults: an empty model_config, lazy=False) pass."""
    if model_config:
        raise ArgumentError(
            "model_config: streamer builds the model from config.json as it was checked against "
            "the weights, so it takes no overrides: edit config.json (repack a download) instead."
        )
    if adapter_path is not None:
        raise ArgumentError(
            "adapter_path: streamer applies no LoRA adapters: fuse them into the model first "
            "(mlx_lm.fuse), then load the fused folder."
        )
    if as_flag(lazy, "lazy"):
        raise ArgumentError(
            "lazy=True: streamer reads the resident weights at load, to plan the experts' memory "
            "around them; leave lazy out."
        )
    if revision is not None and not is_repo_id(str(path)):
        raise ArgumentError(f"revision: {path} is a folder, loaded as it is: leave revision out.")
    if revision is not None:
        raise ArgumentError(
            f"revision: load reads a folder or the Hugging Face cache, not a revision: download "
            f"it with `streamer pull {path} --revision {revision}` and load what that writes."
        )


def parse_dtype(value: object):
    """None, an mx floating dtype, or its name ("float32", "bfloat16", "float16")."""
    if value is None:
        return None
    if isinstance(value, str) and value in DTYPE_NAMES:
        return getattr(mx, value)
    if isinstance(value, mx.Dtype) and value in tuple(getattr(mx, n) for n in DTYPE_NAMES):
        return value
    raise ArgumentError(
        f"dtype must be one of {', '.join(DTYPE_NAMES)} (a name or mlx.core's dtype), or None for "
        f"the default (got {value!r})."
    )


def as_flag(value: object, name: str) -> bool:
    """True or False, numpy's too (np.True_, as mlx-lm takes it) as Python's; else refused."""
    if type(value).__module__ == "numpy" and getattr(value, "shape", None) == ():
        value = value.item()  # np.int64(1) is 1, refused as no bool
    if not isinstance(value, bool):
        raise ArgumentError(f"{name} must be True or False (got {value!r}).")
    return value
