"""Time and memory against model size, from bench/sizes.py's results.

    python bench/plot_sizes.py bench/results/sizes.json   # writes bench/results/sizes.png

Needs matplotlib (`pip install -e ".[bench]"`). Left: load and per-token CPU seconds; right: the
engine's own memory (beside the pool and the resident weights) and the mappings and descriptors
it opens on the checkpoint, each against the routed experts' bytes of the shape run (budget 0,
or the slot path's smallest budget), one marker per family, filled for the slot path.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

GB = 1e9
MARKERS = "osD^vP*X"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    rows = [r for r in result["rows"] if "error" not in r and r["budget"] <= 1 << 30]
    families = list(dict.fromkeys(r["family"] for r in rows))
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8), dpi=80)
    panels = (
        (axes[0], ("load_cpu_s", "per_token_cpu_s"), "CPU seconds", ("load", "per token")),
        (axes[1], ("engine_bytes",), "engine's own memory (MB)", ("engine",)),
        (
            axes[2],
            ("maps_on_checkpoint_loaded", "fds_on_checkpoint_loaded"),
            "count",
            ("maps", "fds"),
        ),
    )
    for ax, keys, label, _names in panels:
        for family, marker in zip(families, MARKERS):
            for read_path, fill in (("mapped", "none"), ("slots", None)):
                mine = sorted(
                    (r for r in rows if r["family"] == family and r["read_path"] == read_path),
                    key=lambda r: r["expert_bytes"],
                )
                for key, colour in zip(keys, ("tab:blue", "tab:orange")):
                    xs = [r["expert_bytes"] / GB for r in mine]
                    ys = [r[key] / (1e6 if key == "engine_bytes" else 1) for r in mine]
                    ax.plot(xs, ys, marker=marker, color=colour, mfc=fill, ls=":", lw=0.8)
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("experts in the checkpoint run (GB, 4-bit)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    for ax, (_, _keys, _, names) in zip(axes, panels):
        for name, colour in zip(names, ("tab:blue", "tab:orange")):
            ax.plot([], [], color=colour, label=name)
    for family, marker in zip(families, MARKERS):
        axes[0].plot([], [], marker=marker, color="grey", ls="", label=family)
    axes[0].plot([], [], marker="o", color="grey", mfc="none", ls="", label="open: mapped")
    for ax in axes:
        ax.legend(fontsize=6, loc="upper left")
    fig.suptitle(f"Sparse checkpoints at published shapes ({result['machine']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path)


def main(argv: list[str] | None = None) -> None:
    source = Path((argv or sys.argv[1:] or ["bench/results/sizes.json"])[0])
    plot(json.loads(source.read_text()), source.with_suffix(".png"))


if __name__ == "__main__":
    main()
