"""A repacked folder as a load's Source (source.py): its manifest, read lock, layouts, resident
file and checksums, every file checked against the manifest and the model mlx-lm builds for it."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

from ..errors import StreamerError, refusal
from ..experts.parallel import ExpertShare
from ..families.architectures import build_model, expert_containers, quantize_like_mlx_lm
from ..families.config import check_config, check_layer_count, check_repacked_config_json
from ..io.expert_files import open_repacked
from ..io.expert_layout import repacked_layout
from ..io.files import check_folder_files
from ..io.integrity import check_files
from ..io.lock import lock_for_reading
from ..io.manifest import MANIFEST_FILE, RESIDENT_FILE, Manifest, read_manifest
from ..io.safetensors import read_header
from ..io.tensor_crcs import verify_resident
from ..parallel.group import expert_shares
from .manifest_layers import check_layer, quantized
from .options import LoadOptions
from .source import Source


def open_repacked_source(folder: Path, options: LoadOptions) -> Source:
    """The folder read-locked while the model lives (`repack --force` refuses), its files
    checked, mlx-lm's model built with expert containers quantized as the manifest says; under a
    group, this rank's share of each layer (every rank's folder checked)."""
    if options.checksums is not None:  # refused as `streamer verify` refuses it, not ignored
        raise refusal(
            lambda say: (
                f"{say('checksums')} {options.checksums} is a download's sidecar, and {folder} is "
                f"a repacked folder: its checksums are in its manifest.json; leave "
                f"{say('checksums')} out."
            )
        )
    manifest = read_manifest(folder)
    lock = lock_for_reading(folder)
    try:
        model, config = _checked_model(folder, manifest)
        shares = _shares(folder, manifest, model, options.group)
    except BaseException:
        lock.release()
        raise
    resident_path = folder / RESIDENT_FILE

    def resident_weights() -> dict[str, mx.array]:
        if options.verify_reads:
            problems = verify_resident(folder, manifest)
            if problems:
                raise StreamerError(
                    f"{folder / problems[0].file}: {problems[0].what}: the file is corrupt; "
                    "repack the model."
                )
        weights = mx.load(str(resident_path))
        quantize_like_mlx_lm(model, config, weights)
        return weights

    return Source(
        folder=folder,
        contents=manifest,
        config=config,
        model=model,
        layouts=[repacked_layout(folder, i, layer) for i, layer in enumerate(manifest.layers)],
        lock=lock,
        checksums=[layer.expert_crc32 for layer in manifest.layers]
        if options.verify_reads
        else None,
        shares=shares,
        open_files=lambda: open_repacked(folder, manifest),
        resident_weights=resident_weights,
        mismatch=lambda e: f"{resident_path} does not match the model: {e}; repack the model.",
    )


def _checked_model(folder: Path, manifest: Manifest) -> tuple[nn.Module, dict]:
    """mlx-lm's model for the manifest's config, once the folder's files, the resident file's
    tensors and the MoE layers are found to be what the manifest says."""
    check_folder_files(folder, "a file of the repacked model")
    check_files(folder, manifest)
    config = check_config(manifest.config, folder / MANIFEST_FILE)
    check_repacked_config_json(folder, manifest)
    resident_path = folder / RESIDENT_FILE
    names = read_header(resident_path)  # clear errors for a truncated or corrupt file
    if set(names) != set(manifest.resident_crc32):
        raise StreamerError(
            f"{resident_path} holds other tensors than manifest.json lists; repack the model."
        )
    modules = [layer.module + "." for layer in manifest.layers]
    check_layer_count(config, [*names, *modules], folder / MANIFEST_FILE)
    model = build_model(config, folder / MANIFEST_FILE)
    containers = expert_containers(model)
    modules = [layer.module for layer in manifest.layers]
    if list(containers) != modules:
        raise StreamerError(
            f"{folder / MANIFEST_FILE} lists MoE layers {modules[:3]}... but the model has "
            f"{list(containers)[:3]}...: the manifest does not match its config; repack the model."
        )
    return model, config


def _shares(
    folder: Path, manifest: Manifest, model: nn.Module, group: mx.distributed.Group | None
) -> list[ExpertShare | None]:
    """Each expert container quantized as the manifest says and checked against its layer;
    under a group, this rank's share of each layer's experts."""
    totals = []
    for index, container in enumerate(expert_containers(model).values()):
        layer = manifest.layers[index]
        for projection, params in layer.quantization.items():
            if params:
                container[projection] = quantized(container, projection, params, folder)
        totals.append(check_layer(folder, index, layer, container))
    records = expert_shares(group, folder, manifest, totals)  # every rank's folder checked
    if records is None:
        return [None] * len(manifest.layers)
    return [
        ExpertShare(records[i], group, layer.expert_ids) for i, layer in enumerate(manifest.layers)
    ]
