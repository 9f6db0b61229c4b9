#!/usr/bin/env python3
"""A token's time in each of bench/cuda_overlap.py's modes, one group of bars a run.

    python bench/overlap_plot.py OUT.png OVERLAP.json...

Each run's bars: its matmuls alone (`compute`), its gathers alone, today's decode (`now`: a
layer's experts wait for its own gather) and the gather issued a layer early on MLX's stream
(`early`) or on a stream of its own (`early-side`). Were the early gathers moving while the
compute ran, `early` would fall from `now` towards the longer of `compute` and `gathers`; each
group is labelled with `hidden`, the share of the gathers' time it took off. Needs matplotlib
(`pip install -e ".[bench]"`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

MODES = ("compute", "gathers", "now", "early", "early-side")


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="the PNG to write")
    ap.add_argument("runs", type=Path, nargs="+", help="bench/cuda_overlap.py's JSON outputs")
    args = ap.parse_args(argv)
    runs = [json.loads(run.read_text(encoding="utf-8")) for run in args.runs]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 0.9 + 0.75 * len(runs)))
    height = 0.8 / len(MODES)
    for i, run in enumerate(runs):
        for j, mode in enumerate(MODES):
            label = mode if i == 0 else None
            ax.barh(i + j * height, run[f"{mode}_ms"], height, color=f"C{j}", label=label)
        ax.text(
            max(run["now_ms"], run["early_ms"]) * 1.02, i + 3 * height,
            f"hidden {run['hidden_early']:+.2f} / {run['hidden_early-side']:+.2f}",
            va="center", fontsize=7,
        )  # fmt: skip
    ax.set_yticks([i + 2 * height for i in range(len(runs))], [p.stem for p in args.runs])
    ax.invert_yaxis()
    ax.set_xlabel("ms a token (48 layers)")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    return runs


if __name__ == "__main__":
    main()
