"""gpt-oss as transformers writes it unquantized (the BF16 re-uploads): `experts.gate_up_proj`
[E, H, 2I] with gate and up interleaved, `gate_up_proj_bias`, `down_proj` [E, I, H]. mlx-lm does
not read this layout; streamer converts it (streamer/repack/layouts.py).

torch is not installed here (nor in CI), so transformers' GptOssExperts cannot run: its forward
(transformers/models/gpt_oss/modeling_gpt_oss.py) is restated in numpy below and checked on the
fixture, and the streamed model is checked against mlx-lm's resident model on the same weights in
mlx-lm's own stacked names."""

from __future__ import annotations

import contextlib
import io

import mlx.core as mx
import mlx_lm
import numpy as np
from conftest import reference_model
from test_parity import compare

from fixtures import tiny_config, write_hf_checkpoint
from streamer.repack import Quantize, repack

ALPHA, LIMIT = 1.702, 7.0  # GptOssConfig's swiglu_alpha, swiglu_limit defaults


def config() -> dict:
    """The tiny gpt-oss without its MXFP4 quantization_config, as the BF16 re-uploads ship."""
    return {k: v for k, v in tiny_config("gpt_oss").items() if k != "quantization_config"}


def transformers_expert(x: np.ndarray, tensors: dict[str, np.ndarray], e: int) -> np.ndarray:
    """transformers' GptOssExperts for one expert: x @ W + b, gate/up interleaved, clamped."""
    gate_up = x @ tensors["gate_up_proj"][e] + tensors["gate_up_proj_bias"][e]
    gate, up = gate_up[..., ::2], gate_up[..., 1::2]
    gate = np.minimum(gate, LIMIT)
    up = np.clip(up, -LIMIT, LIMIT)
    glu = gate * (1 / (1 + np.exp(-gate * ALPHA)))
    return ((up + 1) * glu) @ tensors["down_proj"][e] + tensors["down_proj_bias"][e]


def test_fixture_layout_is_transformers_semantics(tmp_path):
    """The fixture's transformers-layout tensors, run as transformers runs them, give what
    mlx-lm's expert layer gives on the same weights in its own layout."""
    tf = write_hf_checkpoint(tmp_path / "tf", config(), layout="gpt_oss/transformers")
    stacked = write_hf_checkpoint(tmp_path / "mlx", config(), layout="gpt_oss/stacked")
    weights = {}
    for shard in tf.glob("*.safetensors"):
        weights.update(mx.load(str(shard)))
    prefix = "model.layers.0.mlp.experts."
    tensors = {
        n[len(prefix) :]: np.array(a.astype(mx.float32))
        for n, a in weights.items()
        if n.startswith(prefix)
    }
    experts = reference_model(stacked).model.layers[0].mlp.experts
    x = np.random.default_rng(0).standard_normal((5, config()["hidden_size"])).astype(np.float32)
    for e in (0, 7, 15):
        ours = experts(mx.array(x), mx.full((5, 1), e, dtype=mx.uint32))[:, 0]
        np.testing.assert_allclose(np.array(ours), transformers_expert(x, tensors, e), atol=1e-4)


def test_transformers_layout_streams_like_mlx_lm_on_the_same_weights(tmp_path):
    tf = write_hf_checkpoint(tmp_path / "tf", config(), layout="gpt_oss/transformers")
    stacked = write_hf_checkpoint(tmp_path / "mlx", config(), layout="gpt_oss/stacked")
    repack(tf, tmp_path / "bf16", log=lambda _: None)
    compare(tmp_path / "bf16", reference_model(stacked), tolerance=1e-4)


def test_quantize_equals_mlx_lm_convert_of_the_same_weights(tmp_path):
    """`--quantize` of the transformers layout is what mlx_lm.convert makes of the same weights
    (4-bit affine experts and attention, the 8-bit router gpt-oss's quant_predicate asks for)."""
    tf = write_hf_checkpoint(tmp_path / "tf", config(), layout="gpt_oss/transformers")
    stacked = write_hf_checkpoint(tmp_path / "mlx", config(), layout="gpt_oss/stacked")
    with contextlib.redirect_stdout(io.StringIO()):
        mlx_lm.convert(str(stacked), str(tmp_path / "q4"), quantize=True, q_bits=4, q_group_size=64)
    repack(tf, tmp_path / "streamed", quantize=Quantize(4, 64), log=lambda _: None)
    compare(tmp_path / "streamed", reference_model(tmp_path / "q4"), tolerance=0.0)
