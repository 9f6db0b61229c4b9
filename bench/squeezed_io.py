#!/usr/bin/env python3
"""Squeezed decode: bytes read from disk per token by each read path, side by side in one run.

    python bench/squeezed_io.py --data /work/bench-data --limit 2.9G --decode-tokens 32

Each point runs in its own process inside a fresh memory cgroup (v1 `memory.limit_in_bytes`, or
v2 `memory.max`; needs root) that holds `--limit` bytes for the process and the page cache it
fills, so the squeeze is the run's own and the machine's other users keep their memory (a balloon,
bench/balloon.py, squeezes everyone). The expert files are dropped from the page cache first; a
short warm-up generation, then one timed generation whose decode steps are counted: disk bytes
per token from /proc/self/io `read_bytes` (what the process made the kernel fetch from storage,
read-ahead included, every thread), beside the engine's own count of the bytes it asked for.

`--routing PROFILE` puts the routing model (bench/profile_routing.py) in place of the routers,
and `--temp 0` decodes greedily, so that every point's tokens must agree (each row lists them).
Points (`--points`): `slots` (the slot path at `--budget`, default 0: one layer's experts; a
cgroup's squeeze is not in the memory available the default budget is made from),
`slots-readahead` (the same with the kernel's read-ahead left on, as before io/reads.py turned
it off), `slots-serial` (every call's entries computed after its reads, as
before decode calls computed their hits beside the misses' reads: experts/slots.py
OVERLAPPED_ROUTES), `slots-1core` (its matmuls on one core, as before streamer/cpu_cores.py
cut them across every core), `mapped` (in place on the mapped files), and the peers `boyle`,
`nunspark` and `bigrig` at `--peer-budgets` (bench/peers.py: how they run here). A point the
squeeze kills is a row saying so. `--read-mbps` throttles every point's reads
(bench/slow_disk.py: where the disk is the token, as on a Mac). Writes
bench/results/<model>-squeezed-io[-PROFILE][-TAG].json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from balloon import GiB  # noqa: E402
from engines import child_result, log  # noqa: E402
from peers import BUDGETS_GB, PEERS, mlx_lm_tokens  # noqa: E402
from slow_disk import own_cgroup, read_throttle  # noqa: E402

POINTS = ("slots-readahead", "slots-serial", "slots-1core", "slots", "mapped")


def disk_read_bytes() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("read_bytes"))


def rss() -> dict:
    """This process's resident anonymous and file-backed bytes now (/proc/self/status)."""
    with open("/proc/self/status") as f:
        kib = {k: int(v.split()[0]) for k, v in (ln.split(":", 1) for ln in f if ":" in ln)
               if k in ("RssAnon", "RssFile")}  # fmt: skip
    return {"rss_anon_bytes": kib["RssAnon"] * 1024, "rss_file_bytes": kib["RssFile"] * 1024}


def memory_cgroup(limit: int) -> Path:
    """A fresh memory cgroup under this process's own, limited to `limit` bytes (its caller
    moves a process into it and removes it once that process has exited)."""
    root, v1 = own_cgroup("memory")
    group = root / f"squeezed-io-{os.getpid()}"
    group.mkdir()
    (group / ("memory.limit_in_bytes" if v1 else "memory.max")).write_text(str(limit))
    return group


class Streamer:
    """streamer at a point: the slot path (its variants) or in place on the mapped files."""

    def __init__(self, args: argparse.Namespace):
        from profile_routing import install

        import streamer
        from streamer.experts import slots
        from streamer.io import reads

        if args.point == "slots-readahead":
            reads.no_read_ahead = lambda fd: None  # the kernel's read-ahead left on, as before
        if args.point == "slots-serial":
            slots.OVERLAPPED_ROUTES = 0  # every call's entries computed after its reads, as before
        path = "mapped" if args.point == "mapped" else "slots"
        threads = 1 if args.point == "slots-1core" else None  # None: every core
        self.model, _ = streamer.load(
            args.model, memory_budget=args.budget, read_path=path, threads=threads
        )
        self.handle = self.model.streamer
        self.files, self.evict = self.handle.expert_paths, self.handle.evict
        self.residency = self.handle.residency
        self.positions = install(self.model, args.routing) if args.routing else None
        self.temp = args.temp

    def tokens(self, prompt, max_tokens: int):
        return mlx_lm_tokens(self.model, prompt, max_tokens, self.temp)


def one(args: argparse.Namespace) -> dict:
    """One point, in this process: squeezed, dropped, warmed up briefly, then timed."""
    for group in {args.cgroup, args.throttle} - {None}:  # the squeeze, and a slow disk's
        (Path(group) / "cgroup.procs").write_text(str(os.getpid()))  # (v2: one group, both)
    import mlx.core as mx
    import pagecache
    from peers import open_peer
    from worker import prompt_ids

    if args.point in PEERS:
        budget = peer_budgets(args.peer_budgets)[args.point]
        engine = open_peer(args.point, mlx_folder(args.model), budget, args.routing, args.temp)
    else:
        engine = Streamer(args)
    pagecache.drop(engine.files, getattr(engine, "evict", None))
    log(f"[squeezed-io] {args.point}: {engine.residency}")
    stats = engine.handle.stats if isinstance(engine, Streamer) else None
    positions = engine.positions
    if positions is not None:  # the warm-up's prompt and the timed one, each its own routing
        positions.start(10_000, 8 + 4 + 2)
    for _ in engine.tokens(prompt_ids(8, seed=99), 4):
        pass
    if positions is not None:
        positions.start(0, args.prompt_tokens + args.decode_tokens + 2)
    marks, ids = [], []
    for token in engine.tokens(prompt_ids(args.prompt_tokens), args.decode_tokens):
        marks.append((time.perf_counter(), disk_read_bytes(), time.process_time()))
        ids.append(token)
        if len(marks) == 1 and stats is not None:
            stats.reset()  # the engine's counts cover the decode steps, as the marks do
    steps = len(marks) - 1
    mx.eval(mx.zeros(1))
    result = {
        "point": args.point,
        "routing": args.routing or "synthetic",
        "budget": budget if args.point in PEERS else args.budget,
        "limit": args.limit,
        "read_mbps": args.read_mbps,
        "temp": args.temp,
        "decode_tokens": steps,
        "decode_tok_s": steps / (marks[-1][0] - marks[0][0]),
        "disk_bytes_per_token": (marks[-1][1] - marks[0][1]) / steps,
        "cpu_s_per_token": (marks[-1][2] - marks[0][2]) / steps,
        "residency": engine.residency,
        "tokens": ids,
        **rss(),
    }
    if stats is not None:  # what the engine asked for (the peers count otherwise, or not)
        result["engine_bytes_per_token"] = stats.decode.bytes_read / steps
        result["engine_misses_per_token"] = stats.decode.experts_fetched / steps
    return result


def mlx_folder(streaming: Path) -> Path:
    """The MLX download a bench repack was made from (models.py names them in pairs)."""
    return streaming.with_name(streaming.name.removesuffix("-streaming") + "-mlx")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=Path.home() / ".cache" / "streamer-bench")
    ap.add_argument("--model", type=Path, help="a repacked folder (default: the 12-layer one)")
    ap.add_argument("--limit", type=float, default=2.9, help="GiB for the run and its page cache")
    ap.add_argument("--budget", type=int, default=0, help="slot pool bytes (0: one layer's)")
    ap.add_argument("--points", default=",".join(POINTS))
    ap.add_argument("--rounds", type=int, default=1, help="the points again, alternating")
    ap.add_argument("--prompt-tokens", type=int, default=16)
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--routing", help="a routing model profile in place of the routers (medium)")
    ap.add_argument("--temp", type=float, default=1.0, help="sampling temperature (0: greedy)")
    ap.add_argument(
        "--peer-budgets",
        default=",".join(f"{peer}={gb}" for peer, gb in BUDGETS_GB.items()),
        help="GB each peer may use: boyle's budget (resident weights, slots, KV), nunspark's "
        "piece cache, bigrig's expert pool (its residency)",
    )
    ap.add_argument(
        "--read-mbps",
        type=float,
        help="the disk's reads throttled to this many MB/s (bench/slow_disk.py: a Mac's SSD "
        "scaled to this machine's compute)",
    )
    ap.add_argument("--tag", help="appended to the result file's name")
    ap.add_argument("--point", help=argparse.SUPPRESS)  # one point, in a child process
    ap.add_argument("--cgroup", help=argparse.SUPPRESS)  # the child's memory cgroup
    ap.add_argument("--throttle", help=argparse.SUPPRESS)  # and its read throttle's
    args = ap.parse_args()
    # killed, the parent still stops its child and removes the child's cgroup (subprocess.run
    # kills the child on the way out, then child()'s `finally` removes the emptied group)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.limit = int(args.limit * GiB) if args.limit < 1 << 20 else int(args.limit)
    peer_budgets(args.peer_budgets)  # checked before any point runs
    if args.model is None:
        args.model = default_model(args.data)
    if args.point:
        print(json.dumps(one(args)))
        return
    rows = []
    for _ in range(args.rounds):
        for point in args.points.split(","):
            rows.append(child(args, point))
            log(f"[squeezed-io] {point}: {said(rows[-1])}")
    tag = (f"-{args.routing}" if args.routing else "") + (f"-{args.tag}" if args.tag else "")
    out = BENCH / "results" / f"{args.model.name.rsplit('-', 2)[0]}-squeezed-io{tag}.json"
    out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}))
    log(f"[squeezed-io] wrote {out}")


def peer_budgets(text: str) -> dict[str, int]:
    """`boyle=2,nunspark=0.75,bigrig=1` (GB) as bytes a peer; one not named at BUDGETS_GB's."""
    budgets = {}
    for item in text.split(","):
        name, _, gb = item.partition("=")
        if name not in PEERS or not gb.replace(".", "", 1).isdigit():
            raise SystemExit(f"--peer-budgets: {item!r} is not PEER=GB (peers: {', '.join(PEERS)})")
        budgets[name] = int(float(gb) * 1e9)
    return {**{peer: int(gb * 1e9) for peer, gb in BUDGETS_GB.items()}, **budgets}


def said(row: dict) -> str:
    """A point's result in a line."""
    if "failed" in row:
        return row["failed"]
    asked = row.get("engine_bytes_per_token")
    return (
        f"{row['disk_bytes_per_token'] / 1e6:.1f} MB/token from disk"
        + (f" ({asked / 1e6:.1f} MB asked for)" if asked is not None else "")
        + f", {row['decode_tok_s']:.3f} tok/s"
    )


def child(args: argparse.Namespace, point: str) -> dict:
    group, throttle = memory_cgroup(args.limit), None
    argv = [sys.executable, __file__, "--point", point, "--model", str(args.model)]
    argv += ["--limit", str(args.limit), "--budget", str(args.budget), "--cgroup", str(group)]
    argv += ["--prompt-tokens", str(args.prompt_tokens), "--decode-tokens", str(args.decode_tokens)]
    argv += ["--temp", str(args.temp), "--peer-budgets", args.peer_budgets]
    argv += ["--routing", args.routing] if args.routing else []
    try:  # a point the squeeze kills (a peer over its cgroup: exit -9) is a result, not the end
        if args.read_mbps:
            throttle = read_throttle(args.model, int(args.read_mbps * 1e6), group)
            argv += ["--read-mbps", str(args.read_mbps), "--throttle", str(throttle)]
        return child_result(argv, f"the {point} point")
    except SystemExit as failed:
        return {"point": point, "failed": str(failed), "limit": args.limit}
    finally:
        for made in {group, throttle} - {None}:
            made.rmdir()  # the memory group's page cache goes to its parent group


def default_model(data: Path) -> Path:
    found = sorted(data.glob("qwen3-30b-a3b-12l-float32-*-streaming"))
    if not found:
        raise SystemExit(f"[squeezed-io] no 12-layer float32 repack in {data}: run bench/run.py")
    return found[-1]


if __name__ == "__main__":
    main()
