"""Kernel names (io/cuda_kernel.py): MLX caches a compiled kernel by its name alone, in the
process and on disk, so a name must change whenever what it compiles changes. Checked on any
backend, with MLX's kernel builder recorded instead of called (it exists on CUDA only)."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from test_slot_pool import TENSORS

from streamer.io import cuda_gather
from streamer.io.cuda_kernel import kernel_name


@pytest.fixture
def built(monkeypatch) -> list[dict]:
    """Each kernel MLX was asked to build (its arguments), none built."""
    calls: list[dict] = []

    def record(**kwargs):
        calls.append(kwargs)
        return lambda **_: [mx.zeros((1,), mx.uint32)]

    monkeypatch.setattr(mx.fast, "cuda_kernel", record)
    return calls


def test_a_name_follows_what_compiles():
    """The same source and names give the same name; another source, input or dtype another."""
    first = kernel_name("k", ["a"], ["b"], "b[0] = a[0];", "uint32")
    assert first == kernel_name("k", ["a"], ["b"], "b[0] = a[0];", "uint32")
    assert first.startswith("streamer_k_")
    others = [
        kernel_name("k", ["a"], ["b"], "b[0] = a[1];", "uint32"),
        kernel_name("k", ["a", "after"], ["b"], "b[0] = a[0];", "uint32"),  # an input added
        kernel_name("k", ["a"], ["b"], "b[0] = a[0];", "bfloat16"),
    ]
    assert len({first, *others}) == 4


def test_each_kernel_is_named_by_its_source(built, monkeypatch):
    """The gather and the fill kernels: every name differs, none is MLX's to reuse once the
    source changes, and inputs are passed uncopied."""
    cuda_gather.ExpertGather(TENSORS, 16)
    addresses = np.full((1, len(TENSORS)), 1 << 20, dtype=np.uint64)
    cuda_gather.SlotFill(TENSORS)(np.array([0], np.uint32), addresses, [])
    names = [call["name"] for call in built]
    assert len(set(names)) == 2 and all(not call["ensure_row_contiguous"] for call in built)
    monkeypatch.setattr(cuda_gather, "_source", lambda *args: "/* another body */")
    cuda_gather.ExpertGather(TENSORS, 16)
    assert built[-1]["name"] not in names
