"""`repack --delete-source`: each source shard goes once all of its data is written, and no sooner.

The output is byte-identical to a repack that keeps its source; the extra disk at any moment stays
near what `repack` predicts; an interruption or a failure deletes nothing more and `--resume`
finishes from the stand-ins of the deleted shards.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from repack_checks import assert_same_model, resumed_by_the_command, rewrite_at_its_size

from fixtures import tiny_config, write_hf_checkpoint
from streamer.errors import StreamerError
from streamer.plan import plan
from streamer.repack import disk_needs, repack
from streamer.repack.consume import size_text

QUIET = {"log": lambda _: None}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    """Four MoE layers over about a dozen 1 MB shards, and its repack keeping the source."""
    config = tiny_config("qwen3_moe", num_hidden_layers=4, num_experts=32)
    return write_hf_checkpoint(tmp_path_factory.mktemp("consume") / "src", config)


@pytest.fixture(scope="module")
def reference(pristine, tmp_path_factory) -> Path:
    dst = tmp_path_factory.mktemp("consume-ref") / "model"
    repack(pristine, dst, **QUIET)
    return dst


@pytest.fixture
def source(pristine, tmp_path) -> Path:
    shutil.copytree(pristine, tmp_path / "src")
    return tmp_path / "src"


def shards(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in folder.glob("*.safetensors")}


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def open_deleted_files() -> list[str]:
    """Files this process still holds open after they were deleted (their space is not free)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.endswith("(deleted)") and ".safetensors" in target:
            found.append(target)
    return found


def interrupted_at_layer_3(source: Path, dst: Path) -> None:
    """A --delete-source repack of `source` into `dst`, Ctrl-C at its third layer: some source
    shards consumed (their stand-ins in the partial folder), the rest kept."""

    def interrupt(line: str) -> None:
        if "layer 3/4" in line:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        repack(source, dst, delete_source=True, log=interrupt)


def test_each_shard_goes_once_written_and_the_disk_peak_is_as_predicted(
    source, reference, tmp_path
):
    dst, partial = tmp_path / "model", tmp_path / ".model.partial"
    sizes = shards(source)
    assert len(sizes) >= 6
    peak, lines, held_open = 0, [], []

    def watch(line: str) -> None:
        nonlocal peak
        lines.append(line)
        # disk really used: stand-ins are mostly a hole
        written = sum(p.stat().st_blocks * 512 for p in partial.rglob("*") if p.is_file())
        deleted = sum(size for name, size in sizes.items() if not (source / name).exists())
        peak = max(peak, written - deleted)
        held_open.extend(open_deleted_files())

    keep, predicted = disk_needs(source)
    assert plan(source, 1 << 30).delete_source_peak_bytes == predicted  # `streamer plan`'s
    repack(source, dst, delete_source=True, log=watch)
    assert_same_model(dst, reference)
    assert shards(source) == {} and (source / "config.json").exists()  # only shards go
    assert not (dst / "consumed").exists() and not (dst / "progress.json").exists()
    assert held_open == []  # no deleted shard stayed open: its space was really freed
    output = sum(len(b) for b in files(reference).values())
    assert abs(keep - output) < 0.05 * output  # the repacked model, less its small files
    assert (
        f"to write beside the source; with --delete-source at most {size_text(predicted)}"
        in (lines[0])
    )
    assert peak <= predicted + 0.1e6 and predicted < 0.6 * output
    assert sum(line.startswith("[repack] deleted source shard") for line in lines) == len(sizes)


def test_an_interrupted_repack_resumes_from_the_stand_ins(source, reference, tmp_path):
    dst, partial = tmp_path / "model", tmp_path / ".model.partial"

    before = shards(source)
    interrupted_at_layer_3(source, dst)
    gone = set(before) - set(shards(source))
    assert gone and set(shards(source))  # some shards consumed, the rest kept
    assert {p.name for p in (partial / "consumed").iterdir()} == gone
    for stand_in in (partial / "consumed").iterdir():  # a disk keeping times to 2 s (exFAT), a
        os.utime(stand_in, ns=(0, 10**18))  # copy: a stand-in's time is not its shard's
    with pytest.raises(StreamerError, match="only copy of .* --resume"):
        repack(source, dst, delete_source=True, **QUIET)  # starting over would lose them
    assert partial.exists()
    resumed_by_the_command(source, dst, "--delete-source")
    assert_same_model(dst, reference)
    assert shards(source) == {}


def test_resume_without_a_progress_file_keeps_the_only_copy(source, tmp_path):
    """A progress.json removed by hand made --resume start over: it removed the partial folder,
    the only copy of the deleted shards' data. Now refused, the folder kept."""
    dst, partial = tmp_path / "model", tmp_path / ".model.partial"

    interrupted_at_layer_3(source, dst)
    (partial / "progress.json").unlink()
    before = files(partial)
    with pytest.raises(
        StreamerError,
        match="no progress.json.* only copy .*delete that folder and download the model again",
    ):
        repack(source, dst, delete_source=True, resume=True, **QUIET)
    assert files(partial) == before
    # damaged, it said to start over without --resume, which the stand-ins refuse: a circle
    (partial / "progress.json").write_text("{")
    before = files(partial)
    with pytest.raises(StreamerError, match="damaged.* only copy .*cannot start over: rerun"):
        repack(source, dst, delete_source=True, resume=True, **QUIET)
    assert files(partial) == before


def test_a_kept_shard_rewritten_at_its_size_is_refused_naming_it(source, tmp_path):
    """A new revision of a shard not yet deleted, at its size: resuming would mix revisions, and
    starting over cannot (the deleted shards' only copy is the partial folder): restore it."""
    dst, partial = tmp_path / "model", tmp_path / ".model.partial"

    interrupted_at_layer_3(source, dst)
    shard = sorted(source.glob("*.safetensors"))[-1]
    rewrite_at_its_size(shard)
    before = files(partial)
    with pytest.raises(
        StreamerError,
        match=f"cannot resume \\(source file {shard.name} changed since it started\\) .*only "
        "copy .*restore that file as it was; else delete that folder and download the model "
        "again",
    ):
        repack(source, dst, delete_source=True, resume=True, **QUIET)
    assert files(partial) == before


def test_a_failure_deletes_nothing_more_and_keeps_what_was_deleted(source, tmp_path, monkeypatch):
    from streamer.repack.sources import Sources

    real = Sources.read

    def broken(self, module, *args, **kwargs):
        if module.startswith("model.layers.2."):
            raise StreamerError("tensor damaged (test)")
        return real(self, module, *args, **kwargs)

    monkeypatch.setattr(Sources, "read", broken)
    before = shards(source)
    with pytest.raises(StreamerError, match="damaged"):
        repack(source, tmp_path / "model", delete_source=True, **QUIET)
    left = shards(source)
    partial = tmp_path / ".model.partial"
    assert set(before) - set(left) == {p.name for p in (partial / "consumed").iterdir()}
    assert (partial / "experts" / "001.bin").exists()  # the deleted shards' data
    # every shard holding layer 2 or 3 is still there
    from streamer.io.checkpoint import Checkpoint

    with Checkpoint(source, {p.name: p for p in (partial / "consumed").iterdir()}) as ckpt:
        needed = {
            info.path.name
            for name, info in ckpt.tensors.items()
            if name.startswith(("model.layers.2.", "model.layers.3."))
        }
    assert needed <= set(left)


def test_linked_shards_are_refused_before_anything_is_deleted(source, tmp_path):
    blob = tmp_path / "blob"
    shard = sorted(source.glob("*.safetensors"))[0]
    shard.rename(blob)
    shard.symlink_to(blob)
    before = shards(source)
    with pytest.raises(StreamerError, match="is a link.*free no space"):
        repack(source, tmp_path / "model", delete_source=True, **QUIET)
    assert shards(source) == before and not (tmp_path / ".model.partial").exists()
