"""`streamer demo`: repack the built-in tiny trained MoE and generate, offline."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from ..errors import StreamerError
from .generate import stream
from .interrupts import raising_on_ctrl_c
from .options import DTYPE_NAMES, add_prompt
from .prompt_text import prompt

DEMO_MODEL = Path(__file__).parent.parent / "demo_model"
# 4-bit experts, as users run real models, in NVFP4 (groups of 16): the one 4-bit mode whose
# groups divide every expert width of the demo model (down_proj's is 48). Affine groups of 64 left
# down_proj unquantized, which MLX's CPU gather_mm computes in float32 only: --dtype bfloat16
# failed. Held-out cross entropy (8192 tokens, float32): 4.9558 nats unquantized, 4.9573 affine
# 4-bit group 64 (down_proj unquantized), 4.9606 NVFP4 (0.1% over unquantized).
DEMO_QUANTIZE = (4, 16, "nvfp4")  # bits, group size, mode


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="repack the built-in tiny trained MoE and generate (offline)")
    add_prompt(p, 'def read_config(path):\n    """', seed=0)
    p.add_argument(
        "--keep",
        metavar="DIR",
        help="keep the repacked demo model in DIR (a new or empty folder), to run it again with "
        "generate, chat or serve --model DIR",
    )
    p.add_argument(
        "--dtype",
        choices=DTYPE_NAMES,
        help="what to compute in (default: float32 on the CPU, bfloat16 on a GPU)",
    )
    # a 3M-parameter model loops under greedy decoding; mild sampling with a fixed seed reads better
    p.set_defaults(run=demo, max_tokens=40, temp=0.5, top_p=0.9)


def demo(args: argparse.Namespace) -> int:
    text = prompt(args)
    keep = Path(args.keep) if args.keep else None
    if keep is not None and (keep.is_symlink() or keep.exists()) and not _empty_folder(keep):
        raise StreamerError(
            f"--keep {keep}: not an empty folder; give a new (or empty) one, so that nothing in "
            "it is replaced."
        )
    from ..loading.load import load
    from ..repack import Quantize, repack

    # from here on a Ctrl-C raises, so that the temporary folder is removed
    with raising_on_ctrl_c(), tempfile.TemporaryDirectory(prefix="streamer-demo-") as tmp:
        dst = keep if keep is not None else Path(tmp) / "streaming"
        quantize = Quantize(*DEMO_QUANTIZE)
        precision = f"with {DEMO_QUANTIZE[0]}-bit {DEMO_QUANTIZE[2].upper()} experts"
        print(
            f"[demo] built-in model: a {_demo_size()} qwen3_moe trained on Python's standard "
            f"library (tools/train_demo.py); repacking it {precision} to {dst}",
            file=sys.stderr,
        )
        if dst.exists():
            dst.rmdir()  # an empty --keep folder: repack writes DST itself (rmdir takes no file)
        repack(DEMO_MODEL, dst, quantize=quantize)
        # every layer streamed, to show the mechanism
        model, tokenizer = load(dst, memory_budget=0, dtype=args.dtype)
        print(f"[demo] generating; expert weights are streamed from {dst}", file=sys.stderr)
        status = stream(model, tokenizer, text, args)
    if status == 0:  # what to run next
        kept = f"is in {keep}" if keep else "was temporary: `streamer demo --keep DIR` keeps it"
        runs = "streamer chat --model " + (str(keep) if keep else "DIR")
        print(
            f"[demo] the repacked model {kept}; `{runs}` (or generate, serve) runs it",
            file=sys.stderr,
        )
    return status


def _empty_folder(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink() and not any(path.iterdir())


def _demo_size() -> str:
    from ..io.json_file import read_json_object

    config = read_json_object(DEMO_MODEL / "config.json", "reinstall streamer.")
    layers, experts, k = (
        config["num_hidden_layers"],
        config["num_experts"],
        config["num_experts_per_tok"],
    )
    return f"{layers}-layer, {experts}-expert (top-{k})"
