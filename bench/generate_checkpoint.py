"""Real-shaped MLX 4-bit MoE checkpoints with random weights, written one tensor at a time.

The tensor names, shapes, dtypes, shard layout and config.json (with its `quantization` block) are
what `mlx_lm.convert --quantize` writes: the model is built lazily by mlx-lm and quantized by
mlx-lm's own `quantize_model`, and only its parameter *names and shapes* are used. Values are
random floats quantized with `mx.quantize`, produced and written one tensor (or expert chunk) at a
time, so the model is never in memory.

Routing is synthetic, calibrated to two published statistics (bench/README.md, "Routing"):
- skew (how popular the popular experts are): each router row (one per expert) is scaled by
  exp(skew * z_e), z_e ~ N(0, 1) drawn per layer. The router input is RMS-normalised, so a larger
  row means a wider logit spread and more top-k wins. skew=0 is uniform.
- reuse (consecutive tokens sharing experts): the vocabulary is split into TOPICS topics (token t
  in topic t % TOPICS) and every token's embedding shares its topic's random direction (a
  `topic_share` of its variance), so tokens of one topic route alike. The output projection
  gives each topic's tokens a logit boost of `stickiness` x the current token's topic component,
  so sampled text stays in a topic for a while and then moves on. topic_share=0 and
  stickiness=0 give independent tokens (reuse k/E plus what skew alone causes).

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
import zlib
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten, tree_map_with_path
from mlx_lm.utils import MAX_FILE_SIZE_GB, get_total_parameters, quantize_model, save_config

from streamer.architectures import build_model
from streamer.io.safetensors import MLX_TO_SAFETENSORS

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # fixtures/: not installed
from fixtures import write_tokenizer  # noqa: E402

Log = Callable[[str], None]

QWEN3_30B_A3B: dict = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "norm_topk_prob": True,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "hidden_act": "silu",
    "torch_dtype": "bfloat16",
    "bos_token_id": 0,  # the synthetic tokenizer's <|endoftext|>
    "eos_token_id": 0,
}
PRESETS: dict[str, dict] = {
    "qwen3-30b-a3b": QWEN3_30B_A3B,
    # A quarter of the depth and a quarter of the vocabulary: the output projection keeps the share
    # of a token's compute it has in the 48-layer model (on CPU it would otherwise dominate).
    "qwen3-30b-a3b-12l": {**QWEN3_30B_A3B, "num_hidden_layers": 12, "vocab_size": 151936 // 4},
    # Not real-shaped: small enough that generate + repack + both engines fit in seconds.
    "quick": {
        **QWEN3_30B_A3B,
        "num_hidden_layers": 2,
        "hidden_size": 512,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "moe_intermediate_size": 256,
        "num_experts": 32,
        "num_experts_per_tok": 4,
        "vocab_size": 4096,
    },
}
SPEC_FILE = "bench_spec.json"  # written last: a folder without it is incomplete
GENERATOR_VERSION = 3  # bump when the values written change: cached checkpoints are then rewritten
CHUNK_ELEMENTS = 1 << 26  # floats generated per step (256 MB of float32)
TOPICS = 64
# Calibrated on qwen3-30b-a3b-12l to the published statistics (bench/README.md, "Routing").
ROUTING = {"skew": 0.3, "topic_share": 0.7, "stickiness": 6.0}


def preset_config(name: str, **overrides) -> dict:
    return {**PRESETS[name], **{k: v for k, v in overrides.items() if v is not None}}


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
    values = None if sparse else _Values(specs, qconfig, dtype, {**ROUTING, **routing}, seed)
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
                rate = written / max(time.perf_counter() - start, 1e-9) / 1e6
                log(f"[generate] {written / 1e9:.2f}/{total / 1e9:.2f} GB ({rate:.0f} MB/s) {name}")
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


def _write_shard(path: Path, specs: list, values: _Values | None):
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


class _Values:
    """Random values by parameter name. A quantized module's weight/scales/biases come from one
    mx.quantize of random floats, kept only until all three are written."""

    def __init__(self, specs: list, qconfig: dict, dtype: mx.Dtype, routing: dict, seed: int):
        self.quant = qconfig["quantization"]
        self.dtype = dtype
        self.routing, self.seed = routing, seed
        hidden = next(shape[-1] for name, shape, _ in specs if name == "model.norm.weight")
        topic_rng = np.random.default_rng([seed, TOPICS])
        self.topics = mx.array(topic_rng.standard_normal((TOPICS, hidden)).astype(np.float32))
        self.shapes = {name: shape for name, shape, _ in specs}
        self.quantized = {
            name.rsplit(".", 1)[0] for name, _, _ in specs if name.endswith(".scales")
        }
        self.pending: dict[str, dict[str, mx.array]] = {}

    def take(self, name: str) -> mx.array:
        module, kind = name.rsplit(".", 1)
        if module not in self.quantized:  # norms: near 1
            values = 1.0 + 0.1 * self._rng(name).uniform(-1, 1, self.shapes[name])
            return mx.array(values.astype(np.float32)).astype(self.dtype)
        if module not in self.pending:
            self.pending[module] = self._quantize(module)
        parts = self.pending[module]
        array = parts.pop(kind)
        if not parts:
            del self.pending[module]
        return array

    def _quantize(self, module: str) -> dict[str, mx.array]:
        params = self.quant.get(module, self.quant)
        gs, bits = params["group_size"], params["bits"]
        packed = self.shapes[f"{module}.weight"]
        shape = (*packed[:-1], packed[-1] * 32 // bits)  # the float weight's shape
        rng = self._rng(module)
        std = 1.0 if module.endswith("embed_tokens") else 1.0 / math.sqrt(shape[-1])
        bound = math.sqrt(3) * std  # uniform(-bound, bound) has this std
        rows = None
        if module.endswith("mlp.gate"):  # the router: popular experts get a wider logit spread
            rows = mx.array(
                np.exp(self.routing["skew"] * rng.standard_normal((shape[0], 1))).astype(np.float32)
            )
        # Chunks along the leading axis (experts, or rows) keep the float32 copy small.
        step = max(1, CHUNK_ELEMENTS // math.prod(shape[1:]))
        starts = range(0, shape[0], step)
        keys = mx.random.split(mx.random.key(int(rng.integers(1 << 62))), len(starts))
        chunks = []
        for key, lo in zip(keys, starts):
            floats = mx.random.uniform(
                -bound, bound, (min(step, shape[0] - lo), *shape[1:]), key=key
            )
            if rows is not None:
                floats = floats * rows[lo : lo + floats.shape[0]]
            floats = self._topical(module, floats, lo)
            q = mx.quantize(floats.astype(self.dtype), gs, bits)
            mx.eval(q)
            chunks.append(q)
        out = [
            mx.concatenate(parts, axis=0) if len(parts) > 1 else parts[0] for parts in zip(*chunks)
        ]
        mx.eval(out)
        return dict(zip(("weight", "scales", "biases"), out))

    def _topical(self, module: str, floats: mx.array, lo: int) -> mx.array:
        """Token rows lo.. of the embedding or output projection with their topics mixed in."""
        if not module.endswith(("embed_tokens", "lm_head")):
            return floats
        topic = self.topics[mx.arange(lo, lo + floats.shape[0]) % TOPICS]
        if module.endswith("embed_tokens"):  # std 1 per entry; the topic takes its share
            share = self.routing["topic_share"]
            return math.sqrt(share) * topic + math.sqrt(1 - share) * floats
        # h . topic / hidden ~ sqrt(topic_share) for a hidden state h of the same topic
        return floats + self.routing["stickiness"] / floats.shape[-1] * topic

    def _rng(self, name: str) -> np.random.Generator:
        return np.random.default_rng([self.seed, zlib.crc32(name.encode())])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("preset", choices=sorted(PRESETS))
    ap.add_argument("out", type=Path)
    ap.add_argument("--layers", type=int, help="override num_hidden_layers")
    ap.add_argument("--vocab", type=int, help="override vocab_size (smaller: less resident memory)")
    ap.add_argument("--skew", type=float, default=ROUTING["skew"], help="expert popularity skew")
    ap.add_argument(
        "--topic-share", type=float, default=ROUTING["topic_share"], help="routing reuse (0..1)"
    )
    ap.add_argument(
        "--stickiness", type=float, default=ROUTING["stickiness"], help="topic persistence"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--dtype",
        choices=["bfloat16", "float32"],
        help="float dtype (scales, norms); default bfloat16",
    )
    ap.add_argument("--sparse", action="store_true", help="headers and sizes only, data a hole")
    args = ap.parse_args(argv)
    config = preset_config(
        args.preset, num_hidden_layers=args.layers, vocab_size=args.vocab, torch_dtype=args.dtype
    )
    write_checkpoint(
        args.out,
        config,
        routing={
            "skew": args.skew,
            "topic_share": args.topic_share,
            "stickiness": args.stickiness,
        },
        seed=args.seed,
        log=lambda m: print(m, file=sys.stderr, flush=True),
        sparse=args.sparse,
    )


if __name__ == "__main__":
    main()
