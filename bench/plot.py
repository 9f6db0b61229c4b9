"""Decode tok/s against memory available, streamer vs mlx-lm resident, from bench/results/*.json.

    python bench/plot.py [RESULTS_DIR]      # writes RESULTS_DIR/<model>-memory.png per model

Needs matplotlib (`pip install -e ".[bench]"`). Points: the warm run (all free memory) and each
squeezed run (a balloon left only that much); error bars span min..max over runs; mlx-lm points
that do not fit in memory are drawn as crosses at zero.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

GB = 1e9


def points(results: dict[str, dict]) -> dict[str, list[tuple[float, dict | None]]]:
    """Engine -> [(memory available in bytes, summary or None when it does not fit)]."""
    out: dict[str, list] = {"streamer": [], "mlx_lm": []}
    warm = results.get("warm")
    if warm:
        for engine in out:
            summary = warm.get(engine)
            if summary and summary.get("fits", True):
                out[engine].append((summary["mem_available_before"], summary))
            elif summary:  # did not fit: mark it where streamer ran
                out[engine].append((warm["streamer"]["mem_available_before"], None))
    for point in (results.get("squeezed") or {}).get("points", []):
        if not point.get("balloon_survived", True):
            continue
        for engine in out:
            summary = point.get(engine)
            if summary:  # None: not run (--no-baseline); {"fits": false}: did not fit
                out[engine].append((point["mem_available"], summary if summary.get("fits", True) else None))
    return out


def plot(name: str, results: dict[str, dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=100)
    top = 0.0
    styles = {"streamer": ("tab:blue", "o", "streamer (experts streamed)"), "mlx_lm": ("tab:orange", "s", "mlx-lm (fully resident)")}
    for engine, rows in points(results).items():
        color, marker, label = styles[engine]
        ran = sorted((x, s) for x, s in rows if s is not None)
        if ran:
            xs = [x / GB for x, _ in ran]
            ys = [s["decode_tok_s"]["median"] for _, s in ran]
            lo = [y - s["decode_tok_s"]["min"] for y, (_, s) in zip(ys, ran)]
            hi = [s["decode_tok_s"]["max"] - y for y, (_, s) in zip(ys, ran)]
            ax.errorbar(xs, ys, yerr=[lo, hi], color=color, marker=marker, capsize=3, label=label)
            top = max(top, *[s["decode_tok_s"]["max"] for _, s in ran])
            bound = [(x / GB, s["io_bound_tok_s"]) for x, s in ran if s.get("io_bound_tok_s")]
            if bound:
                ax.plot(*zip(*bound), color=color, linestyle=":", marker=".",
                        label="streamer I/O bound: misses / disk (off the top: rare misses)")
        missing = [x / GB for x, s in rows if s is None]
        if missing:
            ax.plot(missing, [0] * len(missing), color=color, marker="x", linestyle="none", markersize=9,
                    label=f"{label.split(' ')[0]}: does not fit")
    model = next(iter(results.values()))["model"]
    ax.axvline((model["expert_bytes"] + model["resident_bytes"]) / GB, color="grey", linestyle="--", linewidth=0.8,
               label="size of the 4-bit model")
    ax.set_xlabel("memory available to the run (GB, MemAvailable)")
    ax.set_ylabel("decode tokens/s (median, min..max)")
    ax.set_title(f"{name}: {model['layers']} layers x {model['num_experts']} experts, top-{model['top_k']}; "
                 "random weights, CPU float32", fontsize=9)
    ax.set_ylim(0, 1.5 * top if top else None)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    folder = Path(argv[0]) if argv else Path(__file__).resolve().parent / "results"
    by_model: dict[str, dict[str, dict]] = {}
    for path in sorted(folder.glob("*.json")):
        result = json.loads(path.read_text())
        by_model.setdefault(result["model"]["name"], {})[result["scenario"]] = result
    for name, results in by_model.items():
        if "warm" in results or "squeezed" in results:
            out = folder / f"{name}-memory.png"
            plot(name, {k: v for k, v in results.items() if k in ("warm", "squeezed")}, out)
            print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
