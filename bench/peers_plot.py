"""bench/squeezed_io.py's runs with the peers, as bars: decode tok/s and disk MB a token per
engine, one group per squeeze (each run file is one squeeze; its rounds are the dots).

    python bench/peers_plot.py OUT.png RESULT.json...
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ORDER = ("slots", "mapped", "boyle", "nunspark")


def runs(paths: list[str]) -> list[tuple[str, dict[str, list[dict]]]]:
    """Per file: its squeeze's label and each point's rows (failed points left out)."""
    found = []
    for path in paths:
        result = json.loads(Path(path).read_text())
        rows: dict[str, list[dict]] = {}
        for row in result["rows"]:
            if "failed" not in row:
                rows.setdefault(row["point"], []).append(row)
        args = result["args"]
        label = f"{int(args['limit']) / (1 << 30):.1f} GiB"
        if args.get("read_mbps") not in (None, "None"):
            label += f", reads {float(args['read_mbps']):g} MB/s"
        found.append((label + f"\n{args.get('peer_budgets', '')}", rows))
    return found


def main() -> None:
    out, paths = sys.argv[1], sys.argv[2:]
    squeezes = runs(paths)
    fig, axes = plt.subplots(2, 1, figsize=(10, 7))
    for ax, key, scale, label in (
        (axes[0], "decode_tok_s", 1, "decode tok/s"),
        (axes[1], "disk_bytes_per_token", 1e-6, "MB read from disk a token"),
    ):
        width = 0.8 / len(ORDER)
        for i, point in enumerate(ORDER):
            for g, (_, rows) in enumerate(squeezes):
                values = [r[key] * scale for r in rows.get(point, [])]
                if not values:
                    continue
                x = g + (i - (len(ORDER) - 1) / 2) * width
                ax.bar(x, sum(values) / len(values), width, color=f"C{i}",
                       label=point if g == 0 else None)  # fmt: skip
                ax.plot([x] * len(values), values, "k.", markersize=4)
        ax.set_xticks(range(len(squeezes)), [s for s, _ in squeezes], fontsize=8)
        ax.set_ylabel(label)
    axes[0].legend(fontsize=8)
    fig.suptitle("Squeezed decode, medium routing, greedy (tokens identical): streamer and peers")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
