"""The published shapes at sizes this machine holds: plan, load, first-token and per-token time,
the engine's own memory, mappings and descriptors, per shape, read path and budget; and how each
grows with layers and experts (a line fitted per family).

    python bench/sizes.py [--out bench/results/sizes.json] [--families deepseek-v3 kimi-k2]
    python bench/sizes.py --table bench/results/sizes.json   # the README's tables from a run

Checkpoints are --sparse (bench/generate_checkpoint.py): real headers and sizes, the data a hole,
so no disk is used and the values are zeros; compute is real, and every read of a hole is a
page of zeros from the page cache. Each point is one fresh process (bench/size_probe.py). The
full-depth shapes whose resident weights exceed what this shared machine may use are run at
fewer layers (and, for the per-expert line, fewer experts); the fitted lines say what the full
shape costs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
from generate_checkpoint import checkpoint_spec, read_spec
from presets import PUBLISHED_SHAPES, preset_config

from fixtures.published_shapes import text_config

HERE = Path(__file__).resolve().parent
DATA = Path("/tmp/sizebench")
G = 1 << 30
# (family, layers, experts or None for the published count): depths whose resident weights and
# first-token reads stay within a few GB here; the full depth where it does.
SHAPES = [
    ("qwen3-30b-a3b", 8, None),
    *(("qwen3-235b-a22b", n, None) for n in (4, 8)),
    *(("qwen3.5-397b-a17b", n, None) for n in (4, 8)),
    *(("deepseek-v3", n, None) for n in (4, 6)),
    ("deepseek-v3", 6, 64),
    *(("kimi-k2", n, None) for n in (2, 4)),
    *(("glm-4.5", n, None) for n in (4, 6)),
    *(("gpt-oss-120b", n, None) for n in (4, 12)),
    ("qwen3-30b-a3b", 48, None),  # the download, at every budget: last (the longest)
]
# Budgets past the smallest on one shape per path: the largest stays under what this machine
# lends a run (RSS_LIMIT, resident weights included).
BUDGETS = {
    ("qwen3-30b-a3b", 48, "slots"): [1 * G, 4 * G, 8 * G, 12 * G, 16 * G],
    ("qwen3-30b-a3b", 48, "mapped"): [4 * G],
    ("deepseek-v3", 6, "slots"): [2 * G],
}
RSS_LIMIT = 5.5 * G
MACHINE = "Linux x86-64 VM, 2 CPU cores shared with other work, 24 GiB, no GPU, mlx[cpu]"
# The slot path's budget 0 was one layer's experts (6.3 GB for DeepSeek-V3, 9.5 GB for Kimi K2,
# 3.6 GB for Qwen3.5-397B, past what a run may use here; on CUDA it still is), so their smallest
# slot budget here is 1 GB.
SLOT_FLOOR = {"deepseek-v3": G, "kimi-k2": G, "qwen3.5-397b-a17b": G}


def checkpoint(family: str, layers: int, experts: int | None) -> Path:
    """The sparse checkpoint of `family` at this size, written once (its spec says which)."""
    from generate_checkpoint import write_checkpoint

    config = preset_config(family, num_hidden_layers=layers, experts=experts)
    folder = DATA / f"{family}-{layers}l-{experts or 'all'}e"
    if read_spec(folder) != json.loads(json.dumps(checkpoint_spec(config))):
        write_checkpoint(folder, config, sparse=True, log=lambda m: None)
    return folder


def run_point(folder: Path, read_path: str, budget: int, tokens: int) -> dict:
    """One probe in its own process, stopped if its memory passes RSS_LIMIT (a shared machine)."""
    command = [sys.executable, str(HERE / "size_probe.py"), str(folder)]
    command += ["--read-path", read_path, "--budget", str(budget), "--tokens", str(tokens)]
    point = {"read_path": read_path, "budget": budget}
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as p:
        watched = psutil.Process(p.pid)
        while p.poll() is None:
            try:
                rss = watched.memory_info().rss
            except psutil.NoSuchProcess:
                break
            if rss > RSS_LIMIT:
                p.kill()
                p.wait()
                return point | {"error": f"stopped: RSS passed {RSS_LIMIT / G:.1f} GiB here"}
            time.sleep(0.2)
        out, err = p.communicate()
    if p.returncode != 0:  # a crash (a signal, a traceback): its last line is the result
        tail = (err.strip().splitlines() or ["(no output)"])[-1]
        return point | {"error": f"exit {p.returncode}: {tail}"}
    return json.loads(out.strip().splitlines()[-1])


def measure(families: list[str], tokens: int, log, save, done: set) -> list[dict]:
    """Every point of `families` not in `done` (points measured already, kept)."""
    rows = []
    for family, layers, experts in SHAPES:
        if family not in families:
            continue
        folder = checkpoint(family, layers, experts)
        for read_path in ("mapped", "slots"):
            floor = SLOT_FLOOR.get(family, 0) if read_path == "slots" else 0
            for budget in [floor, *BUDGETS.get((family, layers, read_path), [])]:
                if (family, layers, experts, read_path, budget) in done:
                    continue
                row = {
                    "family": family,
                    "layers": layers,
                    "shape_experts": experts,
                    **run_point(folder, read_path, budget, tokens),
                }
                log(json.dumps({k: row.get(k) for k in TABLE_KEYS}))
                rows.append(row)
                save(rows, [])
    return rows


def fits(rows: list[dict]) -> dict:
    """Per family and read path, least-squares lines at the smallest budget: load CPU seconds,
    engine bytes, mappings and descriptors against the routed experts over all MoE layers."""
    out = {}
    for family in dict.fromkeys(r["family"] for r in rows):
        for read_path in ("mapped", "slots"):
            ok = [
                r
                for r in rows
                if r["family"] == family
                and r["read_path"] == read_path
                and r["budget"] == (SLOT_FLOOR.get(family, 0) if read_path == "slots" else 0)
                and "error" not in r
            ]
            if len({r["moe_layers"] * r["experts"] for r in ok}) < 2:
                continue
            fit = {}
            total = np.array([r["moe_layers"] * r["experts"] for r in ok], dtype=float)
            for key in ("load_cpu_s", "engine_bytes", "maps_on_checkpoint_loaded", "fds_loaded"):
                slope, base = np.polyfit(total, [r[key] for r in ok], 1)
                fit[key] = {"per_expert": slope, "base": base}
            out[f"{family}/{read_path}"] = fit
    return out


def full_shape(family: str) -> dict:
    """The published shape's plan (from its sparse checkpoint's headers, as a download is
    planned): its counts and sizes, and the plan's seconds, cold (imports included) and warm."""
    from generate_checkpoint import write_checkpoint

    folder = DATA / family
    if read_spec(folder) != json.loads(json.dumps(checkpoint_spec(preset_config(family)))):
        write_checkpoint(folder, preset_config(family), sparse=True, log=lambda m: None)
    start = time.perf_counter()
    command = [sys.executable, str(HERE / "size_probe.py"), str(folder), "--plan-only"]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    took = time.perf_counter() - start
    return {"family": family, "plan_process_s": took, **json.loads(done.stdout)}


TABLE_KEYS = [
    "family", "layers", "read_path", "budget", "load_s", "load_cpu_s", "first_token_cpu_s",
    "per_token_s", "per_token_cpu_s", "engine_bytes", "pool_bytes", "maps_on_checkpoint_loaded",
    "fds_on_checkpoint_loaded", "error",
]  # fmt: skip


def table(result: dict) -> str:
    """Markdown: every point measured, then each published shape as planned and as the fitted
    lines predict its memory, mappings and descriptors (CPU seconds: the machine is shared, wall
    times are not comparable; load times are too noisy here for a line to say much)."""
    mb = 1e6
    lines = [
        "| shape | path | budget | experts GB | load s | first token s | per token s "
        "| engine MB | pool GB | maps | fds |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        head = f"| {r['family']} {r['layers']}L | {r['read_path']} | {r['budget'] / G:g}G"
        if "error" in r:
            lines.append(f"{head} | | {r['error'][:90]} | | | | | | |")
            continue
        experts = "" if r["experts"] == preset_experts(r["family"]) else f" ({r['experts']}e)"
        lines.append(
            f"{head} | {r['expert_bytes'] / 1e9:.1f}{experts} | {r['load_cpu_s']:.1f} "
            f"| {r['first_token_cpu_s']:.1f} | {r['per_token_cpu_s']:.2f} "
            f"| {r['engine_bytes'] / mb:.0f} | {r['pool_bytes'] / 1e9:.2f} "
            f"| {r['maps_on_checkpoint_loaded']} | {r['fds_on_checkpoint_loaded']} |"
        )
    lines += [
        "",
        "| published shape | download GB | read per token GB | resident GB "
        "| plan s (cold / warm) | path | engine MB | maps | fds |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for full in result["full"]:
        total = full["moe_layers"] * full["experts"]
        for read_path in ("mapped", "slots"):
            fit = result["fits"].get(f"{full['family']}/{read_path}")
            if fit is None:
                continue
            at = {k: v["base"] + v["per_expert"] * total for k, v in fit.items()}
            lines.append(
                f"| {full['family']} | {full['download_bytes'] / 1e9:.0f} "
                f"| {full['expert_bytes_per_token'] / 1e9:.2f} "
                f"| {full['resident_bytes'] / 1e9:.1f} "
                f"| {full['plan_cold_s']:.1f} / {full['plan_s']:.1f} | {read_path} "
                f"| {at['engine_bytes'] / mb:.0f} "
                f"| {at['maps_on_checkpoint_loaded']:.0f} | {at['fds_loaded']:.0f} |"
            )
    return "\n".join(lines)


def versus(before: dict, after: dict) -> str:
    """Markdown: load CPU seconds and first-token CPU seconds of the points both results have."""
    earlier = {point(r): r for r in before["rows"] if "error" not in r}
    lines = [
        "",
        "| shape | path | budget | experts GB | load s before / after "
        "| first token s before / after |",
        "|---|---|---|---|---|---|",
    ]
    for r in after["rows"]:
        old = earlier.get(point(r))
        if old is None or "error" in r:
            continue
        lines.append(
            f"| {r['family']} {r['layers']}L | {r['read_path']} | {r['budget'] / G:g}G "
            f"| {r['expert_bytes'] / 1e9:.1f} | {old['load_cpu_s']:.1f} / {r['load_cpu_s']:.1f} "
            f"| {old['first_token_cpu_s']:.1f} / {r['first_token_cpu_s']:.1f} |"
        )
    return "\n".join(lines)


def point(row: dict) -> tuple:
    return row["family"], row["layers"], row.get("shape_experts"), row["read_path"], row["budget"]


def preset_experts(family: str) -> int:
    text = text_config(preset_config(family))
    return next(
        text[k] for k in ("n_routed_experts", "num_local_experts", "num_experts") if k in text
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=HERE / "results" / "sizes.json")
    ap.add_argument("--families", nargs="+", default=list(PUBLISHED_SHAPES))
    ap.add_argument("--tokens", type=int, default=3, help="the prompt's pass, then decoded tokens")
    ap.add_argument("--table", type=Path, help="print the README's tables from this result")
    ap.add_argument("--before", type=Path, help="with --table: load times against this result")
    ap.add_argument("--again", action="store_true", help="measure points --out has already")
    args = ap.parse_args(argv)
    if args.table:
        result = json.loads(args.table.read_text())
        print(table(result))
        if args.before:
            print(versus(json.loads(args.before.read_text()), result))
        return
    kept = json.loads(args.out.read_text())["rows"] if args.out.exists() else []

    def save(rows: list[dict], full: list[dict]) -> None:  # after every point: a long run
        new = {point(r) for r in rows}  # a point measured again replaces its earlier result
        everything = [r for r in kept if point(r) not in new] + rows
        result = {"machine": MACHINE, "rows": everything, "fits": fits(everything), "full": full}
        args.out.write_text(json.dumps(result, indent=1))

    rows = measure(
        args.families,
        args.tokens,
        lambda m: print(m, file=sys.stderr, flush=True),
        save,
        set() if args.again else {point(r) for r in kept},
    )
    families = list(dict.fromkeys(r["family"] for r in kept + rows))
    save(rows, [full_shape(family) for family in families])


if __name__ == "__main__":
    main()
