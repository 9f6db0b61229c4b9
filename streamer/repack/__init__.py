"""The repacker: a downloaded checkpoint -> the streaming layout (see streamer/io/manifest/).

It works expert by expert: peak memory is one expert plus the resident (non-expert) weights,
which are written one tensor at a time. Output goes to a hidden `.NAME.partial` folder that is
renamed into place only when complete, so an interrupted repack never leaves a folder that looks
valid. An interruption (Ctrl-C, a full disk, a kill) keeps the finished layers there, and
`resume=True` continues from them (see resume_sidecar.py). The source is only ever read.

  recipe.py    what to write: the model from config.json, resident weights checked (and quantized)
  sources.py   where each expert tensor's bytes come from, per checkpoint convention
  records.py   one MoE layer's experts -> one file of fixed-size records
  resume_sidecar.py  the resume sidecar
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
from ..io.sizes import rate_text, size_text
from ..progress import above, progress_bar
from . import consume, publish
from .recipe import Quantize, Recipe, make_recipe
from .records import NonfiniteWarnings, layer_bytes, write_layer, write_resident
from .resume_sidecar import SIDECAR_FILE, ResumeSidecar, SourceIdentity, source_identity

__all__ = ["Quantize", "disk_needs", "recipe_disk_needs", "repack"]


def disk_needs(src: str | Path, quantize: Quantize | None = None) -> tuple[int, int]:
    """The most disk a repack of `src` takes beyond the source at any moment: keeping the source
    (the whole repacked model) and with --delete-source (for `streamer plan`)."""
    with Checkpoint(src) as ckpt:
        return recipe_disk_needs(make_recipe(ckpt, quantize))


def recipe_disk_needs(recipe: Recipe) -> tuple[int, int]:
    """disk_needs of a recipe made already (records sized from the tensor headers: no data is
    read): `streamer plan` plans a download once, for its sizes and for these."""
    sidecar = ResumeSidecar(recipe.folder, SourceIdentity(""))  # nothing done yet; never saved
    return consume.disk_peaks(recipe, sidecar, *layer_and_resident_bytes(recipe, sidecar))


def repack(
    src: str | Path,
    dst: str | Path,
    *,
    quantize: Quantize | None = None,
    force: bool = False,
    resume: bool = False,
    delete_source: bool = False,
    log=lambda msg: print(msg, file=sys.stderr, flush=True),
) -> Manifest:
    """Repack checkpoint folder `src` into streaming folder `dst`; return the written manifest.

    With `resume`, continue an interrupted repack into `dst` from its last finished layer.
    With `delete_source`, delete each source shard once all of its data is written (consume.py).
    """
    src, dst = Path(src), Path(dst)
    publish.check_name_lengths(dst)
    partial = publish.partial_folder(dst)
    if resume and publish.is_streamer_output(dst) and not partial.exists():
        log(f"[repack] {dst} is complete: nothing to resume")
        return read_manifest(dst)
    publish.check_destination(src, dst, force)
    with Checkpoint(src, _consumed(partial, resume)) as ckpt:
        recipe = make_recipe(ckpt, quantize)
        publish.warn_without_tokenizer(src, log)
        identity = source_identity(ckpt, _identity_options(quantize))
        readers = lock_for_replacing(dst) if dst.exists() else None  # refuse while a model reads
        consumer = None
        try:
            if delete_source:
                consumer = consume.SourceConsumer(ckpt, recipe, partial, log)
            partial_fd, sidecar = publish.open_partial(partial, identity, resume, log)
        except BaseException:
            _release(readers, consumer)
            raise
        try:
            needed = _check_disk(recipe, sidecar, src, partial, consumer, log)
            manifest = _write_and_publish(
                recipe, partial, dst, sidecar, needed, consumer, log, force
            )
        except StreamerError:
            if not sidecar.started and not consume.stand_ins(partial):
                shutil.rmtree(partial, ignore_errors=True)  # nothing written: leave nothing behind
            raise
        finally:
            if partial_fd is not None:
                os.close(partial_fd)
            _release(readers, consumer)
    log(
        f"[repack] done: {dst} ({size_text(manifest.expert_file_bytes)} of experts in "
        f"{len(manifest.layers)} MoE layers)"
    )
    return manifest


def _consumed(partial: Path, resume: bool) -> dict:
    """The source shards --delete-source already deleted into `partial` (their stand-ins),
    refused unless resuming: the partial folder holds their only copy."""
    consumed = consume.stand_ins(partial) if partial.exists() else {}
    if consumed and not resume:
        raise StreamerError(
            f"{partial} holds the only copy of {len(consumed)} source shard(s) deleted by "
            "--delete-source: run the same command with --resume to finish it."
        )
    return consumed


def _identity_options(quantize: Quantize | None) -> dict:
    """The options that decide the repacked bytes, for the resume sidecar's identity."""
    options = {"quantize": quantize and [quantize.bits, quantize.group_size]}
    if quantize and quantize.mode != "affine":  # affine as before: its sidecar resumes
        options["mode"] = quantize.mode
    return options


def _check_disk(
    recipe: Recipe, sidecar: ResumeSidecar, src: Path, partial: Path, consumer, log
) -> int:
    """Say what the repack will write and its peak with --delete-source, and refuse it if the
    disk cannot hold what is left to write (a refusal keeps resumable work as it is). Returns
    the bytes the whole repack needs."""
    needed, left = disk_needed(recipe, sidecar)
    keep, peak = consume.disk_peaks(recipe, sidecar, *layer_and_resident_bytes(recipe, sidecar))
    log(
        f"[repack] disk: {size_text(keep)} to write beside the source; with "
        f"--delete-source at most {size_text(peak)} more at any moment"
        + (" (deleting as it goes)" if consumer is not None else "")
    )
    if consumer is not None and _same_disk(src, partial):
        left = min(left, peak)
    publish.check_free_space(partial, left)
    return needed


def _release(*held) -> None:
    """Release the destination's read lock and the source consumer, those that are held."""
    for each in held:
        if each is not None:
            each.release()


def layer_and_resident_bytes(recipe: Recipe, sidecar: ResumeSidecar) -> tuple[list[int], int]:
    """Bytes of each MoE layer's expert file and of the resident file, as they will be written
    (a layer already written as it was)."""
    done = sidecar.layers  # an index out of range (a tampered sidecar) is dropped once verified
    sized = [
        done[index].file_bytes if index in done else size
        for index, size in enumerate(layer_bytes(recipe))
    ]
    return sized, sum(a.nbytes for _, a in recipe.resident_items())


def disk_needed(recipe: Recipe, sidecar: ResumeSidecar) -> tuple[int, int]:
    """Bytes of the whole repacked model, and of what is left to write (all unless resuming)."""
    per_layer, resident = layer_and_resident_bytes(recipe, sidecar)
    left = sum(size for i, size in enumerate(per_layer) if i not in sidecar.layers)
    return sum(per_layer) + resident, left + (resident if sidecar.resident is None else 0)


def _same_disk(src: Path, partial: Path) -> bool:
    return os.stat(src).st_dev == os.stat(partial).st_dev


def _write_and_publish(
    recipe: Recipe,
    partial: Path,
    dst: Path,
    sidecar: ResumeSidecar,
    needed: int,
    consumer: consume.SourceConsumer | None,
    log,
    replace: bool,
) -> Manifest:
    try:
        collect = consumer.collect if consumer is not None else lambda _: None
        manifest = write_model(recipe, partial, sidecar, log, collect)
        publish.publish(partial, dst, replace=replace)
        # the sidecar and stand-ins go only once published: until then they are all there is
        # of the source shards already deleted
        (dst / SIDECAR_FILE).unlink(missing_ok=True)
        shutil.rmtree(dst / consume.CONSUMED, ignore_errors=True)
    except BaseException as e:
        failure = publish.failed(e, partial, sidecar, len(recipe.containers), needed, log)
        if failure is e:
            raise
        raise failure from e
    return manifest


def write_model(
    recipe: Recipe, out: Path, sidecar: ResumeSidecar, log, collect=lambda _: None
) -> Manifest:
    """Write the resident file, each MoE layer not already in `sidecar`, the side files, the
    config and the manifest into `out`, recording progress after each file (then `collect`
    deletes the source shards that no longer hold anything left to write)."""
    warnings = NonfiniteWarnings(log)
    total = len(recipe.containers)
    log(f"[repack] {recipe.folder} -> {total} MoE layers x {recipe.num_experts} experts")
    sidecar.keep_verified(recipe, log)  # a resumed run publishes only what it has checked
    if sidecar.resident is None:
        if recipe.sources.ckpt.stand_ins:  # their data would be read as zeros: never write it
            raise StreamerError(
                f"{out / RESIDENT_FILE} is missing but source shards it needs were deleted by "
                "--delete-source: the repack cannot finish; download the model again."
            )
        items = recipe.resident_items()
        with progress_bar(sum(a.nbytes for _, a in items), "[repack] resident", "B") as bar:
            try:
                crcs = write_resident(recipe, items, out / RESIDENT_FILE, bar.update)
            except RuntimeError:  # MLX's read of a shard cut short under it
                recipe.sources.ckpt.check_unchanged()
                raise
            sidecar.record_resident(crcs)
        warnings.check_file(out / RESIDENT_FILE)
    collect(sidecar)
    layers = []
    start = time.perf_counter()
    written = 0
    left = (total - len(sidecar.layers)) * recipe.num_experts
    with progress_bar(left, "[repack] experts", "expert") as bar:
        log = above(bar, log)
        for index, module in enumerate(recipe.containers):
            layer = sidecar.layers.get(index)
            if layer is not None:
                layers.append(layer)
                log(f"[repack] layer {index + 1}/{total} {module}: kept from the interrupted run")
                continue
            layer = write_layer(recipe, out, index, module, warnings, lambda: bar.update(1))
            sidecar.record_layer(index, layer)
            collect(sidecar)
            layers.append(layer)
            written += layer.file_bytes
            rate = rate_text(written, time.perf_counter() - start)
            size = size_text(layer.file_bytes)
            log(f"[repack] layer {index + 1}/{total} {module}: {size} ({rate})")
    warnings.summary()
    recipe.sources.ckpt.check_unchanged()  # what was read is one version of each shard
    publish.copy_side_files(recipe.folder, out)
    publish.write_config(out, recipe.config)
    # sizes and times as written: load refuses a file changed after this point
    names = [RESIDENT_FILE, *(layer.file for layer in layers)]
    files = {name: file_stat(out / name) for name in names}
    manifest = Manifest(recipe.config, sidecar.resident, tuple(layers), files)
    write_manifest(out, manifest)
    return manifest
