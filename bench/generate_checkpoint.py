"""Real-shaped MLX 4-bit MoE checkpoints with random weights, written one tensor at a time.

The tensor names, shapes, dtypes, shard layout and config.json (with its `quantization` block) are
what `mlx_lm.convert --quantize` writes: the model is built lazily by mlx-lm and quantized by
mlx-lm's own `quantize_model`, and only its parameter *names and shapes* are used. Values are
random floats quantized with `mx.quantize`, produced and written one tensor (or expert chunk) at a
time, so the model is never in memory.

Routing is synthetic, calibrated to two published statistics: bench/synthetic_values.py.

    python bench/generate_checkpoint.py qwen3-30b-a3b-12l /work/bench-data/q12-mlx
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import shutil
import struct
import sys
import time
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_map_with_path
from mlx_lm.utils import MAX_FILE_SIZE_GB, get_total_parameters, quantize_model, save_config
from presets import PRESETS, ROUTING, add_checkpoint_arguments, preset_config, routing_of
from synthetic_values import RandomValues

from streamer.families.architectures import build_model
from streamer.io.safetensors import MLX_TO_SAFETENSORS
from streamer.io.sizes import rate_text, size_text

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # fixtures/: not installed
from fixtures import write_tokenizer  # noqa: E402

Log = Callable[[str], None]

SPEC_FILE = "bench_spec.json"  # written last: a folder without it is incomplete
GENERATOR_VERSION = 3  # bump when the values written change: cached checkpoints are then rewritten


def write_checkpoint(
    folder: Path | str,
    config: dict,
    *,
    bits: int = 4,
    group_size: int = 64,
    routing: dict = ROUTING,
    seed: int = 0,
    log: Log = print,
    sparse: bool = False,
) -> Path:
    """Write an MLX-quantized checkpoint of `config` to `folder` (replaced if present).

    `sparse`: headers, index and sizes only, the data a hole (no disk, no compute): for disk
    plans (`streamer.repack.disk_needs`), not for running."""
    folder = Path(folder)
    partial = folder.parent / f".{folder.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    model = build_model(config, "bench config")  # lazy: nothing is ever evaluated
    dtype = getattr(mx, config.get("torch_dtype", "bfloat16"))
    cast = getattr(
        model, "cast_predicate", lambda _: True
    )  # as mlx_lm.convert casts before quantizing
    model.update(
        tree_map_with_path(
            lambda k, v: v.astype(dtype) if cast(k) and mx.issubdtype(v.dtype, mx.floating) else v,
            model.parameters(),
        )
    )
    with contextlib.redirect_stdout(io.StringIO()):  # mlx-lm prints bits per weight
        model, qconfig = quantize_model(model, config, group_size, bits)
    specs = [(name, tuple(a.shape), a.dtype) for name, a in tree_flatten(model.parameters())]
    shards = _shards(specs)
    values = None if sparse else RandomValues(specs, qconfig, dtype, {**ROUTING, **routing}, seed)
    total = sum(_nbytes(s, d) for _, s, d in specs)
    written, start = 0, time.perf_counter()
    weight_map = {}
    for i, shard in enumerate(shards):
        shard_name = (
            f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            if len(shards) > 1
            else "model.safetensors"
        )
        for name, shape, dtype in _write_shard(partial / shard_name, shard, values):
            weight_map[name] = shard_name
            written += _nbytes(shape, dtype)
            if name.endswith("switch_mlp.up_proj.weight") or written == total:
                rate = rate_text(written, time.perf_counter() - start)
                log(f"[generate] {size_text(written)} of {size_text(total)} ({rate}) {name}")
    index = {
        "metadata": {"total_size": total, "total_parameters": get_total_parameters(model)},
        "weight_map": dict(sorted(weight_map.items())),
    }
    (partial / "model.safetensors.index.json").write_text(json.dumps(index, indent=4))
    save_config(qconfig, partial / "config.json")
    write_tokenizer(partial)
    spec = checkpoint_spec(config, bits=bits, group_size=group_size, routing=routing, seed=seed)
    (partial / SPEC_FILE).write_text(json.dumps(spec, indent=2, sort_keys=True))
    if folder.exists():
        shutil.rmtree(folder)
    partial.rename(folder)
    return folder


def checkpoint_spec(
    config: dict, *, bits: int = 4, group_size: int = 64, routing: dict = ROUTING, seed: int = 0
) -> dict:
    """What determines a generated checkpoint's bytes (stored with it, to reuse it safely)."""
    return {
        "config": config,
        "bits": bits,
        "group_size": group_size,
        "routing": {**ROUTING, **routing},
        "seed": seed,
        "generator": GENERATOR_VERSION,
    }


def read_spec(folder: Path) -> dict | None:
    try:
        return json.loads((Path(folder) / SPEC_FILE).read_text())
    except (OSError, ValueError):
        return None


def _nbytes(shape: tuple[int, ...], dtype: mx.Dtype) -> int:
    return math.prod(shape) * dtype.size


def _shards(specs: list) -> list[list]:
    """Consecutive tensors up to mlx-lm's shard size, as mlx_lm.utils.make_shards groups them."""
    limit = MAX_FILE_SIZE_GB << 30
    shards, size = [], 0
    for spec in specs:
        n = _nbytes(spec[1], spec[2])
        if not shards or size + n > limit:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += n
    return shards


def _write_shard(path: Path, specs: list, values: RandomValues | None):
    """Header from the specs, then each tensor computed, written and dropped; yields each spec."""
    header: dict = {"__metadata__": {"format": "mlx"}}
    offset = 0
    for name, shape, dtype in specs:
        n = _nbytes(shape, dtype)
        header[name] = {
            "dtype": MLX_TO_SAFETENSORS[dtype],
            "shape": list(shape),
            "data_offsets": [offset, offset + n],
        }
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    # no padding after the header, as mlx writes it: tensors then start at any byte offset
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        if values is None:
            f.truncate(8 + len(raw) + offset)
            yield from specs
            return
        for name, shape, dtype in specs:
            array = values.take(name)
            if tuple(array.shape) != shape or array.dtype != dtype:
                raise RuntimeError(
                    f"{name}: produced {array.dtype}{list(array.shape)}, "
                    f"expected {dtype}{list(shape)}"
                )
            f.write(memoryview(array).cast("B"))
            del array
            yield name, shape, dtype


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("preset", choices=sorted(PRESETS))
    ap.add_argument("out", type=Path)
    add_checkpoint_arguments(ap)
    ap.add_argument("--sparse", action="store_true", help="headers and sizes only, data a hole")
    args = ap.parse_args(argv)
    config = preset_config(
        args.preset,
        num_hidden_layers=args.layers,
        experts=args.experts,
        vocab_size=args.vocab,
        torch_dtype=args.dtype,
    )
    write_checkpoint(
        args.out,
        config,
        routing=routing_of(args),
        seed=args.seed,
        log=lambda m: print(m, file=sys.stderr, flush=True),
        sparse=args.sparse,
    )


if __name__ == "__main__":
    main()
