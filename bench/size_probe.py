"""One load of one checkpoint at one budget, in a fresh process: load time, first-token and
per-token time, and what the engine holds (memory, mappings, descriptors). bench/sizes.py runs it.

    python bench/size_probe.py FOLDER --read-path slots --budget 2G [--tokens 3]

Prints one JSON object. A load or a token that fails prints {"error": "<its one line>"} rather than
a traceback: at these sizes, where each path breaks is a result.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

PROMPT = [1, 2, 3, 4]  # token ids: four tokens of prefill, then decode one at a time


def status() -> dict[str, int]:
    """This process's memory from /proc/self/status, in bytes (RSS split into anonymous memory
    and file pages; the high-water mark)."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
            fields[key] = int(value.split()[0]) * 1024
    return fields


def mappings(folder: Path) -> dict[str, int]:
    """Lines of /proc/self/maps (each one mapping; vm.max_map_count caps them) and open file
    descriptors, all and those on the checkpoint's files."""
    root = str(folder.resolve())
    maps = Path("/proc/self/maps").read_text().splitlines()
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # the descriptor listdir itself used, closed since
            continue
    return {
        "maps": len(maps),
        "maps_on_checkpoint": sum(
            line.rstrip().endswith(".safetensors") and root in line for line in maps
        ),
        "fds": len(fds),
        "fds_on_checkpoint": sum(path.startswith(root) for path in fds),
    }


def rss_within(spans: list[tuple[int, int]], folder: Path) -> tuple[int, int]:
    """Bytes in memory within the address `spans` (each buffer's share of the Rss of the mappings
    it lies in; an untouched buffer takes address space, not memory), and in mappings of the
    checkpoint's files outside them (/proc/self/smaps)."""
    root = str(folder.resolve())
    within = on_files = 0.0
    mapping = None
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            mapping = (lo, hi, root in line)
        elif head == "Rss:" and mapping is not None:
            lo, hi, on_checkpoint = mapping
            rss = int(line.split()[1]) * 1024
            inside = sum(max(0, min(hi, b) - max(lo, a)) for a, b in spans) / (hi - lo)
            within += rss * inside
            on_files += rss * (1 - inside) if on_checkpoint else 0
    return int(within), int(on_files)


def buffer_spans(model, pools) -> tuple[list, list]:
    """Address ranges of the resident weights' buffers and of the slot pools' buffers."""
    import numpy as np
    from mlx.utils import tree_flatten

    from streamer.experts import StreamingExperts

    streamed = tuple(
        f"{name}." for name, m in model.named_modules() if isinstance(m, StreamingExperts)
    )
    weights = []
    for name, v in tree_flatten(model.parameters()):
        if not name.startswith(streamed):
            host = np.asarray(memoryview(v))
            weights.append((host.ctypes.data, host.ctypes.data + v.nbytes))
    pool = [(r.ctypes.data, r.ctypes.data + r.nbytes) for p in pools for c in p._rows for r in c]
    return weights, pool


def resident_weight_bytes(model) -> int:
    """The non-expert weights' bytes: every parameter outside the streaming layers."""
    from mlx.utils import tree_flatten

    from streamer.experts import StreamingExperts

    streamed = tuple(
        f"{name}." for name, m in model.named_modules() if isinstance(m, StreamingExperts)
    )
    return sum(
        v.nbytes for name, v in tree_flatten(model.parameters()) if not name.startswith(streamed)
    )


def tokens(model, count: int) -> list[float]:
    """Seconds (wall, process CPU) of the prompt's pass (the first token), then of each decoded
    token."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    times = []
    inputs = mx.array([PROMPT])
    for _ in range(count):
        start, cpu = time.perf_counter(), time.process_time()
        logits = model(inputs, cache=cache)
        token = mx.argmax(logits[:, -1], axis=-1)
        mx.eval(token)
        times.append((time.perf_counter() - start, time.process_time() - cpu))
        inputs = token[None]
    return times


def imported(folder: Path) -> dict:
    """Import what a load imports (the engine, mlx-lm, the model's file) and plan the folder, so
    that the load's time and memory are its own; returns the plan, timed cold (the first plan
    in a process that has imported mlx-lm) and warm."""
    import mlx_lm.models.cache  # noqa: F401

    import streamer.loading.load  # noqa: F401
    from streamer.plan import plan

    start = time.perf_counter()
    plan(folder, 24 << 30)
    cold = time.perf_counter() - start
    start = time.perf_counter()
    found = plan(folder, 24 << 30)
    took = time.perf_counter() - start
    keep = ("moe_layers", "experts", "experts_per_token", "resident_bytes", "expert_bytes")
    keep += ("expert_bytes_per_token", "download_bytes")
    return {"plan_cold_s": cold, "plan_s": took, **{k: getattr(found, k) for k in keep}}


def probe(folder: Path, read_path: str, budget: int, count: int) -> dict:
    import mlx.core as mx

    import streamer
    from streamer.errors import StreamerError

    result: dict = {"read_path": read_path, "budget": budget, **imported(folder)}
    before = status()
    start, cpu = time.perf_counter(), time.process_time()
    try:
        model, _ = streamer.load(folder, memory_budget=budget, read_path=read_path)
    except (StreamerError, ValueError, OverflowError, RuntimeError, MemoryError) as e:
        return result | {"error": f"load: {type(e).__name__}: {str(e).splitlines()[0]}"}
    result |= {"load_s": time.perf_counter() - start, "load_cpu_s": time.process_time() - cpu}
    handle = model.streamer
    loaded = status()
    pool = sum(p.nbytes for p in handle.pools)
    weight_spans, pool_spans = buffer_spans(model, handle.pools)
    weights_in_memory, files_in_memory = rss_within(weight_spans, folder)
    pool_in_memory, _ = rss_within(pool_spans, folder)
    resident = resident_weight_bytes(model)
    result |= {
        "residency": handle.residency,
        "pool_bytes": pool,
        "resident_bytes": resident,
        "mapped_bytes": handle.files.mapped_bytes if handle.files is not None else 0,
        "rss_loaded": loaded["VmRSS"],
        "anon_loaded": loaded["RssAnon"],
        "file_loaded": loaded["RssFile"],
        "pool_rss_loaded": pool_in_memory,
        "weights_rss_loaded": weights_in_memory,
        "expert_files_rss_loaded": files_in_memory,
        # what the engine holds beside the pool, the weights and the expert files' pages: its
        # Python objects, tables, checksums, layouts, allocator slack
        "engine_bytes": loaded["VmRSS"]
        - before["VmRSS"]
        - pool_in_memory
        - weights_in_memory
        - files_in_memory,
        "mlx_active": mx.get_active_memory(),
        **{f"{k}_loaded": v for k, v in mappings(folder).items()},
    }
    try:
        times = tokens(model, count)
    except (StreamerError, ValueError, RuntimeError, MemoryError) as e:
        return result | {"error": f"tokens: {type(e).__name__}: {str(e).splitlines()[0]}"}
    after = status()
    decode = sorted(times[1:]) or [(None, None)]
    result |= {
        "first_token_s": times[0][0],
        "first_token_cpu_s": times[0][1],
        "per_token_s": decode[len(decode) // 2][0],  # the median decoded token
        "per_token_cpu_s": decode[len(decode) // 2][1],
        "token_s": times,
        "rss_tokens": after["VmRSS"],
        "anon_tokens": after["RssAnon"],
        "peak_rss": after["VmHWM"],
        **{f"{k}_tokens": v for k, v in mappings(folder).items()},
    }
    handle.close()
    return result


def main(argv: list[str] | None = None) -> None:
    from streamer.io.sizes import parse_size

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--read-path", choices=["mapped", "slots"], default="mapped")
    ap.add_argument("--budget", default="0", help="memory budget (bytes or 2G)")
    ap.add_argument("--tokens", type=int, default=3, help="the prompt's pass, then decoded tokens")
    ap.add_argument("--plan-only", action="store_true", help="only plan it, cold then warm")
    args = ap.parse_args(argv)
    if args.plan_only:
        print(json.dumps(imported(args.folder)))
        return
    print(
        json.dumps(
            probe(args.folder, args.read_path, parse_size(args.budget, "--budget"), args.tokens)
        )
    )


if __name__ == "__main__":
    main()
