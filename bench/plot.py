"""Decode tok/s against memory available, streamer vs mlx-lm resident, from bench/results/*.json.

    python bench/plot.py [RESULTS_DIR]      # writes RESULTS_DIR/<model>-memory.png per model
                                            # and <model>-layouts.png per layouts result

Needs matplotlib (`pip install -e ".[bench]"`). Points: the warm runs (all free memory) and each
squeezed run (a balloon left only that much), one series per engine and memory budget (the
result's --tag); error bars span min..max over runs; runs that do not fit are crosses at zero.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

GB = 1e9


SERIES = {  # (engine, result tag) -> label, colour, marker
    ("streamer", None): ("streamer: experts streamed, page cache only", "tab:blue", "o"),
    ("streamer", "budget1G"): ("streamer: + 1 GB hot-expert cache", "tab:green", "^"),
    ("streamer", "resident"): ("streamer: budget >= model, all resident", "tab:purple", "D"),
    ("mlx_lm", None): ("mlx-lm: fully resident", "tab:orange", "s"),
}


def points(results: list[dict]) -> dict[tuple[str, str | None], list[tuple[float, dict | None]]]:
    """(engine, tag) -> [(memory available in bytes, summary or None when it does not fit)]."""
    out: dict[tuple[str, str | None], list] = {key: [] for key in SERIES}
    for result in results:
        tag = result["settings"].get("tag")
        tag = None if tag == "rerun" else tag
        for engine in ("streamer", "mlx_lm"):
            if (engine, tag) not in out:
                continue
            if result["scenario"] == "warm":
                summary = result.get(engine)
                if summary and summary.get("fits", True):
                    out[engine, tag].append((summary["mem_available_before"], summary))
                elif summary:  # did not fit: mark it where streamer ran
                    out[engine, tag].append((result["streamer"]["mem_available_before"], None))
            for point in result.get("points", []):
                summary = point.get(engine)
                if (
                    point.get("balloon_survived", True) and summary
                ):  # None: not run; {"fits": false}: did not fit
                    out[engine, tag].append(
                        (point["mem_available"], summary if summary.get("fits", True) else None)
                    )
    return out


def plot(name: str, results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=100)
    top = 0.0
    for key, rows in points(results).items():
        label, color, marker = SERIES[key]
        ran = sorted((x, s) for x, s in rows if s is not None)
        if ran:
            xs = [x / GB for x, _ in ran]
            ys = [s["decode_tok_s"]["median"] for _, s in ran]
            lo = [y - s["decode_tok_s"]["min"] for y, (_, s) in zip(ys, ran)]
            hi = [s["decode_tok_s"]["max"] - y for y, (_, s) in zip(ys, ran)]
            ax.errorbar(
                xs,
                ys,
                yerr=[lo, hi],
                color=color,
                marker=marker,
                capsize=3,
                label=label,
                linestyle="-" if len(ran) > 1 else "none",
            )
            top = max(top, *[s["decode_tok_s"]["max"] for _, s in ran])
        missing = [x / GB for x, s in rows if s is None]
        if missing:
            ax.plot(
                missing,
                [0] * len(missing),
                color=color,
                marker="x",
                linestyle="none",
                markersize=9,
                label=f"{label.split(':')[0]}: does not fit",
            )
    model = results[0]["model"]
    ax.axvline(
        (model["expert_bytes"] + model["resident_bytes"]) / GB,
        color="grey",
        linestyle="--",
        linewidth=0.8,
        label="size of the 4-bit model",
    )
    ax.set_xlabel("memory available to the run (GB, MemAvailable)")
    ax.set_ylabel("decode tokens/s (median, min..max)")
    ax.set_title(
        f"{name}: {model['layers']} layers x {model['num_experts']} experts, top-{model['top_k']}; "
        "random weights, CPU float32",
        fontsize=9,
    )
    ax.set_ylim(0, 1.5 * top if top else None)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


LAYOUTS = {"repacked": ("repacked", "tab:blue"), "in_place": ("in place (the download)", "tab:red")}


def plot_layouts(result: dict, path: Path) -> None:
    """Repacked vs in place: decode tok/s per scenario, and pages read per payload byte."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = [("warm", result["warm"]), ("cold", result["cold"])] + [
        (f"squeezed\n{p['mem_available'] / GB:.1f} GB", p) for p in result["squeezed"]
    ]
    fig, (ax, amp) = plt.subplots(1, 2, figsize=(10, 4.2), dpi=100, width_ratios=[3, 1.4])
    width = 0.38
    for i, (name, (label, color)) in enumerate(LAYOUTS.items()):
        xs, ys, lo, hi = [], [], [], []
        for x, (_, runs) in enumerate(scenarios):
            rate = runs[name]["decode_tok_s"]
            xs.append(x + (i - 0.5) * width)
            ys.append(rate["median"])
            lo.append(rate["median"] - rate["min"])
            hi.append(rate["max"] - rate["median"])
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, color=color, label=label)
    ax.set_xticks(range(len(scenarios)), [s for s, _ in scenarios], fontsize=8)
    ax.set_ylabel("decode tokens/s (median, min..max)")
    disk = result["disk_bytes"]
    ax.set_title(
        f"{result['model']['name']}: disk {disk['download'] / GB:.1f} GB in place, "
        f"{disk['repacked_keeping_download'] / GB:.1f} GB repacked beside the download",
        fontsize=9,
    )
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    pages = [k for k in result["amplification"] if k.endswith("KiB")]
    for i, (name, (_, color)) in enumerate(LAYOUTS.items()):
        values = [result["amplification"][k][name] for k in pages]
        amp.bar([x + (i - 0.5) * width for x in range(len(pages))], values, width, color=color)
    amp.set_xticks(range(len(pages)), [f"{k} pages" for k in pages], fontsize=8)
    amp.set_ylim(0.98, None)  # a repacked record reads exactly its bytes: 1.0
    amp.set_ylabel("bytes of pages read / routed expert bytes")
    amp.set_title("read amplification", fontsize=9)
    amp.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    folder = Path(argv[0]) if argv else Path(__file__).resolve().parent / "results"
    by_model: dict[str, list[dict]] = {}
    for path in sorted(folder.glob("*.json")):
        result = json.loads(path.read_text())
        if result.get("routing_model"):  # run.py --routing: not the synthetic routing's series
            continue
        if result["scenario"] in ("warm", "squeezed"):
            by_model.setdefault(result["model"]["name"], []).append(result)
        elif result["scenario"] == "layouts":
            out = folder / f"{result['model']['name']}-layouts.png"
            plot_layouts(result, out)
            print(f"wrote {out}", file=sys.stderr)
    for name, results in by_model.items():
        out = folder / f"{name}-memory.png"
        plot(name, results, out)
        print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
