"""Repacked vs in place: the same MLX download streamed from its repack and from its own shards,
side by side in one run (warm, cold, squeezed), with what each layout costs on disk.

    python bench/run.py layouts --dtype float32 [--available 5G,4G] [--rounds 1 --repeats 2]

Both are streamer with the same memory budget (0 by default: page cache only) on the same
weights; only the layout differs. A repacked expert is one page-aligned record (one range); in a
download it is one range per stacked tensor (9 for a quantized GLU), starting anywhere, so its
first and last pages are shared with the neighbouring experts. `amplification` is what that
costs in whole pages read per routed payload byte, at 4 KiB (Linux x86) and 16 KiB (Apple
silicon) pages, computed on the routing of a recorded decode run (experts routed together in
one layer share boundary pages once).
"""

from __future__ import annotations

import statistics

import pagecache
from balloon import Balloon, GiB, mem_available
from engines import common_args, log, worker
from summary import summarize

PAGES = (4096, 16384)


def scenario_layouts(models, args, disk: dict) -> dict:
    layouts = {
        "repacked": (models.streaming, models.expert_files),
        "in_place": (models.mlx, models.checkpoint_files),
    }

    def run(name: str, *extra: str, repeats: int | None = None) -> dict:
        folder = layouts[name][0]
        return worker(
            "streamer", models, *common_args(args, repeats=repeats), *extra, folder=folder
        )

    out: dict = {"disk_bytes": disk_bytes(models)}
    warm: dict[str, list] = {name: [] for name in layouts}
    trace = None
    for r in range(args.rounds):  # alternate layouts so drift on a shared machine hits both
        for name, (_, files) in layouts.items():
            log(f"[bench] layouts warm round {r + 1}/{args.rounds}: {name}")
            pagecache.warm(files)
            extra = (
                ["--routing-steps", str(args.routing_tokens), "--keep-trace"] if not trace else []
            )
            warm[name].append(run(name, "--warmup", *extra))
            trace = trace or warm[name][-1].get("routing", {}).get("trace")
    out["warm"] = {name: summarize(w, models, disk["read_gbps"]) for name, w in warm.items()}
    out["warm"]["ratio_in_place_per_round"] = [
        _rate(i) / _rate(p) for p, i in zip(warm["repacked"], warm["in_place"])
    ]
    out["amplification"] = amplification(models, trace) if trace else None

    cold: dict[str, list] = {name: [] for name in layouts}
    for r in range(args.repeats):
        for name, (_, files) in layouts.items():
            log(f"[bench] layouts cold run {r + 1}/{args.repeats}: {name}")
            pagecache.drop(files)
            cold[name].append(run(name, "--cold-decode", repeats=1))
    out["cold"] = {name: summarize(c, models, disk["read_gbps"]) for name, c in cold.items()}

    points = []
    floor = args.reserve + models.streamer_need
    for target in args.available:
        if target < floor:
            log(f"[bench] refusing {target / GiB:.1f} GiB: below {floor / GiB:.1f} GiB")
            continue
        point = {"target_available": target}
        with Balloon(max(mem_available() - target, 0), reserve=floor) as balloon:
            point["mem_available"] = mem_available()
            for name, (_, files) in layouts.items():
                log(f"[bench] layouts squeezed to {point['mem_available'] / GiB:.1f} GiB: {name}")
                pagecache.drop(files)
                point[name] = summarize([run(name, "--warmup")], models, disk["read_gbps"])
            point["balloon_survived"] = balloon.alive()
        points.append(point)
    out["squeezed"] = points
    return out


def _rate(result: dict) -> float:
    return statistics.median(r["decode_tok_s"] for r in result["runs"])


def disk_bytes(models) -> dict:
    """What each layout occupies, and the most disk a repack needs at once, keeping the download
    and with --delete-source (streamer/repack/consume.py)."""
    from streamer.repack import disk_needs

    download = sum(p.stat().st_size for p in models.mlx.rglob("*") if p.is_file())
    repacked = sum(p.stat().st_size for p in models.streaming.rglob("*") if p.is_file())
    keep, peak = disk_needs(models.mlx)
    return {
        "download": download,
        "repacked": repacked,
        "in_place_total": download,
        "repacked_keeping_download": download + repacked,
        "repack_peak_extra_keeping_source": keep,
        "repack_peak_extra_with_delete_source": peak,
        "repacked_total_after_delete_source": repacked,
    }


def amplification(models, trace: list) -> dict:
    """Bytes of whole pages read per payload byte for the routed experts of `trace` (decode
    steps: [layer, experts]), for both layouts, at each page size; and one expert alone."""
    from streamer.io.manifest import read_manifest
    from streamer.loading.download_folder import open_download

    download, _, _ = open_download(models.mlx)
    manifest = read_manifest(models.streaming)
    steps: dict[tuple[int, int], set[int]] = {}
    for n, (layer, experts) in enumerate(trace):
        steps[(n // len(download.layers), layer)] = set(experts)  # one decode step per layer set
    out = {"decode_layer_calls": len(steps)}
    for page in PAGES:
        payload = pages_in_place = pages_repacked = 0
        for (_, layer), experts in steps.items():
            placed = download.layers[layer]
            payload += len(experts) * placed.payload_bytes
            touched = set()
            for t in placed.tensors:
                for e in experts:
                    offset, length = t.span(e)
                    touched.update(
                        (t.file, p)
                        for p in range(offset // page, (offset + length - 1) // page + 1)
                    )
            pages_in_place += len(touched) * page
            record = manifest.layers[layer].record_bytes
            pages_repacked += len(experts) * -(-record // page) * page
        single = _single_expert_pages(download.layers[0], page)
        out[f"{page // 1024}KiB"] = {
            "in_place": pages_in_place / payload,
            "repacked": pages_repacked / payload,
            "in_place_one_expert": single / download.layers[0].payload_bytes,
            "ranges_per_expert_in_place": len(download.layers[0].tensors),
        }
    return out


def _single_expert_pages(layer, page: int) -> float:
    """Mean page bytes of one expert read alone, over the layer's experts."""
    total = 0
    for e in range(layer.num_experts):
        for t in layer.tensors:
            offset, length = t.span(e)
            total += ((offset + length - 1) // page - offset // page + 1) * page
    return total / layer.num_experts
