"""The repacker: a downloaded checkpoint -> the streaming layout (see streamer/io/manifest.py).

It works expert by expert: peak memory is one expert plus the resident (non-expert) weights,
which are written one tensor at a time. Output goes to a hidden `.NAME.partial` folder that is
renamed into place only when complete, so an interrupted repack never leaves a folder that looks
valid. An interruption (Ctrl-C, a full disk, a kill) keeps the finished layers there, and
`resume=True` continues from them (see progress.py). The source is only ever read.

  plan.py      what to write: the model from config.json, resident weights checked (and quantized)
  sources.py   where each expert tensor's bytes come from, per checkpoint convention
  records.py   one MoE layer's experts -> one file of fixed-size records
  progress.py  the resume sidecar
  publish.py   the partial folder: opened, checked for space, published or kept after a failure
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

from ..errors import StreamerError
from ..io.checkpoint import Checkpoint
from ..io.integrity import file_stat
from ..io.lock import lock_for_replacing
from ..io.manifest import RESIDENT_FILE, Manifest, read_manifest, write_manifest
from ..io.safetensors import write_safetensors
from . import publish
from .plan import Plan, Quantize, make_plan
from .progress import Progress, source_identity
from .records import NonfiniteWarnings, record_bytes, write_layer

__all__ = ["Quantize", "repack"]


def repack(
    src: str | Path,
    dst: str | Path,
    *,
    quantize: Quantize | None = None,
    force: bool = False,
    resume: bool = False,
    log=lambda msg: print(msg, file=sys.stderr, flush=True),
) -> Manifest:
    """Repack checkpoint folder `src` into streaming folder `dst`; return the written manifest.

    With `resume`, continue an interrupted repack into `dst` from its last finished layer.
    """
    src, dst = Path(src), Path(dst)
    partial = publish.partial_folder(dst)
    if resume and dst.exists() and not partial.exists():
        log(f"[repack] {dst} is complete: nothing to resume")
        return read_manifest(dst)
    if dst.exists() and not force:
        raise StreamerError(
            f"{dst} already exists: choose another destination or pass --force to replace it."
        )
    if dst.resolve() == src.resolve():
        raise StreamerError(f"{dst} is the source folder: choose another destination.")
    with Checkpoint(src) as ckpt:
        plan = make_plan(ckpt, quantize)
        options = {"quantize": quantize and [quantize.bits, quantize.group_size]}
        identity = source_identity(ckpt, options)
        readers = lock_for_replacing(dst) if dst.exists() else None  # refuse while a model reads
        partial_fd, progress = publish.open_partial(partial, identity, resume, log)
        try:
            needed, left = disk_needed(plan, progress)
            publish.check_free_space(partial, left)  # a refusal keeps resumable work as it is
            manifest = _write_and_publish(plan, partial, dst, progress, needed, log)
        except StreamerError:
            if not progress.started:
                shutil.rmtree(partial, ignore_errors=True)  # nothing written: leave nothing behind
            raise
        finally:
            if partial_fd is not None:
                os.close(partial_fd)
            if readers is not None:
                readers.release()
    log(
        f"[repack] done: {dst} ({manifest.expert_bytes / 1e9:.2f} GB of experts in "
        f"{len(manifest.layers)} MoE layers)"
    )
    return manifest


def disk_needed(plan: Plan, progress: Progress) -> tuple[int, int]:
    """Bytes of the whole repacked model, and of what is left to write (all unless resuming)."""
    per_layer = record_bytes(plan) * plan.num_experts
    resident = sum(a.nbytes for _, a in plan.resident_items())
    needed = per_layer * len(plan.containers) + resident
    left = per_layer * (len(plan.containers) - len(progress.layers))
    return needed, left + (resident if progress.resident is None else 0)


def _write_and_publish(
    plan: Plan, partial: Path, dst: Path, progress: Progress, needed: int, log
) -> Manifest:
    try:
        manifest = write_model(plan, partial, progress, log)
        progress.remove()
        publish.publish(partial, dst)
    except BaseException as e:
        failure = publish.failed(e, partial, progress, len(plan.containers), needed, log)
        if failure is e:
            raise
        raise failure from e
    return manifest


def write_model(plan: Plan, out: Path, progress: Progress, log) -> Manifest:
    """Write the resident file, each MoE layer not already in `progress`, the side files, the
    config and the manifest into `out`, recording progress after each file."""
    warnings = NonfiniteWarnings(log)
    total = len(plan.containers)
    log(f"[repack] {plan.folder} -> {total} MoE layers x {plan.num_experts} experts")
    if progress.resident is None:
        progress.record_resident(write_safetensors(out / RESIDENT_FILE, plan.resident_items()))
        warnings.check_file(out / RESIDENT_FILE)
    layers = []
    start = time.perf_counter()
    written = 0
    for index, module in enumerate(plan.containers):
        layer = progress.layers.get(index)
        if layer is not None:
            layers.append(layer)
            log(f"[repack] layer {index + 1}/{total} {module}: kept from the interrupted run")
            continue
        layer = write_layer(plan, out, index, module, warnings)
        progress.record_layer(index, layer)
        layers.append(layer)
        written += layer.file_bytes
        rate = written / max(time.perf_counter() - start, 1e-9) / 1e6
        log(
            f"[repack] layer {index + 1}/{total} {module}: "
            f"{layer.file_bytes / 1e6:.1f} MB ({rate:.0f} MB/s)"
        )
    warnings.summary()
    publish.copy_side_files(plan.folder, out)
    publish.write_config(out, plan.config)
    # sizes and times as written: load refuses a file changed after this point
    names = [RESIDENT_FILE, *(layer.file for layer in layers)]
    files = {name: file_stat(out / name) for name in names}
    manifest = Manifest(plan.config, progress.resident, tuple(layers), files)
    write_manifest(out, manifest)
    return manifest
