"""Experts moved on the GPU from the pinned files: a layer call's routed experts gathered from the
slot pool or the files (ExpertGather), and a settle's moved experts copied into their slots
(SlotFill).

On MLX's CUDA backend the slot path's cost is not the bytes but the host sync each MoE layer
needs to learn its routing (48 a token on a Qwen3-30B-A3B-shaped model: bench/findings.md). When
every expert file of a layer is page-locked whole and mapped into the GPU's address space
(`cudaHostRegister` with the mapped flag: io/cuda_copy.py, "pinned"), the GPU can read a miss
itself: one kernel takes each routed expert's tensors from its slot when the layer's slot table
has one (device memory) or else straight from the file's pinned mapping over the bus, into a
stack [routed, *shape] per tensor that mlx-lm's container then computes on, exactly as on the
resident stacks. The routing never reaches the host, so nothing waits: the layers of a token are
queued as one graph, as mlx-lm queues them. The slot pool's policy learns the routing later, in
batches (cache/settle.py): the same LFU, a few tokens late; a SlotFill kernel copies each expert
that gained a slot into it on MLX's stream, with no copy-engine call and no host wait.

Only CUDA runs these (cache/settle.py, for a pool whose landing lets kernels read files): on
Metal a no-copy buffer over a file is wired whole on first GPU use; the GPU sees only the pool.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import mlx.core as mx
import numpy as np

from .cuda_kernel import cuda_kernel

NO_SLOT = 0xFFFFFFFF  # a slot table's entry for an expert without a slot (-1 as uint32)
UNWANTED = 0xFFFFFFFF  # a row's expert the call does not route (a whole prompt's): left unwritten
THREADS = 256  # per block
# Each kernel's copy shape: blocks per routed expert (or move) and tensor, word loads in flight a
# thread. The gather's few blocks of eight loads each took real decode's median step 0.5-5 ms
# lower than 64 blocks of one load in four paired runs on two H100s, never slower, tokens identical
# (bench/findings.md, "The gather kernel's shape adopted"); the fill keeps its measured shape.
GATHER_SHAPE = (2, 8)
FILL_SHAPE = (64, 1)
WORDS = {16: "uint4", 8: "uint2", 4: "uint32_t", 2: "uint16_t", 1: "uint8_t"}  # bytes -> CUDA type


def copy_loop(vector: int, loads: int) -> str:
    """Both kernels' copy of `n` bytes from `src` to `dst` in `vector`-byte words, each thread
    striding over them, `loads` words read before any is stored (more reads in flight)."""
    return f"""    const unsigned long long words = n / {vector};
    const unsigned long long step = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < words;
         i += {loads} * step) {{
        {WORDS[vector]} w[{loads}];
        #pragma unroll
        for (int u = 0; u < {loads}; ++u) if (i + u * step < words) w[u] = src[i + u * step];
        #pragma unroll
        for (int u = 0; u < {loads}; ++u) if (i + u * step < words) dst[i + u * step] = w[u];
    }}"""


def _per_tensor(nbytes: Sequence[int], pointers: str) -> str:
    """Both kernels' switch on tensor `t`: its bytes `n` and `pointers` (a format of `t` setting
    the kernel's pointers to its arrays)."""
    cases = "\n".join(
        f"    case {t}: n = {n}ull; {pointers.format(t=t)} break;" for t, n in enumerate(nbytes)
    )
    return f"    switch (t) {{\n{cases}\n    }}"


def _source(nbytes: Sequence[int], vector: int, loads: int) -> str:
    """The gather kernel's body: block (x, j, t) copies tensor t of routed entry j, in `vector`-byte
    words, from its slot in `pool{t}` or, without one, from the pinned file (`sources` holds,
    per tensor, the device address of expert 0's bytes and the stride between experts); an
    UNWANTED entry's row is left as it is."""
    word = WORDS[vector]
    cases = _per_tensor(
        nbytes,
        "pool = reinterpret_cast<const uint8_t*>(pool{t}); "
        "out = reinterpret_cast<uint8_t*>(out{t});",
    )
    return f"""
    const uint32_t j = blockIdx.y, t = blockIdx.z;
    const uint32_t expert = routed[j];
    if (expert == {UNWANTED}u) return;  // no index points at this row: nothing to move
    const uint32_t slot = table[expert];
    unsigned long long n = 0;
    const uint8_t* pool = nullptr;
    uint8_t* out = nullptr;
{cases}
    const uint8_t* from = slot != {NO_SLOT}u
        ? pool + slot * n
        : reinterpret_cast<const uint8_t*>(sources[2 * t] + expert * sources[2 * t + 1]);
    const {word}* src = reinterpret_cast<const {word}*>(from);
    {word}* dst = reinterpret_cast<{word}*>(out + j * n);
{copy_loop(vector, loads)}
"""


def word_bytes(sizes: Sequence[int]) -> int:
    """The widest copy word (16 bytes down to 1) that every size and address divides."""
    common = math.gcd(*sizes)
    return next(v for v in (16, 8, 4, 2, 1) if common % v == 0)


def threads_per_tensor(sizes: Sequence[int], word: int, blocks: int) -> int:
    """A kernel's threads per expert and tensor: one a `word` of the largest tensor, at most
    `blocks` blocks of them (each thread's loop strides over the rest)."""
    return min(blocks, -(-max(sizes) // word // THREADS)) * THREADS


class ExpertGather:
    """The gather kernel for one pool's tensors (SlotTensors), compiled once by MLX (nvrtc).
    `alignment`: what every source address divides (a multiple of each tensor's file offset and
    stride); the kernel copies in the widest word that it and every tensor size allow (a word
    misaligned would be a CUDA error that ends the process's context)."""

    def __init__(self, tensors: Sequence, alignment: int, shape: tuple[int, int] | None = None):
        self._tensors = tuple(tensors)
        count, sizes = len(self._tensors), tuple(t.nbytes for t in self._tensors)
        word = word_bytes([*sizes, alignment])
        blocks, loads = shape or GATHER_SHAPE
        self._threads = threads_per_tensor(sizes, word, blocks)
        self._kernel = cuda_kernel(
            "expert_gather",
            ["routed", "table", "sources", *(f"pool{t}" for t in range(count))],
            [f"out{t}" for t in range(count)],
            _source(sizes, word, loads),
            *(t.dtype for t in self._tensors),
        )

    def __call__(
        self, routed: mx.array, table: mx.array, sources: mx.array, pool: Sequence[mx.array]
    ) -> list[mx.array]:
        """Per tensor, [routed.size, *shape]: row j holds expert routed[j]'s tensor, from its slot
        (`table`: uint32 per expert, NO_SLOT none) or from `sources` (uint64 [tensors, 2]:
        expert 0's device address, stride); unwritten where it is UNWANTED."""
        count = routed.size
        return self._kernel(
            inputs=[routed.reshape(-1).astype(mx.uint32), table, sources, *pool],
            grid=(self._threads, count, len(self._tensors)),
            threadgroup=(THREADS, 1, 1),
            output_shapes=[(count, *t.shape) for t in self._tensors],
            output_dtypes=[t.dtype for t in self._tensors],
        )


def _fill_source(nbytes: Sequence[int], vector: int, loads: int) -> str:
    """The fill kernel's body: block (x, j, t) copies tensor t of move j, in `vector`-byte words,
    from `addresses[j, t]` (a device address in a pinned file) into slot `slots[j]` of `pool{t}`.
    The pool arrays are inputs (MLX has no in-place outputs): they are written through their
    pointers, which is safe because every reader of the old slots is queued before it (the
    pool's fence or settle), and MLX runs each evaluation's graph on its one stream in order,
    so the kernel runs after them and before any kernel queued later."""
    word = WORDS[vector]
    cases = _per_tensor(
        nbytes, "pool = const_cast<uint8_t*>(reinterpret_cast<const uint8_t*>(pool{t}));"
    )
    return f"""
    const uint32_t j = blockIdx.y, t = blockIdx.z;
    unsigned long long n = 0;
    uint8_t* pool = nullptr;
{cases}
    const {word}* src = reinterpret_cast<const {word}*>(addresses[j * {len(nbytes)} + t]);
    {word}* dst = reinterpret_cast<{word}*>(pool + slots[j] * n);
{copy_loop(vector, loads)}
    if (j == 0 && t == 0 && blockIdx.x == 0 && threadIdx.x == 0) {{
        done[0] = 1;
    }}
"""


class SlotFill:
    """The fill kernel for one pool's tensors (SlotTensors), compiled once per copy word by MLX.
    A call copies each move's tensors from the pinned files into its slot and returns a
    one-element output: computing it is the copy (the pool's fence waits for it)."""

    def __init__(self, tensors: Sequence, shape: tuple[int, int] | None = None):
        self._tensors = tuple(tensors)
        self._blocks, self._loads = shape or FILL_SHAPE
        self._kernels: dict[int, object] = {}  # copy word -> kernel

    def __call__(
        self, slots: np.ndarray, addresses: np.ndarray, pool: Sequence[mx.array]
    ) -> mx.array:
        """`slots`: uint32 [moves]; `addresses`: uint64 [moves, tensors], the device address of
        each move's tensor in its pinned file; `pool`: the pool's arrays (one chunk)."""
        sizes = [t.nbytes for t in self._tensors]
        word = word_bytes([*sizes, int(np.gcd.reduce(addresses.ravel().astype(np.int64)))])
        if word not in self._kernels:
            count = len(self._tensors)
            names = ["slots", "addresses", *(f"pool{t}" for t in range(count))]
            source = _fill_source(sizes, word, self._loads)
            dtypes = (t.dtype for t in self._tensors)
            self._kernels[word] = cuda_kernel("slot_fill", names, ["done"], source, *dtypes)
        (done,) = self._kernels[word](
            inputs=[mx.array(slots, mx.uint32), mx.array(addresses, mx.uint64), *pool],
            grid=(threads_per_tensor(sizes, word, self._blocks), len(slots), len(self._tensors)),
            threadgroup=(THREADS, 1, 1),
            output_shapes=[(1,)],
            output_dtypes=[mx.uint32],
        )
        return done
