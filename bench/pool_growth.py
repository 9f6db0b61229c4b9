#!/usr/bin/env python3
"""Is a bigger slot pool ever slower? Decode tok/s of the slot path at shares of the expert bytes,
per routing profile, page cache warm, in one run.

    python bench/pool_growth.py --data DIR --profiles uniform,medium --fractions 0.125,0.25,0.5,1

Each (round, profile, fraction) is one process (streamer's slot path, the routing model in place
of the routers: profile_routing.py, as `worker.py --routing`), one warm-up, one timed generation
timed by the wall clock and by the process's CPU time (work, which the other users of a shared
machine do not inflate as much); fractions alternate within a round so the machine's drift hits
them alike. 1.0 is every expert resident. `--committed` adds each fraction again with the
pool's memory written once at load (every page committed before decode), which is otherwise
committed slot by slot as the first expert lands in it; `--serial` adds it with every call's
entries computed after its reads (experts/slots.py OVERLAPPED_ROUTES = 0), where decode calls
otherwise compute their hits beside the misses' reads. Printed and written
(bench/results/<model>-pool-growth.json, a plot beside it with matplotlib): tok/s, CPU seconds
per token, the pool's hit rate and misses, the engine's time per token in reads.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import pagecache  # noqa: E402
from engines import child_result, log  # noqa: E402
from squeezed_io import default_model  # noqa: E402

from streamer.io.manifest import read_manifest  # noqa: E402

# (committed, serial) -> the line's style and the points' marker
LOOKS = {(False, False): ("-", "o"), (True, False): ("--", "s"), (False, True): (":", "^")}


def one(args) -> dict:
    """One point in this process: load, the routing model in place, a warm-up, one timed run."""
    import time

    from profile_routing import install
    from worker import prompt_ids, tokens

    import streamer
    from streamer.cache import slot_pool
    from streamer.experts import slots

    if args.serialize:  # every call's entries computed after its reads, as before 5d03218
        slots.OVERLAPPED_ROUTES = 0
    if args.commit:  # every pool page written at allocation
        allocate = slot_pool.allocate

        def committing(slots, tensor):
            array, rows = allocate(slots, tensor)
            rows.fill(0)
            return array, rows

        slot_pool.allocate = committing
    experts = read_manifest(args.model).expert_file_bytes
    budget = int(args.fraction * experts) if args.fraction < 1 else 2 * experts
    model, _ = streamer.load(args.model, memory_budget=budget, read_path="slots")
    positions, stats = install(model, args.profile), model.streamer.stats
    positions.start(10_000, 8 + 4 + 2)
    for _ in tokens(model, prompt_ids(8, seed=99), 4, 1.0):
        pass
    positions.start(0, args.prompt_tokens + args.tokens + 2)
    marks = []
    for _ in tokens(model, prompt_ids(args.prompt_tokens), args.tokens, 1.0):
        marks.append((time.perf_counter(), time.process_time()))
        if len(marks) == 1:
            stats.reset()
    decode, steps = stats.decode, len(marks) - 1
    asked = decode.cache_hits + decode.experts_read
    return {
        "profile": args.profile,
        "fraction": args.fraction,
        "committed": args.commit,
        "serial": args.serialize,
        "decode_tok_s": steps / (marks[-1][0] - marks[0][0]),
        "cpu_s_per_token": (marks[-1][1] - marks[0][1]) / steps,
        "hit_rate": decode.cache_hits / asked if asked else 1.0,
        "misses_per_token": decode.experts_read / steps,
        "read_ms_per_token": 1e3 * decode.read_seconds / steps,
    }


def point(args, profile: str, fraction: float, variant: str = "") -> dict:
    """One point in a child process; `variant`: "committed" or "serial" (see main's flags)."""
    argv = [sys.executable, __file__, "--model", str(args.model), "--point", profile]
    argv += ["--fraction", str(fraction), "--prompt-tokens", str(args.prompt_tokens)]
    argv += ["--tokens", str(args.tokens)]
    argv += {"committed": ["--commit"], "serial": ["--serialize"]}.get(variant, [])
    row = child_result(argv, f"[growth] the {profile} {fraction} point")
    log(
        f"[growth] {profile} {fraction:.1%}{f' {variant}' if variant else ''}: "
        f"{row['decode_tok_s']:.3f} tok/s, {row['cpu_s_per_token']:.2f} CPU s/token, "
        f"{row['hit_rate']:.1%} hits, reads {row['read_ms_per_token']:.0f} ms/token"
    )
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=Path.home() / ".cache" / "streamer-bench")
    ap.add_argument("--model", type=Path, help="a repacked folder (default: the 12-layer one)")
    ap.add_argument("--profiles", default="uniform,medium")
    ap.add_argument("--fractions", default="0.125,0.25,0.5,1")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=32, help="decode tokens per run")
    ap.add_argument("--committed", action="store_true", help="also with the pools committed")
    ap.add_argument(
        "--serial", action="store_true", help="also with every call computed after its reads"
    )
    ap.add_argument("--point", help=argparse.SUPPRESS)  # a child: this profile
    ap.add_argument("--fraction", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--commit", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--serialize", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.model = args.model or default_model(args.data)
    if args.point:
        args.profile = args.point
        print(json.dumps(one(args)))
        return
    pagecache.warm(sorted((args.model / "experts").iterdir()))
    fractions = [float(f) for f in args.fractions.split(",")]
    rows = []
    for n in range(args.rounds):
        order = fractions if n % 2 == 0 else fractions[::-1]
        for profile in args.profiles.split(","):
            for f in order:
                rows.append(point(args, profile, f))
                for variant in ("committed", "serial"):
                    if getattr(args, variant) and f < 1:
                        rows.append(point(args, profile, f, variant))
    name = f"{args.model.name.rsplit('-', 2)[0]}-pool-growth"
    out = BENCH / "results" / f"{name}.json"
    out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}))
    log(f"[growth] wrote {out}")
    try:
        plot(rows, out.with_suffix(".png"))
    except ImportError:
        log("[growth] no matplotlib: no plot")


def plot(rows: list[dict], path: Path) -> None:
    """CPU seconds per token (the work) and wall-clock tok/s against the pool, per profile."""
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for key, ax, label in (
        ("cpu_s_per_token", axes[0], "CPU seconds per decode token (work)"),
        ("decode_tok_s", axes[1], "decode tok/s (wall clock: the VM's load)"),
    ):
        for series in dict.fromkeys(_series(r) for r in rows):
            mine = sorted(
                (r["fraction"], r[key])
                for r in rows
                if _series(r) == series or (r["profile"] == series[0] and r["fraction"] == 1)
            )
            name = series[0] + (", pool committed at load" if series[1] else "")
            name += ", calls computed after their reads" if series[2] else ""
            fractions = sorted({f for f, _ in mine})
            means = [np.mean([v for f2, v in mine if f2 == f]) for f in fractions]
            style, marker = LOOKS[series[1:]]  # every round's point, the line through their mean
            (line,) = ax.plot(fractions, means, style, label=name + ", mean")
            ax.plot([f for f, _ in mine], [v for _, v in mine], marker, color=line.get_color())
        ax.set_xscale("log", base=2)
        ax.set_xlabel("slot pool, share of the expert bytes (1 = every expert resident)")
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    fig.suptitle("slot path decode against pool size (12 layers, this 2-core CPU, page cache warm)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    log(f"[growth] wrote {path}")


def _series(row: dict) -> tuple:
    return row["profile"], row["committed"], row.get("serial", False)  # older runs: no "serial"


if __name__ == "__main__":
    main()
