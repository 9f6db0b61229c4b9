"""MLX's gather_qmm takes NVFP4 global scales only on a GPU, so on the CPU neither mlx-lm nor
streamer can compute experts that carry one. This stand-in computes what gather_qmm computes
(each expert's weight dequantized with its own global scale, then gather_mm) and is installed for
both sides of a comparison: mlx-lm's resident model and the streamed one call the same function,
so equal outputs show that every routed expert's weight, scales and global scale reached it
intact on each read path."""

from __future__ import annotations

import mlx.core as mx
import pytest

GATHER_QMM = mx.gather_qmm


def gather_qmm(
    x,
    w,
    scales,
    biases=None,
    lhs_indices=None,
    rhs_indices=None,
    transpose=True,
    group_size=None,
    bits=None,
    mode="affine",
    global_scale=None,
    *,
    sorted_indices=False,
    stream=None,
):
    if global_scale is None:
        return GATHER_QMM(
            x,
            w,
            scales,
            biases,
            lhs_indices,
            rhs_indices,
            transpose,
            group_size,
            bits,
            mode,
            sorted_indices=sorted_indices,
        )
    dense = mx.stack(
        [
            mx.dequantize(
                w[e], scales[e], None, group_size, bits, mode, global_scale[e], dtype=x.dtype
            )
            for e in range(w.shape[0])
        ]
    )
    if transpose:
        dense = dense.swapaxes(-1, -2)
    return mx.gather_mm(x, dense, lhs_indices, rhs_indices, sorted_indices=sorted_indices)


@pytest.fixture
def global_scales_on_cpu(monkeypatch):
    """gather_qmm with global scales on the CPU, for the duration of a test."""
    if mx.default_device() == mx.cpu:
        monkeypatch.setattr(mx, "gather_qmm", gather_qmm)
