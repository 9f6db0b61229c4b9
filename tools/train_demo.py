"""Train the tiny qwen3_moe shipped as `streamer demo`'s built-in model.

Trains on the Python standard library's own source (present on every machine), on the CPU, with
mlx-lm's `qwen3_moe.Model` so the result loads in mlx-lm unchanged. Writes a Hugging Face
checkpoint: config.json, model.safetensors with per-expert tensor names, tokenizer files.

Reproduce the shipped model (the defaults: 300 steps of 16x128 tokens; its training time on one
machine is in bench/findings.md):

    python tools/train_demo.py --out streamer/demo_model

Quick check that the loss falls (a few minutes):

    python tools/train_demo.py --out /tmp/demo --steps 40

A draft model for speculative decoding beside the demo model (its tokenizer, a smaller shape; the
one bench/speculative.py measures):

    python tools/train_demo.py --out /tmp/draft --tokenizer streamer/demo_model/tokenizer.json \
        --layers 1 --hidden 64 --experts 8 --top-k 2 --steps 150
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from balance_loss import install_recording_gates, loss_fn
from demo_corpus import corpus_files, read_texts
from mlx.utils import tree_flatten
from mlx_lm.models import qwen3_moe

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # fixtures/: not installed
from fixtures import EOS, train_bpe, write_tokenizer_config  # noqa: E402

CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "vocab_size": 2048,
    "hidden_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "intermediate_size": 256,  # unused: every layer is MoE (decoder_sparse_step 1)
    "moe_intermediate_size": 48,
    "num_experts": 32,
    "num_experts_per_tok": 4,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "norm_topk_prob": True,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
    "bos_token_id": 0,
    "eos_token_id": 0,
    "torch_dtype": "bfloat16",
}


def encode(tokenizer, texts: list[str]) -> np.ndarray:
    """All texts as one token stream, documents separated by EOS."""
    eos = tokenizer.token_to_id(EOS)
    ids = []
    for enc in tokenizer.encode_batch(texts):
        ids.extend(enc.ids)
        ids.append(eos)
    return np.array(ids, dtype=np.int32)


def batches(tokens: np.ndarray, batch: int, seq: int, rng: np.random.Generator):
    while True:
        starts = rng.integers(0, len(tokens) - seq - 1, size=batch)
        chunk = np.stack([tokens[s : s + seq + 1] for s in starts])
        yield mx.array(chunk[:, :-1]), mx.array(chunk[:, 1:])


def validation_loss(
    model: nn.Module, tokens: np.ndarray, seq: int, max_tokens: int = 60_000
) -> float:
    """Mean next-token cross entropy (nats) over contiguous held-out windows."""
    n = min(len(tokens) - 1, max_tokens) // seq
    total = 0.0
    for i in range(0, n, 16):
        rows = np.stack([tokens[j * seq : j * seq + seq + 1] for j in range(i, min(i + 16, n))])
        logits = model(mx.array(rows[:, :-1]))
        loss = nn.losses.cross_entropy(logits, mx.array(rows[:, 1:]), reduction="sum")
        total += loss.item()
    return total / (n * seq)


def hf_weights(model: nn.Module, dtype: mx.Dtype) -> dict[str, mx.array]:
    """mlx-lm parameter names -> Hugging Face names, un-stacking switch_mlp into per-expert
    tensors."""
    out = {}
    for name, w in tree_flatten(model.parameters()):
        if ".switch_mlp." not in name:
            out[name] = w.astype(dtype)
            continue
        parent, rest = name.split(".switch_mlp.")
        for e in range(w.shape[0]):
            out[f"{parent}.experts.{e}.{rest}"] = w[e].astype(dtype)
    return out


def save(model: nn.Module, tokenizer, config: dict, out: Path, val_loss: float) -> None:
    out.mkdir(parents=True, exist_ok=True)
    weights = hf_weights(model, mx.bfloat16)
    mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tokenizer.save(str(out / "tokenizer.json"))
    write_tokenizer_config(out, config["max_position_embeddings"])
    (out / "generation_config.json").write_text(
        json.dumps({"eos_token_id": config["eos_token_id"]}) + "\n"
    )
    print(f"saved {out} (validation loss {val_loss:.3f} nats/token)")


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="stop early after this much training time (the run is then not reproducible)",
    )
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--aux-weight", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer", type=Path, help="a tokenizer.json to use, not one trained")
    ap.add_argument("--layers", type=int, default=CONFIG["num_hidden_layers"])
    ap.add_argument("--hidden", type=int, default=CONFIG["hidden_size"])
    ap.add_argument("--experts", type=int, default=CONFIG["num_experts"])
    ap.add_argument("--top-k", type=int, default=CONFIG["num_experts_per_tok"])
    args = ap.parse_args()

    mx.random.seed(args.seed)
    rng = np.random.default_rng(args.seed)
    train_files, val_files = corpus_files()
    t0 = time.time()
    train_texts = read_texts(train_files)
    if args.tokenizer:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(args.tokenizer))
    else:
        tokenizer = train_bpe(train_texts, CONFIG["vocab_size"])
    train_tokens = encode(tokenizer, train_texts)
    val_tokens = encode(tokenizer, read_texts(val_files))
    print(
        f"corpus: {len(train_files)} train / {len(val_files)} held-out stdlib files, "
        f"{len(train_tokens):,} / {len(val_tokens):,} tokens "
        f"({time.time() - t0:.0f}s incl. tokenizer)"
    )

    config = dict(
        CONFIG,
        eos_token_id=tokenizer.token_to_id(EOS),
        bos_token_id=tokenizer.token_to_id(EOS),
        num_hidden_layers=args.layers,
        hidden_size=args.hidden,
        num_experts=args.experts,
        num_experts_per_tok=args.top_k,
    )
    model = qwen3_moe.Model(qwen3_moe.ModelArgs.from_dict(config))
    install_recording_gates(model)
    mx.eval(model.parameters())
    n_params = sum(v.size for _, v in tree_flatten(model.parameters()))
    print(f"model: {n_params / 1e6:.2f}M parameters")

    warmup = max(1, args.steps // 20)
    schedule = optim.join_schedules(
        [
            optim.linear_schedule(1e-5, args.lr, warmup),
            optim.cosine_decay(args.lr, args.steps - warmup, args.lr / 10),
        ],
        [warmup],
    )
    optimizer = optim.AdamW(learning_rate=schedule, weight_decay=0.01)
    step_fn = nn.value_and_grad(model, loss_fn)

    data = batches(train_tokens, args.batch, args.seq, rng)
    t0 = time.time()
    for step in range(1, args.steps + 1):
        x, y = next(data)
        (loss, ce), grads = step_fn(model, x, y, args.aux_weight)
        grads, _ = optim.clip_grad_norm(grads, 1.0)
        optimizer.update(model, grads)
        mx.eval(model.parameters(), optimizer.state, loss, ce)
        if step % 25 == 0 or step == 1:
            print(
                f"step {step:5d}  train ce {ce.item():.3f}  total {loss.item():.3f}  "
                f"{time.time() - t0:.0f}s",
                flush=True,
            )
        if args.max_minutes and time.time() - t0 > 60 * args.max_minutes:
            print(f"stopping early at step {step} (--max-minutes {args.max_minutes})")
            break
    train_time = time.time() - t0

    val = validation_loss(model, val_tokens, args.seq)
    print(
        f"training time {train_time / 60:.1f} min for {step} steps of {args.batch}x{args.seq} "
        f"tokens; validation loss {val:.3f} nats/token "
        f"(perplexity {math.exp(val):.1f})"
    )
    save(model, tokenizer, config, args.out, val)


if __name__ == "__main__":
    main()
