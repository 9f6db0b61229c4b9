"""What `load` attaches to the mlx-lm model it returns: one typed handle, `model.streamer`."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import mlx.core as mx
import mlx.nn as nn

from ..cache.slot_pool import SlotPool
from ..cpu_cores import in_words
from ..errors import StreamerError
from ..experts import StreamingExperts
from ..experts.layer import CLOSED
from ..io.expert_files import ExpertFiles
from ..io.lock import FolderLock
from ..io.manifest import Manifest
from .residency import ResidencyPlan

if TYPE_CHECKING:
    from .download_folder import Download
from ..expert_traffic import ExpertStats

_CLAIMS = threading.Lock()  # a model's check and claim (or close), one thread at a time


@contextmanager
def memory_limit_raised(extra_bytes: int) -> Iterator[None]:
    """Raise MLX's memory limit by `extra_bytes` while the context lasts, as mlx-lm's
    `wired_limit` scopes the wired limit: restored on exit, once queued work has finished.

    MLX counts mapped expert files as its active memory, and past its memory limit its scheduler
    waits for every op to finish before the next, so a model larger than the limit (the point of
    streaming) would run op by op. The change is undone by the amount, not to the old value, so
    models loaded and closed in any order leave the limit as they found it.
    """
    mx.set_memory_limit(mx.get_memory_limit() + extra_bytes)
    try:
        yield
    finally:
        mx.synchronize()
        mx.set_memory_limit(max(mx.get_memory_limit() - extra_bytes, 0))


@dataclass(kw_only=True)  # built in one place, load._assemble
class Streaming:
    """The streaming side of a loaded model. It must hold for as long as the model computes,
    whoever drives it (streamer.generate, mlx_lm.generate, generate_step, a plain model call),
    so its scopes (the raised memory limit, the folder's read lock, the mapped files) last until
    `close()` rather than around one generation."""

    plan: ResidencyPlan  # what each layer keeps in memory, and why (`residency` in words)
    manifest: Manifest | Download  # what was loaded: its `layers` match the layouts read
    files: ExpertFiles | None  # the mapped expert files (the mapped path only)
    stats: ExpertStats
    layers: list[StreamingExperts]
    config: dict  # the config the model was built from (load's return_config=True returns it)
    context_length: int | None  # max_position_embeddings (DBRX: max_seq_len): prompt + output fit
    folder_lock: FolderLock | None  # shared flock: `repack --force` refuses while it is held
    pools: list[SlotPool] = field(default_factory=list)  # the slot path's pools
    dtype: str = ""  # what the model computes in (compute_dtype's), for the stats line
    load_dtype: mx.Dtype | None = None  # the load's (LoadOptions.dtype), which a draft follows
    threads: int = 1  # the CPU cores a token's large matmuls are cut across (cpu_cores.py)
    threads_why: str = ""  # why that many (LoadOptions'); "": a GPU's, not said
    generating: tuple[int | None, int] = (None, 0)  # the thread generating, its answers open
    closed: bool = False
    _scopes: ExitStack = field(default_factory=ExitStack, repr=False)

    @property
    def read_path(self) -> str:
        """ "mapped" or "slots": the load's decision (options.py), as the plan applied it."""
        return self.plan.read_path

    @property
    def residency(self) -> str:
        """The residency plan in words: what the memory budget chose, and the read path; then,
        on the CPU backend, the cores a token's large matmuls are cut across."""
        if not self.threads_why:
            return self.plan.text()
        return f"{self.plan.text()}; matmuls on {in_words(self.threads)} ({self.threads_why})"

    def __post_init__(self) -> None:
        self._scopes.enter_context(memory_limit_raised(self.mapped_mlx_bytes))

    @contextmanager
    def claimed(self) -> Iterator[None]:
        """The model for this thread while it generates. MLX's streams belong to the thread that
        made them, so a second thread generating on one model at once failed inside the slot pool
        (RuntimeError: There is no Stream(cpu, 5) in current thread), and both answers share the
        expert caches and stats. Generators interleaved in one thread still take turns."""
        me = threading.get_ident()
        with _CLAIMS:
            owner, depth = self.generating
            if self.closed:
                raise StreamerError(CLOSED)
            if depth and owner != me:
                raise StreamerError(
                    "this model is generating an answer in another thread, and a model generates "
                    "one answer at a time: wait for that answer to finish (or close its stream), "
                    "or load the model once for each thread."
                )
            self.generating = (me, depth + 1)
        try:
            yield
        finally:  # also when the stream is closed or dropped unfinished
            with _CLAIMS:
                self.generating = (me, self.generating[1] - 1)

    def close(self) -> None:
        """Unmap the expert files, lower the memory limit again, release the folder. Refused
        while another thread generates: its reads and kernels would find the files closed under
        them (a TypeError from the slot pool, or MLX's RuntimeError in this thread)."""
        with _CLAIMS:
            owner, depth = self.generating
            if depth and owner != threading.get_ident():
                raise StreamerError(
                    "this model is generating an answer in another thread: close it once that "
                    "answer has finished (or its stream is closed)."
                )
            self.closed = True
        for layer in self.layers:
            layer.closed = True
        self._scopes.close()
        release(self.pools, self.files, self.folder_lock)
        self.folder_lock = None

    @property
    def mapped_mlx_bytes(self) -> int:
        """The MLX memory the expert files' mappings take (MLX counts it as its own)."""
        return self.files.mlx_bytes if self.files is not None else 0

    @property
    def expert_paths(self) -> list[Path]:
        """The files the experts are read from: a repack's expert files or a download's shards."""
        if self.files is not None:
            layouts = [layer.layout for layer in self.files.layers]
            return sorted({path for layout in layouts for path in layout.files})
        sources = [source for pool in self.pools for source in pool.layers.values()]
        return sorted({file.path for source in sources for file in source.files})

    @property
    def group(self) -> mx.distributed.Group | None:
        """The expert-parallel group whose ranks sum each MoE layer's rows; None alone."""
        share = self.layers[0].share if self.layers else None
        return share.group if share is not None else None

    def evict(self) -> None:
        """Unmap the expert pages this process maps, so a page-cache drop can take them (the
        slot path maps none)."""
        if self.files is not None:
            self.files.evict()


def compute_dtype(model: nn.Module) -> str:
    """The floating dtype most of the model's resident parameters hold (a quantized layer's
    scales included): what its activations are computed in, "float32" or "bfloat16"."""
    from mlx.utils import tree_flatten

    counts: dict[mx.Dtype, int] = {}
    for _, value in tree_flatten(model.parameters()):
        if mx.issubdtype(value.dtype, mx.floating):
            counts[value.dtype] = counts.get(value.dtype, 0) + 1
    if not counts:
        return "unknown"
    return str(max(counts, key=counts.get)).removeprefix("mlx.core.")


def streaming(model: nn.Module) -> Streaming | None:
    """The handle of a model from streamer.load; None for any other model."""
    handle = getattr(model, "streamer", None)
    return handle if isinstance(handle, Streaming) else None


def release(pools: list[SlotPool], files: ExpertFiles | None, lock: FolderLock | None) -> None:
    """Give back what a load holds: Streaming.close, and a load that fails part way."""
    for pool in pools:
        pool.close()
    if files is not None:
        files.close()
    if lock is not None:
        lock.release()
