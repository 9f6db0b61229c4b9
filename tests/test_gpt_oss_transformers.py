"""gpt-oss as transformers writes it unquantized (the BF16 re-uploads): `experts.gate_up_proj`
[E, H, 2I] with gate and up interleaved, `gate_up_proj_bias`, `down_proj` [E, I, H]. mlx-lm does
not read this layout; streamer converts it (streamer/repack/layouts.py).

test_transformers_written.py judges a checkpoint that transformers itself writes against
transformers' own forward. Here the fixture writes the same weights in this layout and in mlx-lm's
stacked names, so the streamed model and `--quantize` are checked against mlx-lm on them."""

from __future__ import annotations

import contextlib
import io

import mlx_lm
from conftest import reference_model
from test_parity import compare

from fixtures import tiny_config, write_hf_checkpoint
from streamer.repack import Quantize, repack


def config() -> dict:
    """The tiny gpt-oss without its MXFP4 quantization_config, as the BF16 re-uploads ship."""
    return {k: v for k, v in tiny_config("gpt_oss").items() if k != "quantization_config"}


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
