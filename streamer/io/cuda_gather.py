"""Experts moved on the GPU from the pinned files: a layer call's routed experts gathered from the
slot pool or the files (ExpertGather), and a settle's moved experts copied into their slots
(SlotFill), or, off by default, a call's misses admitted into slots as it reads them (SlotAdmit
plans them, ExpertGather's plan mode writes them: cache/admission.py).

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
BLOCKS_PER_TENSOR = 64  # per routed expert and tensor: ~16k threads copying 16 bytes each at once
WORDS = {16: "uint4", 8: "uint2", 4: "uint32_t", 2: "uint16_t", 1: "uint8_t"}  # bytes -> CUDA type
# Both kernels' copy of `n` bytes from `src` to `dst`: each thread a word, striding over the rest
_COPY = """    for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n / {vector};
         i += gridDim.x * blockDim.x) {{
        const {word} w = src[i];
        dst[i] = w;{also}
    }}"""


def _per_tensor(nbytes: Sequence[int], pointers: str) -> str:
    """Both kernels' switch on tensor `t`: its bytes `n` and `pointers` (a format of `t` setting
    the kernel's pointers to its arrays)."""
    cases = "\n".join(
        f"    case {t}: n = {n}ull; {pointers.format(t=t)} break;" for t, n in enumerate(nbytes)
    )
    return f"    switch (t) {{\n{cases}\n    }}"


def _source(nbytes: Sequence[int], vector: int, admits: bool) -> str:
    """The kernel's body: block (x, j, t) copies tensor t of routed entry j, in `vector`-byte
    words, from its slot in `pool{t}` or, without one, from the pinned file (`sources` holds,
    per tensor, the device address of expert 0's bytes and the stride between experts); an
    UNWANTED entry's row is left as it is. The slot: `table`'s for the expert or, `admits`, the
    call's `plan` row 0 (SlotAdmit's); there the words also go into slot `plan[1, j]` where it
    names one, written through the pool's pointers as the fill kernel writes (_fill_source):
    that slot is none the call reads (SlotAdmit passes them over), and its earlier readers run
    first (the admission waits for the last gather; SlotPool.gather queues the rest)."""
    word, pool = WORDS[vector], "reinterpret_cast<const uint8_t*>(pool{t})"
    pool = f"const_cast<uint8_t*>({pool})" if admits else pool
    cases = _per_tensor(nbytes, f"pool = {pool}; out = reinterpret_cast<uint8_t*>(out{{t}});")
    keep = also = ""
    if admits:
        keep = f"""
    const uint32_t to = plan[gridDim.y + j];
    {word}* kept = to != {NO_SLOT}u ? reinterpret_cast<{word}*>(pool + to * n) : nullptr;"""
        also = "\n        if (kept != nullptr) kept[i] = w;"
    return f"""
    const uint32_t j = blockIdx.y, t = blockIdx.z;
    const uint32_t expert = routed[j];
    if (expert == {UNWANTED}u) return;  // no index points at this row: nothing to move
    const uint32_t slot = {"plan[j]" if admits else "table[expert]"};
    unsigned long long n = 0;
    {"" if admits else "const "}uint8_t* pool = nullptr;
    uint8_t* out = nullptr;
{cases}
    const uint8_t* from = slot != {NO_SLOT}u
        ? pool + slot * n
        : reinterpret_cast<const uint8_t*>(sources[2 * t] + expert * sources[2 * t + 1]);
    const {word}* src = reinterpret_cast<const {word}*>(from);
    {word}* dst = reinterpret_cast<{word}*>(out + j * n);{keep}
{_COPY.format(vector=vector, word=word, also=also)}
"""


def word_bytes(sizes: Sequence[int]) -> int:
    """The widest copy word (16 bytes down to 1) that every size and address divides."""
    common = math.gcd(*sizes)
    return next(v for v in (16, 8, 4, 2, 1) if common % v == 0)


def threads_per_tensor(sizes: Sequence[int], word: int) -> int:
    """Both kernels' threads per expert and tensor: one a `word` of the largest tensor, at most
    BLOCKS_PER_TENSOR blocks of them (each thread's loop strides over the rest)."""
    return min(BLOCKS_PER_TENSOR, -(-max(sizes) // word // THREADS)) * THREADS


class ExpertGather:
    """The gather kernel for one pool's tensors (SlotTensors), compiled once by MLX (nvrtc).
    `alignment`: what every source address divides (a multiple of each tensor's file offset and
    stride); the kernel copies in the widest word that it and every tensor size allow (a word
    misaligned would be a CUDA error that ends the process's context). `admits`: the plan mode
    (cache/admission.py), whose second input is SlotAdmit's plan instead of the slot table."""

    def __init__(self, tensors: Sequence, alignment: int, admits: bool = False):
        self._tensors, self.alignment = tuple(tensors), alignment
        count, sizes = len(self._tensors), tuple(t.nbytes for t in self._tensors)
        word = word_bytes([*sizes, alignment])
        self._threads = threads_per_tensor(sizes, word)
        mode = "plan" if admits else "table"
        self._kernel = cuda_kernel(
            "expert_gather",
            ["routed", mode, "sources", *(f"pool{t}" for t in range(count))],
            [f"out{t}" for t in range(count)],
            _source(sizes, word, admits),
            *(t.dtype for t in self._tensors),
        )

    def __call__(
        self, routed: mx.array, table: mx.array, sources: mx.array, pool: Sequence[mx.array]
    ) -> list[mx.array]:
        """Per tensor, [routed.size, *shape]: row j holds expert routed[j]'s tensor, from its slot
        (`table`: uint32 per expert, NO_SLOT none; or SlotAdmit's plan) or from `sources` (uint64
        [tensors, 2]: expert 0's device address, stride); unwritten where it is UNWANTED."""
        count = routed.size
        return self._kernel(
            inputs=[routed.reshape(-1).astype(mx.uint32), table, sources, *pool],
            grid=(self._threads, count, len(self._tensors)),
            threadgroup=(THREADS, 1, 1),
            output_shapes=[(count, *t.shape) for t in self._tensors],
            output_dtypes=[t.dtype for t in self._tensors],
        )


def _admit_source(entries: int, slots: int) -> str:
    """The admission kernel's body, one thread: cache/admission.py `admit`. `table`, `owner`
    and `cursor` are inputs written through their pointers, which order nothing in MLX's graph:
    the next admission takes a view of this call's gather as an input (`after`), and the pool's
    earlier readers are queued first (SlotPool.gather)."""
    return f"""
    uint32_t* table_ = const_cast<uint32_t*>(table);
    uint32_t* owner_ = const_cast<uint32_t*>(owner);
    uint32_t* cursor_ = const_cast<uint32_t*>(cursor);
    for (uint32_t j = 0; j < {entries}; ++j) {{
        plan[j] = table_[base[0] + routed[j]];
        plan[{entries} + j] = {NO_SLOT}u;
    }}
    uint32_t at = cursor_[0];
    for (uint32_t j = 0; j < {entries}; ++j) {{
        const uint32_t key = base[0] + routed[j];
        if (plan[j] != {NO_SLOT}u || table_[key] != {NO_SLOT}u) continue;
        for (bool read = true; read && at < {slots}; at += read) {{  // pass the call's slots
            read = false;
            for (uint32_t i = 0; i < {entries}; ++i) read = read || plan[i] == queue[at];
        }}
        if (at == {slots}) break;
        const uint32_t victim = queue[at], old = owner_[victim];
        if (old != {NO_SLOT}u && counts[key] <= counts[old]) continue;
        ++at;
        if (old != {NO_SLOT}u) table_[old] = {NO_SLOT}u;
        owner_[victim] = key;
        table_[key] = victim;
        plan[{entries} + j] = victim;
    }}
    cursor_[0] = at;
"""


class SlotAdmit:
    """The admission kernel for a pool of `slots` slots, compiled by MLX once per call size."""

    def __init__(self, slots: int):
        self._slots = slots
        self._kernels: dict[int, object] = {}  # routed entries -> kernel

    def __call__(self, routed: mx.array, base: mx.array, *state: mx.array) -> mx.array:
        """The plan (uint32 [2, routed.size]: each entry's source slot, NO_SLOT the file, and the
        slot it also goes to) of `routed`, the experts of the layer whose first key is `base`;
        `state`: the table, owner, queue, counts (float32), cursor (cache/admission.py) and an
        array (uint8) the kernel only waits for (Admission.gather says why)."""
        n = routed.size
        if n not in self._kernels:
            names = ["routed", "base", "table", "owner", "queue", "counts", "cursor", "after"]
            source = _admit_source(n, self._slots)
            self._kernels[n] = cuda_kernel("slot_admit", names, ["plan"], source)
        (plan,) = self._kernels[n](
            inputs=[routed.reshape(-1).astype(mx.uint32), base, *state],
            grid=(1, 1, 1),
            threadgroup=(1, 1, 1),
            output_shapes=[(2, n)],
            output_dtypes=[mx.uint32],
        )
        return plan


def _fill_source(nbytes: Sequence[int], vector: int) -> str:
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
{_COPY.format(vector=vector, word=word, also="")}
    if (j == 0 && t == 0 && blockIdx.x == 0 && threadIdx.x == 0) {{
        done[0] = 1;
    }}
"""


class SlotFill:
    """The fill kernel for one pool's tensors (SlotTensors), compiled once per copy word by MLX.
    A call copies each move's tensors from the pinned files into its slot and returns a
    one-element output: computing it is the copy (the pool's fence waits for it)."""

    def __init__(self, tensors: Sequence):
        self._tensors = tuple(tensors)
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
            source = _fill_source(sizes, word)
            dtypes = (t.dtype for t in self._tensors)
            self._kernels[word] = cuda_kernel("slot_fill", names, ["done"], source, *dtypes)
        (done,) = self._kernels[word](
            inputs=[mx.array(slots, mx.uint32), mx.array(addresses, mx.uint64), *pool],
            grid=(threads_per_tensor(sizes, word), len(slots), len(self._tensors)),
            threadgroup=(THREADS, 1, 1),
            output_shapes=[(1,)],
            output_dtypes=[mx.uint32],
        )
        return done
