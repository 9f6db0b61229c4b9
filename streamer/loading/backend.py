"""Where MLX computes (the CPU, Metal or CUDA) and what that makes the defaults."""

from __future__ import annotations

import numbers
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import mlx.core as mx
import psutil

from ..cpu_cores import in_words, ranks_on_this_host, usable_cores
from ..errors import ArgumentError, StreamerError, one_line, refusal
from ..io.compute_backend import backend
from ..io.safetensors import DTYPES


def default_dtype() -> mx.Dtype | None:
    """float32 on the CPU backend (its gather_mm is float32-only and its quantized matmuls are
    several times faster with float32 activations); the checkpoint's own dtype on a GPU."""
    return mx.float32 if backend() == "cpu" else None


READ_PATHS = ("slots", "mapped")


@dataclass(frozen=True)
class Memory:
    """One reading of the memory a load's experts may take (available_memory), and what it is."""

    available: int  # bytes free for them
    name: str = "memory"  # which memory, as the plan says it: "GPU memory" on CUDA
    host: int | None = None  # the host's memory available where the experts' memory is other
    # memory (CUDA's GPU memory): what CUDA's landing page-locks files in; None: it is the host's


def available_memory() -> Memory:
    """The memory available to a load's experts, read once per load (its residency plan) on this
    backend. The CPU: the host's. CUDA: the GPU's free memory (mx.device_info: every resident
    expert and the slot pool live there), within MLX's memory limit. Metal: unified memory, the
    host's, within Metal's recommended working set (and MLX's limit) less what MLX holds: past
    the working set a model "can be slow" (mlx-lm's warning). Past MLX's limit its scheduler
    runs op by op (handle.memory_limit_raised)."""
    host = psutil.virtual_memory().available
    where = backend()
    if where == "cpu":
        return Memory(host)
    info, held = mx.device_info(), mx.get_active_memory()
    within_limit = mx.get_memory_limit() - held
    if where == "cuda":
        return Memory(max(min(int(info["free_memory"]), within_limit), 0), "GPU memory", host)
    working_set = min(int(info["max_recommended_working_set_size"]) - held, within_limit)
    if working_set < host:
        return Memory(max(working_set, 0), "GPU memory (Metal's working set)")
    return Memory(host)


def read_path_for_backend(read_path: object, name: str = "read_path") -> tuple[str, str]:
    """The read path to use and why. A GPU gets the slot pool: on Metal a no-copy buffer over a
    mapped file is wired whole on first GPU use, and MLX's CUDA backend cannot read a mapped file
    at all (an illegal memory access). The CPU computes in place on the mapped files (measured
    fastest there) unless asked otherwise. Decided once, in options.load_options."""
    where = backend()
    if read_path is None:
        if where == "cpu":
            return "mapped", "the CPU default: computed in place on the mapped files"
        return "slots", f"the {where} default: the GPU sees only the bounded slot pool"
    if read_path not in READ_PATHS:
        raise ArgumentError(f"{name} must be one of {', '.join(READ_PATHS)}, not {read_path!r}.")
    if read_path == "mapped" and where == "cuda":
        raise refusal(
            lambda spell: (
                f"{spell('read_path', 'mapped')} does not run on MLX's CUDA backend (the GPU "
                "cannot read a mapped file; it has no tested implementation there): use "
                f"{spell('read_path', 'slots')}, the default."
            )
        )
    return read_path, "asked for"


def threads_for_backend(threads: object, name: str = "threads") -> tuple[int, str]:
    """How many cores a token's large matmuls are cut across (cpu_cores.py), and why: on the CPU
    backend those this process may use unless asked (default_threads); on a GPU one, as the GPU
    computes them all (why: "", nothing to say). Decided once, in options.load_options."""
    where = backend()
    if threads is None:
        return default_threads(usable_cores(), ranks_on_this_host()) if where == "cpu" else (1, "")
    # numpy's integers too (a count from an array), as load's memory_budget takes them
    if isinstance(threads, bool) or not isinstance(threads, numbers.Integral) or threads < 1:
        raise ArgumentError(f"{name} must be a whole number of cores, 1 or more (got {threads!r}).")
    threads = int(threads)
    if where != "cpu":
        if threads > 1:
            raise ArgumentError(
                f"{name} {threads}: on {where} the GPU computes every matmul; the threads "
                "setting cuts the CPU backend's matmuls across its cores. Leave it out."
            )
        return threads, ""
    usable = usable_cores()
    if threads > usable:  # a part per stream past the cores only waits for one: threads for none
        return usable, f"asked for {threads}; this process may use {usable}"
    return threads, "asked for"


def default_threads(usable: int, ranks: int) -> tuple[int, str]:
    """The CPU backend's cores for a process that may use `usable` of them, `ranks` ranks of its
    launch on this host sharing them (cpu_cores.ranks_on_this_host), and why: an even share each,
    one at least (each rank taking them all, 2 ranks on 2 cores ran 4 matmul threads)."""
    if ranks <= 1:
        return usable, "every core this process may use"
    shared = f"the {in_words(usable)} this process may use, shared by {ranks} ranks on this host"
    return max(usable // ranks, 1), shared


def check_backend_computes(layers: Sequence, dtype: mx.Dtype | None) -> None:
    """Refuse now, not at the first token, a compute dtype this backend's expert kernels lack
    (MLX's CPU gather_mm runs only in float32: unquantized experts in bf16 fail there; its
    quantized gather_qmm takes every float dtype). `layers`: a manifest's or a download's MoE
    layers (each with `quantization` per projection and `tensors` named "proj.kind")."""
    if any(q and q.get("global_scale") for layer in layers for q in layer.quantization.values()):
        check_global_scales()
    unquantized = [
        t
        for layer in layers
        for t in layer.tensors
        if layer.quantization.get(t.name.split(".")[0]) is None and t.name.endswith("weight")
    ]
    if not unquantized:
        return
    compute = dtype if dtype is not None else DTYPES[unquantized[0].dtype][1]
    refuse_gather_mm(compute, "this model's", lambda: _quantized_repack(layers, unquantized))


def refuse_gather_mm(dtype: mx.Dtype, whose: str, instead: Callable[[], str]) -> None:
    """Refuse `whose` (a model's, in words) unquantized experts in `dtype` where this backend's
    gather_mm cannot compute them, naming what to pass `instead` (the words, made when refused)."""
    why = gather_mm_fault(dtype)
    if why is not None:
        name = str(dtype).removeprefix("mlx.core.")
        raise refusal(
            lambda spell: (
                f"{spell('dtype')} {name} cannot compute {whose} unquantized experts on MLX's "
                f"{backend()} backend ({why}); pass {spell('dtype', 'float32')} (the default "
                f"there) or {instead()}."
            )
        )


def gather_mm_fault(compute: mx.Dtype) -> str | None:
    """Why MLX's gather_mm, which computes unquantized experts, fails in `compute` on this
    backend (the CPU's runs only in float32), in one line; None where it computes."""
    try:
        x, w = mx.zeros((1, 1, 32), compute), mx.zeros((2, 32, 32), compute)
        mx.eval(mx.gather_mm(x, w, rhs_indices=mx.array([[0]], mx.uint32)))
    except (RuntimeError, ValueError) as e:
        return one_line(e)
    return None


def _quantized_repack(layers: Sequence, unquantized: Sequence) -> str:
    """The repack that quantizes every expert projection: --quantize, or where a --quantize left
    some as they were (no group of its size divides their width), a smaller group."""
    if not any(q for layer in layers for q in layer.quantization.values()):
        return "repack with --quantize"
    kept = ", ".join(sorted({t.name.split(".")[0] for t in unquantized}))
    return (
        f"repack with a --group-size that divides the width of {kept}, which --quantize left "
        "unquantized"
    )


def check_global_scales() -> None:
    """NVFP4 experts with a tensor scale each (Muse Spark's) need a gather_qmm that takes global
    scales: MLX's takes them only on a GPU, so on the CPU mlx-lm cannot run such a model either."""
    w, scales = mx.quantize(mx.ones((32, 32)), 16, 4, mode="nvfp4", global_scale=mx.array(1.0))
    try:
        mx.eval(
            mx.gather_qmm(
                mx.zeros((1, 1, 32)),
                w[None],
                scales[None],
                rhs_indices=mx.array([[0]], mx.uint32),
                group_size=16,
                bits=4,
                mode="nvfp4",
                global_scale=mx.ones((1,)),
            )
        )
    except (RuntimeError, ValueError) as e:
        raise StreamerError(
            "this model's NVFP4 experts carry a global scale each, which MLX's gather_qmm takes "
            f"only on a GPU, not on its {backend()} backend ({one_line(e)}): run it on "
            "Metal or CUDA, or repack the bf16 checkpoint with --quantize."
        ) from None


def check_model_kernels(model) -> None:
    """A model whose mlx-lm file computes with Metal kernels of mlx-lm's own (`mlx_lm.kernels`,
    which have no other implementation: Muse Spark's) runs only where Metal does."""
    module = sys.modules[type(model).__module__]
    kernels = sorted(
        name
        for name, value in vars(module).items()
        if callable(value) and getattr(value, "__module__", "").startswith("mlx_lm.kernels")
    )
    if kernels and not mx.metal.is_available():
        raise StreamerError(
            f"mlx-lm's {module.__name__.rsplit('.', 1)[1]} model computes with Metal kernels "
            f"({', '.join(kernels)}; mlx_lm.kernels), which run only on Apple silicon's Metal "
            f"backend, not on this machine's {backend()} backend, where mlx-lm cannot run it "
            "either: stream it on a Mac (a folder repacked here streams there)."
        )
