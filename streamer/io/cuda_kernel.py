"""Streamer's CUDA kernels as MLX builds them (io/cuda_gather.py), each named by what it compiles.

MLX compiles a custom kernel with nvrtc and caches the result by the kernel's name alone: in the
process, and on disk (MLX_PTX_CACHE_DIR, else a folder under the temporary directory, kept across
runs). A name that outlived a change of its source or of its inputs would run the old kernel, with
the old arguments: after an upgrade, a kernel that gained an input would read the new arguments
in the old order. So every name carries a digest of the kernel's source, its input and output
names and the dtypes its pointers take.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import mlx.core as mx


def kernel_name(kind: str, *compiled) -> str:
    """`kind` and a digest of `compiled` (everything the kernel's code is made from)."""
    return f"streamer_{kind}_{hashlib.sha256(repr(compiled).encode()).hexdigest()[:16]}"


def cuda_kernel(kind: str, inputs: Sequence[str], outputs: Sequence[str], source: str, *dtypes):
    """MLX's kernel for `source` (`dtypes`: those of the inputs that vary by model), its inputs
    passed as they are, with no contiguous copy: some are written in place, and the pool's arrays
    are views from their slot alignment."""
    return mx.fast.cuda_kernel(
        name=kernel_name(kind, list(inputs), list(outputs), source, *map(str, dtypes)),
        input_names=list(inputs),
        output_names=list(outputs),
        source=source,
        ensure_row_contiguous=False,
    )
