"""The CPU backend's cores: a token's large matmuls split across them.

MLX's CPU backend runs each stream's work on one thread, and its quantized matmuls (the routed
experts, the attention projections, the output head) on that thread alone: on a machine with
several cores decode used one of them. Ops on different streams run on different threads, so a
call's work cut into parts, each part on a stream of its own, runs on as many cores as parts.
The cuts are along rows of the output only (a routed expert, an output feature), which every
part computes exactly as the whole call would: the results are bit-identical
(tests/test_cpu_cores.py). Measured on a 2-core VM at Qwen3-30B-A3B's 4-bit shape: 8 experts'
gather_qmm 1.75-1.95x, a 12-layer model's decode 1.7x (bench/findings.md, "Every core computes").

The streams are thread-local (mx.new_thread_local_stream): MLX refuses a stream made on another
thread, and serve and chat generate on a thread of their own. GPU backends get no split: there
the GPU computes every matmul.
"""

from __future__ import annotations

import os

import mlx.core as mx
import mlx.nn as nn

from .errors import StreamerError
from .io.ring_hostfile import ring_hosts

# Smallest part worth a stream of its own: below it the hand-off between threads (an event each
# way, tens of microseconds) costs more than the part's compute (a 1 MiB 4-bit part: ~1 ms here).
MIN_PART_BYTES = 1 << 20


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the OS tells, as taskset and
    cgroups' cpusets set it), else the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS has no affinity call
        return os.cpu_count() or 1


def ranks_on_this_host() -> int:
    """How many ranks of the launch that started this process run on this host, itself among
    them (1 when it runs alone): they share its cores. MLX's ring backend, which mlx.launch and
    streamer launch start where there is no GPU, names each rank's addresses in the file
    MLX_HOSTFILE names (`[["ip:port", ...], ...]`, rank MLX_RANK's at its index), and the ranks
    of one host listen on its addresses, a port each. Anything else is 1: no launch, a ring of
    one (mlx.launch writes "" there), MLX's other backends (nccl and jaccl compute on a GPU), and
    mpirun's ranks (not counted: it may have bound each to cores of its own; --threads says)."""
    try:
        hosts, rank = ring_hosts(), int(os.environ.get("MLX_RANK", ""))
    except (StreamerError, ValueError):  # StreamerError: a FIFO or device, refused unread
        return 1  # not the ring's file: MLX's own error says what is wrong with it
    if hosts is None or not 0 <= rank < len(hosts):
        return 1
    return sum(1 for other in hosts if other & hosts[rank]) or 1


def in_words(cores: int) -> str:
    """`1 core`, `2 cores`."""
    return f"{cores} core{'s' if cores != 1 else ''}"


_streams: list[mx.ThreadLocalStream] = []  # made once per process; each thread gets its own


def part_streams(parts: int) -> list[mx.ThreadLocalStream | None]:
    """A stream for each of `parts` parts: the first part stays on the caller's stream (None)."""
    while len(_streams) < parts - 1:
        _streams.append(mx.new_thread_local_stream(mx.cpu))
    return [None, *_streams[: parts - 1]]


def bounds(total: int, parts: int) -> list[tuple[int, int]]:
    """`total` rows cut into `parts` contiguous runs as even as can be."""
    cuts = [total * i // parts for i in range(parts + 1)]
    return list(zip(cuts[:-1], cuts[1:]))


def on_parts(compute, total: int, parts: int, axis: int) -> mx.array:
    """`compute(start, stop)` for each part of `total` rows, each on its stream, concatenated
    along `axis`: the same array as `compute(0, total)`."""
    outs = []
    for stream, (start, stop) in zip(part_streams(parts), bounds(total, parts)):
        if stream is None:
            outs.append(compute(start, stop))
        else:
            with mx.stream(stream):
                outs.append(compute(start, stop))
    return mx.concatenate(outs, axis=axis)


def routed_on_cores(
    container: nn.Module, x: mx.array, indices: mx.array, cores: int, entry_bytes: int
) -> mx.array:
    """An expert container's call, `(x [..., L, D], indices [..., L, k]) -> [..., L, k, D]`, cut
    across up to `cores` streams, each part at least MIN_PART_BYTES of expert weights to compute
    (`entry_bytes`: one routed entry's): by its k routed entries, or, with fewer entries than
    cores (the slot path computes a call's hits and misses as entries of one expert each), by its
    L tokens. Each entry's row depends on its expert and its token alone."""
    cores = min(cores, indices.size * entry_bytes // MIN_PART_BYTES)
    k = indices.shape[-1]
    if min(cores, k) >= 2:
        return on_parts(lambda a, b: container(x, indices[..., a:b]), k, min(cores, k), axis=-2)
    tokens = indices.shape[-2] if indices.ndim >= 2 else 1
    if min(cores, tokens) >= 2 and x.shape[:-1] == indices.shape[:-1]:
        cut = lambda a, b: container(x[..., a:b, :], indices[..., a:b, :])  # noqa: E731
        return on_parts(cut, tokens, min(cores, tokens), axis=-3)
    return container(x, indices)


def quantized_rows_on_cores(module: nn.Module, x: mx.array) -> mx.array:
    """x times a quantized layer's weight transposed (as QuantizedLinear computes it, without
    the bias), its output features cut across the layer's `parts` streams."""
    weight, scales, biases = module["weight"], module["scales"], module.get("biases")

    def rows(a: int, b: int) -> mx.array:  # a slice of rows is a view: nothing is copied
        return mx.quantized_matmul(
            x,
            weight[a:b],
            scales=scales[a:b],
            biases=None if biases is None else biases[a:b],
            transpose=True,
            group_size=module.group_size,
            bits=module.bits,
            mode=module.mode,
        )

    return on_parts(rows, weight.shape[0], module.parts, axis=-1)


class CoreSplitLinear(nn.QuantizedLinear):
    """A QuantizedLinear cut across cores (`split_linears`): its parameters are the layer's own,
    under the same names; only the call differs."""

    parts: int

    def __call__(self, x: mx.array) -> mx.array:
        out = quantized_rows_on_cores(self, x)
        return out + self["bias"] if "bias" in self else out


class CoreSplitEmbedding(nn.QuantizedEmbedding):
    """A QuantizedEmbedding whose use as the output head (tied embeddings) is cut across cores;
    its lookups are as before."""

    parts: int

    def as_linear(self, x: mx.array) -> mx.array:
        return quantized_rows_on_cores(self, x)


SPLIT_CLASSES = {nn.QuantizedLinear: CoreSplitLinear, nn.QuantizedEmbedding: CoreSplitEmbedding}


def split_linears(model: nn.Module, cores: int) -> int:
    """Cut every quantized linear layer (and tied output head) of `model` big enough for it
    across `cores` cores, each part at least MIN_PART_BYTES of weights; how many were cut.
    Expert containers are neither: StreamingExperts cuts their calls by routed entry."""
    cut = 0
    for _, module in model.named_modules():
        split = SPLIT_CLASSES.get(type(module))
        if split is None:
            continue
        weight = module["weight"]
        parts = min(cores, weight.nbytes // MIN_PART_BYTES, weight.shape[0])
        if parts >= 2:
            module.__class__ = split  # the same parameters and names: a new call only
            module.parts = parts
            cut += 1
    return cut
