"""Time to first token with and without the prompt caches on disk (`--prompt-cache-dir`), and
what zstandard would change in them.

Each "restart" is a new engine with nothing in memory (as after a restart of serve or chat); the
cache file is then in the page cache (warm), which is the common case for a file just written.
Usage: python bench/prompt_cache.py [--model DIR] [--tokens 1500] [--repeats 3] [--memory-budget 0]
(default model: the demo model, repacked into a temporary folder).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def first_token_seconds(engine, text: str) -> tuple[float, int]:
    """Seconds from submitting `text` to its first token, and how many tokens came from a cache."""
    from streamer.server.api import Completion, Sampling
    from streamer.server.engine import Done, Job, Step

    prompt = engine.tokenizer.encode(text)
    start = time.perf_counter()
    job = engine.submit(Job(Completion(False, "m", 4, Sampling(), text=text), prompt, 4))
    first = None
    while not isinstance(event := job.events.get(timeout=600), Done):
        if isinstance(event, Step) and first is None:
            first = time.perf_counter() - start
    engine.wait_kept()  # the file is written just after the answer: the next engine reads it
    return first if first is not None else time.perf_counter() - start, event.cached_tokens


def zstd_figures(path: Path) -> dict:
    """zstandard at its default level on one cache file: bytes saved against the time to undo it."""
    try:
        import zstandard
    except ImportError:
        return {"zstd": "not installed"}
    data = path.read_bytes()
    start = time.perf_counter()
    packed = zstandard.ZstdCompressor(level=3).compress(data)
    compress = time.perf_counter() - start
    start = time.perf_counter()
    zstandard.ZstdDecompressor().decompress(packed)
    decompress = time.perf_counter() - start
    return {
        "zstd_ratio": round(len(packed) / len(data), 3),
        "zstd_compress_s": round(compress, 4),
        "zstd_decompress_s": round(decompress, 4),
        "zstd_decompress_gbps": round(len(data) / decompress / 1e9, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="a repacked folder or MLX download")
    ap.add_argument("--tokens", type=int, default=1500, help="tokens of the long prompt")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--memory-budget", default=None, help="as generate's (0: every expert streams)")
    args = ap.parse_args()

    import streamer
    from streamer.server.disk_cache import PREFIX, DiskCache, model_identity
    from streamer.server.engine import Engine

    with tempfile.TemporaryDirectory() as tmp:
        folder = args.model
        if folder is None:
            from streamer.cli.demo import DEMO_MODEL
            from streamer.repack import Quantize, repack

            folder = Path(tmp) / "demo"
            repack(DEMO_MODEL, folder, quantize=Quantize(4), log=lambda _: None)
        model, tokenizer = streamer.load(folder, memory_budget=args.memory_budget)
        corpus = (Path(streamer.__file__).parent / "generate.py").read_text()
        ids = tokenizer.encode(corpus * (1 + args.tokens // 500))[: args.tokens]
        text = tokenizer.decode(ids)
        cache_dir = Path(tmp) / "cache"

        def engine(disk: bool) -> Engine:
            store = DiskCache(cache_dir, model_identity(model, {}), 10 << 30) if disk else None
            return Engine(model, tokenizer, 2, None, store)

        first_token_seconds(engine(False), "warm up")
        cold = [first_token_seconds(engine(False), text)[0] for _ in range(args.repeats)]
        first_token_seconds(engine(True), text)  # writes the file
        restarted = [first_token_seconds(engine(True), text) for _ in range(args.repeats)]
        (path,) = cache_dir.glob(f"{PREFIX}*")
        result = {
            "model": str(args.model or "demo model"),
            "residency": model.streamer.residency,
            "prompt_tokens": len(tokenizer.encode(text)),
            "ttft_without_s": round(min(cold), 3),
            "ttft_after_restart_s": round(min(t for t, _ in restarted), 3),
            "cached_tokens": restarted[0][1],
            "file_bytes": path.stat().st_size,
            **zstd_figures(path),
        }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
