"""The checkpoint shapes the benchmark generates (real models' configs, trimmed variants) and the
synthetic routing's defaults and options."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # fixtures/: not installed
from fixtures.published_shapes import PUBLISHED_SHAPES, QWEN3_30B_A3B, with_size  # noqa: E402

PRESETS: dict[str, dict] = {
    # The published shapes (fixtures/published_shapes.py cites each config.json): run them from
    # --sparse checkpoints (bench/sizes.py); random values at these sizes need the disk they say.
    **PUBLISHED_SHAPES,
    # A quarter of the depth and a quarter of the vocabulary: the output projection keeps the share
    # of a token's compute it has in the 48-layer model (on CPU it would otherwise dominate).
    "qwen3-30b-a3b-12l": {**QWEN3_30B_A3B, "num_hidden_layers": 12, "vocab_size": 151936 // 4},
    # Not real-shaped: small enough that generate + repack + both engines fit in seconds.
    "quick": {
        **QWEN3_30B_A3B,
        "num_hidden_layers": 2,
        "hidden_size": 512,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "moe_intermediate_size": 256,
        "num_experts": 32,
        "num_experts_per_tok": 4,
        "vocab_size": 4096,
    },
}
# The quick shape routed as Qwen3-30B-A3B is (128 experts, top-8): compute small, so the engine's
# own host work per layer call shows (bench/host_cost.py).
PRESETS["narrow"] = {**PRESETS["quick"], "num_experts": 128, "num_experts_per_tok": 8}
# Calibrated on qwen3-30b-a3b-12l to the published statistics (bench/README.md, "The models").
ROUTING = {"skew": 0.3, "topic_share": 0.7, "stickiness": 6.0}


def preset_config(
    name: str, *, num_hidden_layers: int | None = None, experts: int | None = None, **overrides
) -> dict:
    """A preset with fields replaced; the layer and expert counts where the family keeps them."""
    config = with_size(PRESETS[name], layers=num_hidden_layers, experts=experts)
    return {**config, **{k: v for k, v in overrides.items() if v is not None}}


def add_checkpoint_arguments(ap: argparse.ArgumentParser) -> None:
    """What changes a generated checkpoint besides its preset: its depth, vocabulary, routing
    (bench/synthetic_values.py says what --skew, --topic-share and --stickiness do), seed and
    float dtype."""
    ap.add_argument("--layers", type=int, help="override the preset's layer count")
    ap.add_argument("--experts", type=int, help="override the preset's routed expert count")
    ap.add_argument("--vocab", type=int, help="override the preset's vocabulary size")
    ap.add_argument("--skew", type=float, default=ROUTING["skew"], help="expert popularity skew")
    ap.add_argument(
        "--topic-share", type=float, default=ROUTING["topic_share"], help="routing reuse (0..1)"
    )
    ap.add_argument(
        "--stickiness", type=float, default=ROUTING["stickiness"], help="topic persistence"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--dtype",
        choices=["bfloat16", "float32"],
        help="the checkpoint's float dtype (scales, norms; default: the preset's bfloat16). On "
        "CPU both engines compute in float32, so float32 checkpoints are what a Mac computing in "
        "bfloat16 sees: no conversion, experts used in place",
    )


def routing_of(args: argparse.Namespace) -> dict:
    return {"skew": args.skew, "topic_share": args.topic_share, "stickiness": args.stickiness}
