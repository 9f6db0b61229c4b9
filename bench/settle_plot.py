#!/usr/bin/env python3
"""Bytes over the bus per decode token for each way a gathered pool's settle can fill its slots:
misses (read by the gather kernel) and settle copies (the fill kernel), per routing profile and
share of the experts, from bench/settle_copies.py's JSON.

    python bench/settle_plot.py [OUT.png]     # default bench/results/settle-copies.png

Reads results/settle-copies-by-calls.json (every miss given a slot, the settle before),
settle-copies-refresh.json (SlotLFU.refresh, the default) and settle-copies-refresh-margin1.json
(the refresh needing one more routing than the expert it displaces). Needs matplotlib
(`pip install -e ".[bench]"`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
WAYS = {  # file -> label, colour
    "settle-copies-by-calls.json": ("every miss a slot (before)", "tab:gray"),
    "settle-copies-refresh.json": ("refresh, margin 0 (default)", "tab:blue"),
    "settle-copies-refresh-margin1.json": ("refresh, margin 1", "tab:cyan"),
}


def rows(name: str) -> dict[tuple[str, float], dict]:
    """(profile, share) -> settle_copies.py's row, from results/`name`."""
    return {(r["profile"], r["share"]): r for r in json.loads((RESULTS / name).read_text())["rows"]}


def main(argv: list[str] | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0]) if argv else RESULTS / "settle-copies.png"
    ways = {name: rows(name) for name in WAYS}
    groups = list(next(iter(ways.values())))
    fig, ax = plt.subplots(figsize=(11, 4.5))
    width = 0.8 / len(ways)
    for n, (name, by_group) in enumerate(ways.items()):
        label, colour = WAYS[name]
        x = [g + (n - (len(ways) - 1) / 2) * width for g in range(len(groups))]
        rs = [by_group[g] for g in groups]
        per = [r["bus_mb"] / (r["misses"] + r["copies"]) for r in rs]  # MB an expert
        misses = [r["misses"] * mb for r, mb in zip(rs, per)]
        copies = [r["copies"] * mb for r, mb in zip(rs, per)]
        ax.bar(x, misses, width, color=colour, label=f"{label}: misses")
        ax.bar(
            x,
            copies,
            width,
            bottom=misses,
            color=colour,
            hatch="//",
            edgecolor="white",
            label=f"{label}: settle copies",
        )
    ax.set_xticks(range(len(groups)), [f"{p}\n{s:.1%}" for p, s in groups])
    ax.set_ylabel("MB over the bus per decode token")
    ax.set_ylim(0, 1.3 * max(r["bus_mb"] for by_group in ways.values() for r in by_group.values()))
    ax.set_title(
        "A gathered pool's bus bytes, 48-layer Qwen3-30B-A3B shape, routing model's traces"
    )
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
