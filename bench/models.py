"""The benchmark's two model folders: a generated MLX checkpoint (mlx-lm's) and its repack
(streamer's), made on first use and reused while their spec matches."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from balloon import GiB
from engines import log
from generate_checkpoint import checkpoint_spec, read_spec, write_checkpoint
from presets import preset_config


class Models:
    """The MLX checkpoint (for mlx-lm) and its repacked folder (for streamer), plus their sizes."""

    def __init__(self, name: str, mlx: Path, streaming: Path):
        from streamer.io.manifest import RESIDENT_FILE, read_manifest

        self.name, self.mlx, self.streaming = name, mlx, streaming
        manifest = read_manifest(streaming)
        config = manifest.config
        self.expert_files = [streaming / layer.file for layer in manifest.layers]
        self.checkpoint_files = sorted(mlx.glob("model*.safetensors"))
        self.moe_layers = len(manifest.layers)
        self.record_bytes = manifest.layers[0].record_bytes
        self.info = {
            "name": name,
            "model_type": config["model_type"],
            "layers": config["num_hidden_layers"],
            "moe_layers": self.moe_layers,
            "num_experts": manifest.layers[0].num_experts,
            "top_k": config["num_experts_per_tok"],
            "hidden_size": config["hidden_size"],
            "moe_intermediate_size": config.get("moe_intermediate_size"),
            "vocab_size": config["vocab_size"],
            "quantization": {
                k: v for k, v in config["quantization"].items() if not isinstance(v, dict)
            },
            "record_bytes": self.record_bytes,
            "expert_bytes": manifest.expert_file_bytes,
            "resident_bytes": (streaming / RESIDENT_FILE).stat().st_size,
            "checkpoint_bytes": sum(p.stat().st_size for p in self.checkpoint_files),
            "active_expert_bytes_per_token": self.record_bytes
            * config["num_experts_per_tok"]
            * self.moe_layers,
            "routing": "synthetic (random weights; skew via router rows, reuse via topics)",
            "routing_params": read_spec(mlx)["routing"],
        }

    @property
    def streamer_need(self) -> int:
        """Memory a streamer run needs besides the page cache: resident weights (scales widen to
        float32) and working buffers. An estimate, used to refuse balloons that would starve it."""
        return 2 * self.info["resident_bytes"] + GiB

    @property
    def baseline_need(self) -> int:
        """mlx-lm holds the whole checkpoint, scales and biases widened to float32."""
        return int(1.25 * self.info["checkpoint_bytes"]) + GiB


def ensure_models(
    preset: str,
    data: Path,
    *,
    layers: int | None,
    vocab: int | None,
    routing: dict,
    seed: int,
    dtype: str | None = None,
) -> Models:
    from streamer.repack import repack

    config = preset_config(preset, num_hidden_layers=layers, vocab_size=vocab, torch_dtype=dtype)
    spec = checkpoint_spec(config, routing=routing, seed=seed)
    tag = hashlib.sha1(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:8]
    name = (
        preset
        + (f"-L{layers}" if layers else "")
        + (f"-v{vocab}" if vocab else "")
        + (f"-{dtype}" if dtype else "")
    )
    mlx, streaming = data / f"{name}-{tag}-mlx", data / f"{name}-{tag}-streaming"
    if read_spec(mlx) != spec:
        log(f"[bench] generating {mlx}")
        write_checkpoint(mlx, config, routing=routing, seed=seed, log=log)
    if (
        read_spec(streaming) != spec
    ):  # the repacker carries bench_spec.json over, and publishes atomically
        log(f"[bench] repacking into {streaming}")
        repack(mlx, streaming, force=True, log=log)
    return Models(name, mlx, streaming)
