"""The residency check of a synced layer call, three ways side by side on the same mapped layer.

    python bench/residency.py FOLDER [FOLDER ...] [--calls 500] [--layer 0]

For each folder (a repacked model, or an MLX download streamed in place) one MoE layer is loaded
and its routed experts' residency is asked for random routings of k experts:
- `per_range`: one mincore call per routed range, counted per call (what the engine did before
  the batched check; restated here, with the OS call and counting it made);
- `batched`: the engine's check now, `LayerFiles.resident_bytes` (io/mapping.Residency: the
  same OS calls, from one loop over page spans made once, counted in numpy only where a page
  is missing);
- `whole_regions`: one mincore over every region holding the layer's experts (a residency vector
  per file refreshed once per layer call), which asks about pages no expert of the call uses.
Every call's counts are compared between the first two (they must be equal), and
`fetch_us` times the whole read-ahead step (`Prefetcher.fetch`) with the files warm. Times are
[wall, thread CPU] microseconds per layer call, printed as JSON; bench/findings.md has the numbers
for this machine.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import time
from pathlib import Path

import numpy as np

from streamer.expert_traffic import ExpertTraffic
from streamer.io.mapping import OS_PAGE, _mincore, align


def per_range_counts(layer, experts: list[int], vectors: dict) -> list[list[int]]:
    """The previous check: for each routed range, one mincore into a vector kept per size."""
    counts = []
    for expert in experts:
        row = []
        for r in layer.ranges(expert):
            address = layer.address(r.file, r.offset)
            start = address - address % OS_PAGE
            pages = align(address + r.length - start, OS_PAGE) // OS_PAGE
            if pages not in vectors:
                vec = np.zeros(pages, dtype=np.uint8)
                vectors[pages] = vec, np.zeros_like(vec), vec.ctypes.data
            vec, bits, vec_address = vectors[pages]
            if _mincore(start, address + r.length - start, vec_address) != 0:
                raise OSError(ctypes.get_errno(), "mincore failed")
            np.bitwise_and(vec, 1, out=bits)
            resident = int(np.count_nonzero(bits))
            row.append(r.length if resident == pages else min(resident * OS_PAGE, r.length))
        counts.append(row)
    return counts


def timed(fn, routings: list) -> tuple[float, float]:
    """Microseconds per call: wall, and this thread's CPU time (less sensitive to a loaded
    machine, which deschedules the process mid-call)."""
    for experts in routings[:32]:
        fn(experts)
    start, cpu = time.perf_counter(), time.thread_time()
    for experts in routings:
        fn(experts)
    wall, cpu = time.perf_counter() - start, time.thread_time() - cpu
    return round(wall / len(routings) * 1e6, 1), round(cpu / len(routings) * 1e6, 1)


def measure(folder: Path, layer_index: int, calls: int) -> dict:
    import streamer

    model, _ = streamer.load(folder, memory_budget=0, read_path="mapped")
    handle = model.streamer
    layer = handle.files.layers[layer_index]
    prefetcher = handle.layers[layer_index].prefetcher
    layout = layer.layout
    k = model.args.num_experts_per_tok
    rng = np.random.default_rng(0)
    routings = [
        sorted(rng.choice(layout.num_experts, k, replace=False).tolist()) for _ in range(calls)
    ]
    traffic = ExpertTraffic()
    for experts in routings[:64]:  # the routed experts warm and in this process's page tables
        prefetcher.fetch(experts, traffic)
    vectors: dict = {}
    for experts in routings:  # the same counts, call by call
        batched = layer.resident_bytes(experts).tolist()
        assert batched == per_range_counts(layer, experts, vectors), (folder, experts)
    whole = [(layer.address(r.file, r.offset), r.length) for r in layout.regions]
    pages = sum(align(n + a % OS_PAGE, OS_PAGE) // OS_PAGE for a, n in whole)
    whole_vec = np.zeros(pages, dtype=np.uint8)

    def whole_regions(_experts) -> None:
        at = whole_vec.ctypes.data
        for address, length in whole:
            start = address - address % OS_PAGE
            if _mincore(start, address + length - start, at) != 0:
                raise OSError(ctypes.get_errno(), "mincore failed")
            at += align(address + length - start, OS_PAGE) // OS_PAGE
        int(np.count_nonzero(whole_vec & 1))

    result = {
        "folder": str(folder),
        "layer": layer_index,
        "routed_experts": k,
        "ranges_per_expert": len(layout.expert_ranges),
        "per_range_mincore_calls": k * len(layout.expert_ranges),
        "region_pages": pages,
        "per_range_us": timed(lambda e: per_range_counts(layer, e, vectors), routings),
        "batched_us": timed(layer.resident_bytes, routings),
        "whole_regions_us": timed(whole_regions, routings),
        "fetch_us": timed(lambda e: prefetcher.fetch(e, traffic), routings),
        "counts_identical_calls": len(routings),
    }
    handle.close()
    return result


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", type=Path, nargs="+")
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--layer", type=int, default=0, help="which MoE layer")
    args = ap.parse_args(argv)
    results = [measure(folder, args.layer, args.calls) for folder in args.folders]
    print(json.dumps({"load": os.getloadavg()[0], "results": results}, indent=1))
    return results


if __name__ == "__main__":
    main()
