"""The benchmark: streamer's streamed decode vs mlx-lm's fully resident model, per scenario.

    python bench/run.py warm      [--preset qwen3-30b-a3b-12l] [--data DIR]   # page cache warm
    python bench/run.py cold      ...   # expert files dropped from the page cache before every run
    python bench/run.py squeezed  --available 6G,4G ...   # a balloon leaves only that much memory
    python bench/run.py prefill   --lengths 128,512,2048 ...   # time to first token
    python bench/run.py --quick --json   # a small model, warm, one JSON object on stdout

    python bench/run.py warm --routing medium ...   # routing_model.py's profile in both engines

Checkpoints are generated (bench/generate_checkpoint.py) and repacked into DATA on first use and
reused after. Results go to RESULTS/<model>-<scenario>[-<routing>][-<tag>].json; bench/plot.py
draws them.
See bench/README.md for what each number means.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import mlx.core as mx
from balloon import GiB
from engines import BENCH, log
from models import ensure_models
from presets import PRESETS, add_checkpoint_arguments, routing_of
from routing_model import PROFILES
from scenarios import SCENARIOS, measure_disk
from summary import flat, headline

from streamer.cli.options import size  # sizes as streamer's own options read them


def cores(text: str) -> int:
    """--threads: a count of cores, 1 or more (0 had run streamer on every core, recorded as 0)."""
    count = int(text)
    if count < 1:
        raise argparse.ArgumentTypeError(f"{count} cores: give 1 or more")
    return count


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description="streamer benchmark", formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    ap.add_argument("scenario", nargs="?", choices=sorted(SCENARIOS), default="warm")
    ap.add_argument("--quick", action="store_true", help="small model, few tokens (about 20 s)")
    ap.add_argument(
        "--json", action="store_true", help="print the result as one JSON object on stdout"
    )
    ap.add_argument("--preset", choices=sorted(PRESETS), default="qwen3-30b-a3b-12l")
    add_checkpoint_arguments(ap)
    ap.add_argument(
        "--data",
        type=Path,
        default=Path(os.environ.get("STREAMER_BENCH_DATA", Path.home() / ".cache/streamer-bench")),
        help="where generated checkpoints live (multi-GB: not the repo)",
    )
    ap.add_argument("--results", type=Path, default=BENCH / "results")
    ap.add_argument("--tag", help="appended to the result file's name (e.g. resident)")
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per worker (cold: runs)")
    ap.add_argument(
        "--rounds", type=int, default=2, help="warm: alternating streamer/mlx-lm rounds"
    )
    ap.add_argument(
        "--temp",
        type=float,
        default=1.0,
        help="sampling temperature, seeded (0: greedy; loops on random weights)",
    )
    ap.add_argument(
        "--routing-tokens",
        type=int,
        default=64,
        help="warm: decode steps of the routing profile (0: skip)",
    )
    ap.add_argument(
        "--io-concurrency",
        type=int,
        default=1,
        help="pread threads of the disk measurement's pread figure",
    )
    ap.add_argument(
        "--disk-budget", type=size, default=256 << 20, help="bytes read to measure the disk"
    )
    ap.add_argument(
        "--available",
        type=lambda t: [size(x) for x in t.split(",")],
        default=[8 * GiB, 6 * GiB, 4 * GiB],
        help="squeezed: memory left available, comma-separated (e.g. 6G,4G)",
    )
    ap.add_argument(
        "--reserve", type=size, default=2 * GiB, help="memory that must always stay available"
    )
    ap.add_argument(
        "--lengths", type=lambda t: [int(x) for x in t.split(",")], default=[128, 512, 2048]
    )
    ap.add_argument(
        "--routing",
        choices=PROFILES,
        help="the routing model's profile in place of every router, in both engines' workers "
        "(default: the checkpoint's synthetic routing)",
    )
    ap.add_argument("--no-baseline", action="store_true", help="streamer only")
    ap.add_argument(
        "--threads",
        type=cores,
        help="streamer's CPU cores for its matmuls (default: all; 1: one, as mlx-lm computes)",
    )
    ap.add_argument(
        "--memory-budget",
        type=size,
        default=0,
        help="streamer's memory_budget: 0 streams every expert (page cache only); "
        "1T keeps all resident",
    )
    return ap


QUICK = {
    "preset": "quick",
    "decode_tokens": 16,
    "prompt_tokens": 16,
    "repeats": 3,
    "rounds": 1,
    "routing_tokens": 16,
    "disk_budget": 16 << 20,
    "lengths": [32, 128],
}


def main(argv: list[str] | None = None) -> dict:
    args = parser().parse_args(argv)
    if args.quick:
        defaults = parser().parse_args([])
        for key, value in QUICK.items():  # quick defaults, unless given explicitly
            if getattr(args, key) == getattr(defaults, key):
                setattr(args, key, value)
    start = time.perf_counter()
    models = ensure_models(
        args.preset,
        args.data,
        layers=args.layers,
        vocab=args.vocab,
        routing=routing_of(args),
        seed=args.seed,
        dtype=args.dtype,
    )
    disk = measure_disk(models, args)
    result = SCENARIOS[args.scenario](models, args, disk)
    if args.scenario in ("warm", "cold"):
        result = {**flat(result), **result}
    result = {
        "scenario": args.scenario,
        "routing_model": args.routing,  # None: the checkpoint's synthetic routing
        **result,
        "model": models.info,
        "disk": disk,
        "settings": {k: v for k, v in vars(args).items() if k not in ("data", "results", "json")},
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "mlx": mx.__version__,
            "device": str(mx.default_device()),
            "mem_total_bytes": _mem_total(),
        },
        "wall_s": time.perf_counter() - start,
    }
    args.results.mkdir(parents=True, exist_ok=True)
    path = args.results / f"{result_name(models.name, args)}.json"
    path.write_text(json.dumps(result, indent=2, default=str) + "\n")
    log(f"[bench] wrote {path} ({result['wall_s']:.0f} s)")
    if args.json:
        print(json.dumps(result, default=str))
    else:
        log(headline(result))
    return result


def result_name(model: str, args: argparse.Namespace) -> str:
    """<model>-<scenario>[-<routing profile>][-<tag>]: runs at different routings never share a
    file."""
    parts = [model, args.scenario, args.routing, args.tag]
    return "-".join(part for part in parts if part)


def _mem_total() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return None


if __name__ == "__main__":
    main()
