"""The scenarios: warm, cold, squeezed, prefill (and layouts, bench/layouts.py), each a function of
the models, the arguments and the measured disk."""

from __future__ import annotations

import argparse
import statistics

import layouts
import pagecache
from balloon import Balloon, GiB, mem_available
from engines import common_args, log, worker
from models import Models
from summary import summarize


def measure_disk(models: Models, args: argparse.Namespace) -> dict:
    log(
        f"[bench] disk: cold {models.record_bytes / 1e6:.1f} MB records, "
        f"{models.info['top_k']} per layer"
    )
    disk = pagecache.disk_bandwidth(
        models.expert_files,
        models.record_bytes,
        group=models.info["top_k"],
        concurrency=args.io_concurrency,
        budget=args.disk_budget,
    )
    engine = disk["engine_gbps"]
    log(
        f"[bench] disk: WILLNEED+populate (the engine's way) {engine or float('nan'):.2f} GB/s, "
        f"pread x{args.io_concurrency} {disk['pread_gbps']:.2f} GB/s, "
        f"mmap page faults {disk['mmap_copy_gbps']:.2f} GB/s"
    )
    disk["read_gbps"] = engine or disk["pread_gbps"]  # what the I/O bound divides by
    return disk


def baseline_fits(models: Models, args: argparse.Namespace) -> bool:
    if args.no_baseline:
        return False
    fits = mem_available() - models.baseline_need >= args.reserve
    if not fits:
        log(
            f"[bench] mlx-lm resident needs ~{models.baseline_need / 1e9:.1f} GB: it does not fit, "
            "skipped"
        )
    return fits


def not_run(models: Models, args: argparse.Namespace) -> dict | None:
    return None if args.no_baseline else {"fits": False, "needs_bytes": models.baseline_need}


def scenario_warm(models: Models, args: argparse.Namespace, disk: dict) -> dict:
    streamer, baseline, routing = [], [], None
    for r in range(args.rounds):  # alternate engines so drift on a shared machine hits both
        log(f"[bench] round {r + 1}/{args.rounds}: streamer")
        pagecache.warm(models.expert_files, log=log if r == 0 else lambda _: None)
        cached = pagecache.resident_fraction(models.expert_files)
        streamer.append(worker("streamer", models, *common_args(args), "--warmup"))
        if baseline_fits(models, args):
            log(f"[bench] round {r + 1}/{args.rounds}: mlx-lm resident")
            pagecache.warm(models.checkpoint_files)
            extra = (
                ["--routing-steps", str(args.routing_tokens)]
                if r == 0 and args.routing_tokens
                else []
            )
            baseline.append(worker("mlx_lm", models, *common_args(args), "--warmup", *extra))
            routing = routing or baseline[-1].get("routing")

    def rate(w: dict) -> float:
        return statistics.median(r["decode_tok_s"] for r in w["runs"])

    return {
        "expert_files_cached_before": cached,
        "ratio_per_round": [
            rate(s) / rate(b) for s, b in zip(streamer, baseline)
        ],  # neighbours in time
        "streamer": summarize(streamer, models, disk["read_gbps"]),
        "mlx_lm": summarize(baseline, models, None) if baseline else not_run(models, args),
        "routing": routing,
    }


def scenario_cold(models: Models, args: argparse.Namespace, disk: dict) -> dict:
    streamer, baseline = [], []
    for r in range(
        args.repeats
    ):  # one process per run: pages a process has mapped cannot be dropped
        log(f"[bench] cold run {r + 1}/{args.repeats}: streamer")
        pagecache.drop(models.expert_files)
        streamer.append(worker("streamer", models, *common_args(args, repeats=1), "--cold-decode"))
        if baseline_fits(models, args):
            log(f"[bench] cold run {r + 1}/{args.repeats}: mlx-lm resident (cold load)")
            pagecache.drop(models.checkpoint_files)
            baseline.append(worker("mlx_lm", models, *common_args(args, repeats=1)))
    return {
        "streamer": summarize(streamer, models, disk["read_gbps"]),
        "mlx_lm": summarize(baseline, models, None) if baseline else not_run(models, args),
    }


def scenario_squeezed(models: Models, args: argparse.Namespace, disk: dict) -> dict:
    # The serial bound of a squeezed run: its miss bytes at the measured cold-read rate, plus a
    # token's time with every expert cached (compute of the active weights and the resident part).
    log("[bench] squeezed: streamer with the page cache warm, for the serial bound")
    pagecache.warm(models.expert_files)
    warm = summarize(
        [worker("streamer", models, *common_args(args), "--warmup")], models, disk["read_gbps"]
    )
    points = []
    floor = args.reserve + models.streamer_need
    for target in args.available:
        if target < floor:
            log(
                f"[bench] refusing {target / GiB:.1f} GiB: a run needs "
                f"{models.streamer_need / GiB:.1f} GiB "
                f"and {args.reserve / GiB:.1f} GiB must stay free for the machine"
            )
            continue
        size = mem_available() - target
        point = {"target_available": target, "balloon_bytes": max(size, 0)}
        with Balloon(max(size, 0), reserve=floor) as balloon:
            point["balloon_method"] = balloon.method
            point["mem_available"] = mem_available()
            log(f"[bench] squeezed to {point['mem_available'] / GiB:.1f} GiB available: streamer")
            pagecache.drop(models.expert_files)
            s = worker("streamer", models, *common_args(args), "--warmup")
            point["streamer"] = summary = summarize([s], models, disk["read_gbps"])
            bound = warm["ms_per_token"] + (summary.get("io_ms_per_token") or 0.0)
            point["serial_bound_ms_per_token"] = bound
            point["vs_serial_bound"] = summary["ms_per_token"] / bound
            if not args.no_baseline and target >= models.baseline_need + args.reserve:
                log("[bench] squeezed: mlx-lm resident")
                point["mlx_lm"] = summarize(
                    [worker("mlx_lm", models, *common_args(args), "--warmup")], models, None
                )
            else:
                point["mlx_lm"] = not_run(models, args)
            point["mem_available_after"] = mem_available()
            point["balloon_survived"] = balloon.alive()
        points.append(point)
    return {"reserve_bytes": args.reserve, "warm_streamer": warm, "points": points}


def scenario_prefill(models: Models, args: argparse.Namespace, disk: dict) -> dict:
    lengths = ",".join(str(n) for n in args.lengths)
    engines = {}
    for engine, files in (("streamer", models.expert_files), ("mlx_lm", models.checkpoint_files)):
        if engine == "mlx_lm" and not baseline_fits(models, args):
            continue
        log(f"[bench] prefill {lengths}: {engine}")
        pagecache.warm(files)
        engines[engine] = worker(
            engine, models, *common_args(args, prompt=lengths, decode=2), "--warmup"
        )
    rows = []
    for n in args.lengths:
        row = {"prompt_tokens": n}
        for engine, result in engines.items():
            picked = {**result, "runs": [r for r in result["runs"] if r["prompt_tokens"] == n]}
            summary = summarize([picked], models, disk["read_gbps"])
            row[engine] = {
                k: summary.get(k)
                for k in (
                    "ttft_s",
                    "prefill_bytes_read_per_run",
                    "peak_rss_bytes",
                    "peak_mlx_bytes",
                )
            }
        rows.append(row)
    return {"lengths": rows}


SCENARIOS = {
    "warm": scenario_warm,
    "cold": scenario_cold,
    "squeezed": scenario_squeezed,
    "prefill": scenario_prefill,
    "layouts": layouts.scenario_layouts,
}
