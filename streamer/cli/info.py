"""`streamer info`: what a repacked model or a download holds, and what a token reads."""

from __future__ import annotations

import argparse
from collections import Counter

from ..errors import StreamerError
from ..io.sizes import size_text
from .output import emit


def add_parser(sub) -> None:
    p = sub.add_parser("info", help="describe a repacked model or an MLX download")
    p.add_argument(
        "dir",
        metavar="DIR",
        help="a repacked folder, an MLX download, or org/name (pulled, or the hub cache)",
    )
    p.set_defaults(run=info)


def info(args: argparse.Namespace) -> None:
    from ..io.integrity import check_files
    from ..io.manifest import MANIFEST_FILE, RESIDENT_FILE, read_manifest
    from ..loading.hub import model_path, needs_repack

    folder = model_path(args.dir)
    if needs_repack(folder):
        raise StreamerError(
            f"{args.dir} is a checkpoint as downloaded, not MLX-quantized, which info does not "
            f"describe: `streamer plan {args.dir}` does, with what its repack holds (`streamer "
            f"repack {args.dir} DST --quantize 4`)."
        )
    if not (folder / MANIFEST_FILE).exists() and (folder / "config.json").exists():
        from ..loading.download_folder import (
            open_download,  # builds mlx-lm's model: only for a download
        )

        # streamed in place: an expert is one range per stacked tensor
        manifest = open_download(folder)[0]
        resident = sum(manifest.file_bytes.values()) - manifest.expert_file_bytes
        per_expert = [layer.payload_bytes for layer in manifest.layers]
        layout = f"in place, {len(manifest.layers[0].tensors)} byte ranges per expert"
    else:
        from ..families.config import check_sizes

        manifest = read_manifest(folder)
        check_files(folder, manifest)  # a missing, truncated or special data file is named
        check_sizes(manifest.config, folder / MANIFEST_FILE)  # as plan: null top-k said 0
        resident = (folder / RESIDENT_FILE).stat().st_size
        per_expert = [layer.record_bytes for layer in manifest.layers]
        layout = "repacked, one record per expert"
    try:
        lines = _describe(manifest, layout, resident, per_expert)
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as e:
        raise StreamerError(
            f"{folder / MANIFEST_FILE}: the model config in it is damaged ({type(e).__name__}: "
            f"{e}); repack the model."
        ) from e
    for line in lines:
        emit(line)


def _describe(manifest, layout: str, resident: int, per_expert: list[int]) -> list[str]:
    from ..families.config import experts_per_token

    config = manifest.config
    layers = manifest.layers
    top_k = experts_per_token(config)
    active = sum(per_expert) * top_k
    return [
        f"layout            {layout}",
        f"model_type        {config.get('model_type')}",
        f"layers            {config.get('num_hidden_layers')} ({len(layers)} MoE)",
        f"experts           {layers[0].num_experts} per layer, {top_k} routed per token",
        *_shard_lines(manifest),
        f"quantization      {_model_quantization(config.get('quantization'))}",
        f"expert weights    {_expert_weights(layers)}",
        # as stored: the compute dtype's (plan's) may be wider, float32 on the CPU
        f"resident bytes    {size_text(resident)} (non-expert weights as stored; "
        "in the compute dtype: `streamer plan`)",
        # where experts live is the budget's choice, made at load: info reads no memory figures
        f"expert bytes      {size_text(manifest.expert_file_bytes)} (kept in memory or streamed "
        "from disk, as --memory-budget decides; what its default does here: `streamer plan`)",
        f"active per token  {size_text(active)} of experts ({top_k} x {len(layers)} layers)",
    ]


def _shard_lines(manifest) -> list[str]:
    shard = getattr(manifest, "shard", None)  # a download is never a shard
    if shard is None:
        return []
    return [
        f"shard             {shard.rank}/{shard.ranks} ({shard.assignment}): "
        f"{manifest.layers[0].num_experts} experts per layer here, the rest on the other ranks"
    ]


def _expert_weights(layers) -> str:
    """How the expert projections are stored; where they differ, which are stored how (a width
    the group size does not divide stays unquantized): "gate_proj, up_proj: 4-bit affine, group
    64; down_proj: unquantized (bfloat16)"."""
    from ..io.safetensors import DTYPES

    kinds: dict[str, list[str]] = {}
    for layer in layers:
        dtypes = {t.name: t.dtype for t in layer.tensors}
        for projection, params in layer.quantization.items():
            weight = dtypes.get(f"{projection}.weight")
            stored = f" ({DTYPES[weight][1]})" if weight in DTYPES else ""
            kind = _describe_quantization(params) if params else f"unquantized{stored}"
            names = kinds.setdefault(kind.replace("mlx.core.", ""), [])
            names += [] if projection in names else [projection]
    if len(kinds) == 1:
        return next(iter(kinds))
    return "; ".join(f"{', '.join(names)}: {kind}" for kind, names in kinds.items())


def _model_quantization(quant: dict | None) -> str:
    """The config's quantization: its default, then the modules it names their own (gpt-oss's
    --quantize: MXFP4 by default for the experts, its other layers affine 4-bit and its router
    8-bit), counted: "4-bit mxfp4, group 32; by module: 4-bit affine, group 64 (10), ..."."""
    if not quant:
        return "none"
    named = Counter(
        _describe_quantization(params) if isinstance(params, dict) else "unquantized"
        for params in quant.values()
        if isinstance(params, dict) or params is False
    )
    by_module = ", ".join(f"{kind} ({count})" for kind, count in named.items())
    return _describe_quantization(quant) + (f"; by module: {by_module}" if named else "")


def _describe_quantization(params: dict) -> str:
    return f"{params['bits']}-bit {params.get('mode', 'affine')}, group {params['group_size']}"
