#!/usr/bin/env python3
"""The decode tok/s streamer should reach on Apple silicon, projected from the routing profiles'
hit rates, the bytes a token reads and published Mac bandwidths (nothing here runs on a Mac).

    python bench/mac_projection.py [--tokens 600] [--profiles high,medium,low,uniform]

Inputs, each stated (change them to recompute the table):
  bytes      `streamer plan`'s own figures for the published config (fixtures/published_shapes.py)
             planned as a 4-bit group-64 repack: routed expert bytes per token, resident bytes,
             and the slot path's default pool (cache/budget.py: 75% of what the resident weights
             leave) in the memory a run has.
  MACHINES   the memory a run has: a 16 GB Mac 11 GB (mlx-vlm's moe_offload peaked at 10.6 GB
             running Qwen3-30B-A3B on a 16 GB M4 mini), a 64 GB Mac 48 GB (the GPU's default
             working-set limit, about 75% of RAM); memory bandwidth from Apple's specifications
             (M4 120 GB/s, M4 Pro 273 GB/s).
  DISK_GBPS  expert-sized preads: 3 GB/s (older SSDs) and 9.5 GB/s (M5 Pro, queue depth 1);
             page-cache copies COPY_GBPS 9.3 GB/s (bigrig's cached reads): all from
             ../shared/notes/prior-art.md, as bench/budget_model.py uses them.
  routing    bench/routing_model.py's profiles (2 prompts), replayed through two levels
             (budget_model.two_levels: the pool's SlotLFU, an LRU page cache under it over the
             pool's misses, the first 100 tokens warming both).
  compute    assumptions, not measurements: a token reads its resident and routed bytes at
             EFFICIENCY of the memory bandwidth, plus SYNC_S per MoE layer (the routing's host
             sync). Reads and compute serial: flash-moe measured load-then-compute fastest on
             Macs (the engine computes a decode call's hits beside its misses' reads,
             experts/slots.py; serial here is the bound without that).
Read paths: the slot pool at plan's default with the page cache under it (reads through it),
the same pool reading around it (F_NOCACHE: the rest of the memory idle), and a pool of one
layer's experts leaving the rest to the page cache (what flash-moe found faster). The mapped
path computes on mapped files, which Metal would wire whole: not a GPU path on a Mac.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
from budget_model import COPY_GBPS, DISK_GBPS, two_levels
from routing_model import RoutingModel

from fixtures.published_shapes import QWEN3_30B_A3B, QWEN3_235B_A22B

GB = 1e9
MACHINES = {  # name: (model, its config, memory a run has in bytes, memory GB/s)
    "16 GB Mac (M4)": ("Qwen3-30B-A3B", QWEN3_30B_A3B, 11 * GB, 120),
    "64 GB Mac (M4 Pro)": ("Qwen3-235B-A22B", QWEN3_235B_A22B, 48 * GB, 273),
}
EFFICIENCY = 0.6  # share of the memory bandwidth a decode step's weight reads reach (assumed)
SYNC_S = 1e-4  # seconds per MoE layer a host sync costs beside the compute (assumed)
PEERS = {  # published: ../shared/notes/prior-art.md, ../shared/notes/routing.md
    "Qwen3-30B-A3B": "nunspark 6.9 (16 GB M4); mlx-vlm moe_offload 14.1 (16 GB M4 mini); "
    "Ollama 1.7 (16 GB M1); boyle 14.5 (12 GB budget, 32 GB M1 Pro)",
    "Qwen3-235B-A22B": "Nunspark 0.29-0.36 (96 GB M3 Ultra, 83-86% LRU hits)",
}


def planned(config: dict, memory: float):
    from streamer.plan import plan

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "config.json"
        path.write_text(json.dumps(config))
        return plan(path, int(memory), quantize=(4, 64))


def project(machine: str, profiles: list[str], tokens: int) -> list[dict]:
    name, config, memory, bandwidth = MACHINES[machine]
    p = planned(config, memory)
    total = p.moe_layers * p.experts  # experts in all
    one = p.expert_bytes / total
    left = int((memory - p.resident_bytes) / one)  # experts the memory beside the weights holds
    pool = int(p.slot_budget_bytes / one)
    paths = {
        "pool + page cache": (pool, left - pool),
        "pool, F_NOCACHE": (pool, 0),
        "one layer's pool + page cache": (p.experts, left - p.experts),
    }
    compute = (p.resident_bytes + p.expert_bytes_per_token) / (EFFICIENCY * bandwidth * GB)
    compute += p.moe_layers * SYNC_S
    rows = []
    for profile in profiles:
        model = RoutingModel(profile, p.experts, p.experts_per_token, p.moe_layers)
        routed = np.concatenate(model.prompts(tokens, 2))
        for path, (slots, cache) in paths.items():
            found = two_levels(routed, p.experts, slots, cache)
            row = {"machine": machine, "model": name, "profile": profile, "path": path}
            row |= {"pool_share": slots / total, **found, "compute_s": compute}
            for disk in DISK_GBPS:
                per_byte = found["page_cache"] / COPY_GBPS + found["disk"] / disk  # s per GB
                read = p.expert_bytes_per_token * per_byte / GB
                row[f"tok_s_disk_{disk:g}"] = 1 / (compute + read)
            rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    lines = [
        "| machine, model | routing | read path (pool share) | pool / page cache / SSD | "
        + " | ".join(f"tok/s at {d:g} GB/s" for d in DISK_GBPS)
        + " |",
        "|---|---|---|---|" + "---|" * len(DISK_GBPS),
    ]
    for r in rows:
        lines.append(
            f"| {r['machine']}, {r['model']} | {r['profile']} | {r['path']} "
            f"({r['pool_share']:.0%}) | {r['pool']:.0%} / {r['page_cache']:.0%} / "
            f"{r['disk']:.0%} | "
            + " | ".join(f"{r[f'tok_s_disk_{d:g}']:.1f}" for d in DISK_GBPS)
            + " |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=600, help="decode tokens replayed per model")
    ap.add_argument("--profiles", default="high,medium,low,uniform")
    ap.add_argument("--json", type=Path, help="write the rows here")
    args = ap.parse_args()
    rows = []
    for machine in MACHINES:
        rows += project(machine, args.profiles.split(","), args.tokens)
    print(table(rows))
    for name, figures in PEERS.items():
        print(f"\npeers, {name}: {figures}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
