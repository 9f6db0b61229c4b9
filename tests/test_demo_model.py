"""The built-in demo model: a real Hugging Face checkpoint that mlx-lm and streamer agree on."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import mlx.core as mx
import numpy as np

import streamer
from streamer.cli import DEMO_MODEL, main
from streamer.repack import repack

ROOT = Path(__file__).resolve().parent.parent
TEXT = (
    'def read_config(path):\n    """Return the parsed configuration file."""\n'
    "    with open(path) as f:\n"
)


def test_checkpoint_is_in_hugging_face_format():
    config = json.loads((DEMO_MODEL / "config.json").read_text())
    assert config["model_type"] == "qwen3_moe" and config["torch_dtype"] in ("bfloat16", "float16")
    names = set(mx.load(str(DEMO_MODEL / "model.safetensors")))
    assert "model.layers.0.mlp.experts.0.gate_proj.weight" in names
    assert not any("switch_mlp" in n for n in names)
    tokenizer_config = json.loads((DEMO_MODEL / "tokenizer_config.json").read_text())
    assert (
        tokenizer_config["tokenizer_class"] == "PreTrainedTokenizerFast"
        and tokenizer_config["chat_template"]
    )


def test_streamer_matches_mlx_lm(tmp_path):
    from mlx_lm.utils import load_model

    reference, _ = load_model(DEMO_MODEL)
    reference.set_dtype(mx.float32)
    repack(DEMO_MODEL, tmp_path / "streaming", quantize=None)
    model, tokenizer = streamer.load(tmp_path / "streaming", dtype=mx.float32)
    tokens = mx.array([tokenizer.encode(TEXT)])
    expected, got = reference(tokens), model(tokens)
    assert np.array_equal(np.array(expected), np.array(got))


def test_demo_says_what_to_run_next(capsys, tmp_path):
    """The demo ended on its stats line, its model gone with its temporary folder: nothing said
    how to run it again, nor that --keep keeps it."""
    assert main(["demo", "--max-tokens", "2"]) == 0
    last = capsys.readouterr().err.rstrip().splitlines()[-1]
    assert "--keep DIR" in last and "streamer chat --model DIR" in last, last
    assert main(["demo", "--max-tokens", "2", "--keep", str(tmp_path / "m")]) == 0
    last = capsys.readouterr().err.rstrip().splitlines()[-1]
    assert f"streamer chat --model {tmp_path / 'm'}" in last and "--keep" not in last, last


def test_demo_prints_readable_text(capsys, tmp_path):
    assert main(["demo", "--max-tokens", "30", "--keep", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert len(text) > 40
    printable = sum(c.isascii() and (c.isprintable() or c in "\n\t") for c in text)
    assert printable / len(text) > 0.95
    # --keep DIR is the model's folder itself (it was empty), ready for --model DIR
    assert (tmp_path / "manifest.json").exists()
    assert main(["generate", "--model", str(tmp_path), "--prompt", "x", "--max-tokens", "2"]) == 0
    # a folder that holds anything is not written into
    capsys.readouterr()
    assert main(["demo", "--keep", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"--keep {tmp_path}: not an empty folder" in err and len(err.splitlines()) == 1


def test_routing_summary_writes_a_trace(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location(
        "routing_summary", ROOT / "tools" / "routing_summary.py"
    )
    routing_summary = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(routing_summary)
    text = tmp_path / "held_out.py"
    text.write_text(TEXT * 20)
    trace = tmp_path / "trace.npz"
    routing_summary.main(
        [
            "--model",
            str(DEMO_MODEL),
            "--text",
            str(text),
            "--max-tokens",
            "300",
            "--seq",
            "128",
            "--trace",
            str(trace),
        ]
    )
    assert "overlap" in capsys.readouterr().out
    data = np.load(trace)
    config = json.loads((DEMO_MODEL / "config.json").read_text())
    assert data["experts"].shape == (
        300,
        config["num_hidden_layers"],
        config["num_experts_per_tok"],
    )
    assert data["experts"].max() < config["num_experts"]
    assert list(data["window_start"]) == [0, 128, 256]


def test_the_demo_runs_at_every_dtype_the_cli_offers(capsys, tmp_path):
    """Every expert projection quantizes (down_proj's width 48 took no affine group of 64 and
    stayed unquantized, which the CPU computes in float32 only): --dtype bfloat16 failed."""
    from streamer.arguments import DTYPE_NAMES

    for dtype in DTYPE_NAMES:
        assert main(["demo", "--dtype", dtype, "--max-tokens", "3"]) == 0, capsys.readouterr()
        assert f"| {dtype}\n[demo]" in capsys.readouterr().err  # the stats line's end
    assert main(["demo", "--keep", str(tmp_path), "--max-tokens", "1"]) == 0
    argv = ["generate", "--model", str(tmp_path), "--prompt", "x", "--max-tokens", "2"]
    assert main([*argv, "--dtype", "bfloat16"]) == 0
    capsys.readouterr()
    assert main(["info", str(tmp_path)]) == 0
    assert "expert weights    4-bit nvfp4, group 16\n" in capsys.readouterr().out


def test_info_names_the_projections_left_unquantized(capsys, tmp_path):
    """Affine groups of 64 leave the width-48 down_proj unquantized: info says which, and a
    dtype the backend cannot compute it in is refused with the flag's spelling."""
    from streamer.loading.backend import backend
    from streamer.repack import Quantize

    repack(DEMO_MODEL, tmp_path / "m", quantize=Quantize(4), log=lambda _: None)
    assert main(["info", str(tmp_path / "m")]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("expert weights"))
    want = "gate_proj, up_proj: 4-bit affine, group 64; down_proj: unquantized (bfloat16)"
    assert line.split(maxsplit=2)[2] == want, line
    if backend() == "cpu":  # MLX's CPU gather_mm computes only float32
        argv = ["generate", "--model", str(tmp_path / "m"), "--prompt", "x", "--dtype", "bfloat16"]
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "--dtype bfloat16 cannot" in err and "pass --dtype float32" in err, err
        assert "on MLX's cpu backend (" in err, err  # was "on MLX's Device(cpu, 0) backend"
        assert "dtype='float32'" not in err, err
        # it was repacked with --quantize, which "or repack with --quantize" said to do
        assert "down_proj, which --quantize left unquantized" in err and "--group-size" in err
