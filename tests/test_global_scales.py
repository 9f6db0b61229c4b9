"""NVFP4 experts with a tensor scale each (mlx-lm's `global_scale`, one scalar per projection per
expert) travel with their expert: in its record and in place, into the slot pool, the hot cache and
resident layers, and reach gather_qmm for exactly the routed experts. MLX's CPU gather_qmm takes
no global scale, so on the CPU both sides compute through gather_qmm_stand_in; without it, the CPU
refuses such a model at load, as mlx-lm fails at its first token."""

from __future__ import annotations

import mlx.core as mx
import pytest
from conftest import reference_model
from test_parity import PROMPT, assert_exactly_as, compare, read_paths

import streamer
from streamer.io.manifest import read_manifest

pytestmark = pytest.mark.usefixtures("global_scales_on_cpu")


@pytest.fixture(scope="module")
def nvfp4(checkpoints):
    return checkpoints.mlx_nvfp4_global_scales()


def test_global_scales_stream_repacked_and_in_place(checkpoints, nvfp4):
    folder = checkpoints.repacked(nvfp4)
    for layer in read_manifest(folder).layers:
        assert {p: q["global_scale"] for p, q in layer.quantization.items()} == {
            "gate_proj": True,
            "up_proj": True,
            "down_proj": True,
        }
        scales = [t for t in layer.tensors if t.name.endswith(".global_scale")]
        assert [(t.dtype, t.shape) for t in scales] == [("F32", ())] * 3
    reference = reference_model(nvfp4)
    compare(folder, reference, tolerance=0.0)
    compare(nvfp4, reference, tolerance=0.0)  # in place: the stacked [E] global scales viewed


@pytest.mark.parametrize("read_path", read_paths())
@pytest.mark.parametrize("budget", ["all", "hot experts"])
def test_global_scales_in_memory_resident_experts(checkpoints, nvfp4, read_path, budget):
    """Resident layers hold every expert's scale; the hot cache and the slot pool hold the
    routed ones'."""
    from streamer.cache.budget import largest_expert_bytes

    folder = checkpoints.repacked(nvfp4)
    one = largest_expert_bytes(read_manifest(folder), mx.float32)
    model, tokenizer = streamer.load(
        folder,
        memory_budget={"all": 1 << 40, "hot experts": 12 * one}[budget],
        read_path=read_path,
        dtype=mx.float32,
    )
    assert_exactly_as(model, reference_model(nvfp4), mx.array(tokenizer.encode(PROMPT)), 32)
    if budget == "hot experts":
        assert model.streamer.stats.decode.cache_hits > 0


def test_global_scales_are_refused_where_gather_qmm_takes_none(checkpoints, nvfp4, monkeypatch):
    from gather_qmm_stand_in import GATHER_QMM

    if mx.default_device() != mx.cpu:
        pytest.skip("MLX's GPU gather_qmm takes global scales")
    monkeypatch.setattr(mx, "gather_qmm", GATHER_QMM)
    for folder in (checkpoints.repacked(nvfp4), nvfp4):
        with pytest.raises(streamer.StreamerError, match="carry a global scale each.*on a GPU"):
            streamer.load(folder, memory_budget=0)
