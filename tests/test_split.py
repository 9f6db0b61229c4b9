"""`streamer split`: each rank's shard holds the resident weights and only its experts' records,
byte for byte; the shares are balanced; bad input is refused with nothing written."""

from __future__ import annotations

import shutil
import zipfile

import numpy as np
import pytest
from hostile_files import edited_copy, flip_byte

import streamer
from streamer.cli import main
from streamer.errors import StreamerError
from streamer.io.manifest import read_manifest
from streamer.parallel.shards import balanced, interleaved
from streamer.parallel.split import split
from streamer.repack import repack
from streamer.verify import verify


@pytest.fixture(scope="module")
def full(checkpoints):
    return checkpoints.repacked(checkpoints.mlx("qwen3_moe"))


@pytest.fixture(scope="module")
def shards(full, tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    for rank in range(2):
        split(full, root / f"shard{rank}", rank, 2, log=lambda _: None)
    return [root / f"shard{rank}" for rank in range(2)]


def test_shards_hold_each_expert_once_byte_for_byte(full, shards):
    source = read_manifest(full)
    manifests = [read_manifest(s) for s in shards]
    for rank, (folder, manifest) in enumerate(zip(shards, manifests)):
        assert (manifest.shard.rank, manifest.shard.ranks) == (rank, 2)
        assert manifest.model_identity == source.model_identity
        assert (folder / "resident.safetensors").read_bytes() == (
            full / "resident.safetensors"
        ).read_bytes()
        assert verify(folder, log=lambda _: None) == []
    for index, layer in enumerate(source.layers):
        ids = [m.layers[index].expert_ids for m in manifests]
        assert sorted(ids[0] + ids[1]) == list(range(layer.num_experts))
        assert list(ids[1]) == list(range(1, layer.num_experts, 2))  # interleaved
        data = (full / layer.file).read_bytes()
        for folder, expert_ids in zip(shards, ids):
            shard_data = (folder / layer.file).read_bytes()
            for record, expert in enumerate(expert_ids):
                size = layer.record_bytes
                assert (
                    shard_data[record * size : (record + 1) * size]
                    == data[expert * size : (expert + 1) * size]
                )


def test_a_shard_alone_is_refused_naming_the_ranks(shards):
    with pytest.raises(
        StreamerError, match=r"holds only shard 1/2 .* run it on 2 ranks with `streamer launch`"
    ):
        streamer.load(shards[1])


def test_info_describes_a_shard(shards, capsys):
    assert main(["info", str(shards[0])]) == 0
    out = capsys.readouterr().out
    assert (
        "shard             0/2 (interleaved): 8 experts per layer here, the rest on the other ranks"
        in out
    )


def test_trace_balances_traffic(full, tmp_path):
    rng = np.random.default_rng(0)
    layers = len(read_manifest(full).layers)
    popular = rng.zipf(1.5, size=(4000, layers, 4)) % 16  # skewed: a few experts take most slots
    np.savez(tmp_path / "trace.npz", experts=popular)
    manifest = split(full, tmp_path / "s0", 0, 2, trace=tmp_path / "trace.npz", log=lambda _: None)
    assert manifest.shard.assignment == "trace"
    for index in range(layers):
        counts = np.bincount(popular[:, index].ravel(), minlength=16)
        mine = counts[list(manifest.layers[index].expert_ids)].sum()
        # balanced far better than interleaving would, with 8 experts on each rank
        interleaved_share = counts[interleaved(16, 2) == 0].sum()
        assert abs(mine - counts.sum() / 2) <= abs(interleaved_share - counts.sum() / 2)
        assert len(manifest.layers[index].expert_ids) == 8


def test_balanced_gives_equal_counts_and_spreads_hot_experts():
    owner = balanced(np.array([100, 90, 5, 4, 3, 2, 1, 0]), 2)
    assert np.bincount(owner).tolist() == [4, 4]
    assert owner[0] != owner[1]


def test_bad_input_is_refused_and_nothing_written(full, shards, tmp_path, capsys):
    dst = tmp_path / "out"
    with pytest.raises(StreamerError, match="already shard 0/2: split the full"):
        split(shards[0], dst, 0, 2)
    with pytest.raises(StreamerError, match="cannot share 16 experts per layer among 17 ranks"):
        split(full, dst, 0, 17)
    # a shard 0/1 was written, then refused wherever loaded ("run it on 1 ranks with ...")
    with pytest.raises(
        StreamerError, match="among 1 ranks: use 2 to 16 ranks \\(for one, load the"
    ):
        split(full, dst, 0, 1)
    np.savez(tmp_path / "other.npz", experts=np.zeros((3, 9, 4), dtype=np.int64))
    with pytest.raises(StreamerError, match="expected integer \\[tokens, 2, top_k\\]"):
        split(full, dst, 0, 2, trace=tmp_path / "other.npz")
    assert main(["split", str(full), str(dst), "--shard", "2/2"]) == 2
    assert "--shard '2/2': give RANK/RANKS with 0 <= RANK < RANKS" in capsys.readouterr().err
    assert not dst.exists() and not list(tmp_path.glob(".out*"))


def test_a_damaged_source_record_is_refused(full, tmp_path):
    damaged = tmp_path / "damaged"
    shutil.copytree(full, damaged)
    layer = read_manifest(damaged).layers[1]
    flip_byte(damaged / layer.file, 5 * layer.record_bytes + 100)  # expert 5, same size and time
    with pytest.raises(
        StreamerError, match="MoE layer 1 .* expert 5: tensor .* does not match its checksum"
    ):
        split(damaged, tmp_path / "out", 1, 2)
    assert not (tmp_path / "out").exists() and not (tmp_path / ".out.partial").exists()


def test_hand_edited_shard_manifests_are_refused(shards, tmp_path):
    edits = [
        (lambda m: m["shard"].update(rank=2), "invalid shard entry"),
        (lambda m: m["moe_layers"][0].pop("expert_ids"), "lacks its expert_ids"),
        (lambda m: m["moe_layers"][0]["expert_ids"].reverse(), "in increasing order"),
        (lambda m: m.pop("shard"), "expert_ids without a shard entry"),
    ]
    for number, (edit, message) in enumerate(edits):
        folder = edited_copy(shards[0], tmp_path / f"edited{number}", edit)
        with pytest.raises(StreamerError, match=message):
            read_manifest(folder)


def test_hostile_traces_are_refused_before_numpy_reads_them(full, tmp_path):
    layers = len(read_manifest(full).layers)
    header = {"descr": "<i8", "fortran_order": False, "shape": (10**14, layers, 4)}
    with zipfile.ZipFile(tmp_path / "huge.npz", "w") as archive:  # 10^14 ids declared, 8 held
        with archive.open("experts.npy", "w") as npy:
            np.lib.format.write_array_header_1_0(npy, header)
            npy.write(bytes(8))
    (tmp_path / "random.npz").write_bytes(np.random.default_rng(0).bytes(4096))
    np.savez(tmp_path / "none.npz", routed=np.zeros((3, layers, 4), dtype=np.int64))
    for name, message in [
        ("huge", r"declares 800000000000000 routed ids, more than its \d+ bytes hold"),
        ("random", r"random.npz \(not an .npz archive, a zip of .npy arrays\)"),
        ("none", "none.npz holds no 'experts' array"),
    ]:
        with pytest.raises(StreamerError, match=message) as error:
            split(full, tmp_path / "out", 0, 2, trace=tmp_path / f"{name}.npz")
        assert "pickle" not in str(error.value)
    compressed = tmp_path / "compressed.npz"  # as tools/routing_summary.py writes it
    np.savez_compressed(compressed, experts=np.zeros((30, layers, 4), dtype=np.int64))
    assert split(full, tmp_path / "s0", 0, 2, trace=compressed, log=lambda _: None).shard


def test_force_replaces_a_shard_and_nothing_else(full, tmp_path, capsys):
    """--force failed on every existing shard ("it appeared while repacking"); a destination
    inside the source was written into the user's repacked folder."""
    dst = tmp_path / "shard"
    split(full, dst, 0, 2, log=lambda _: None)
    assert split(full, dst, 1, 2, force=True, log=lambda _: None).shard.rank == 1
    assert read_manifest(dst).shard.rank == 1 and not list(tmp_path.glob(".shard*"))
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    assert main(["split", str(full), str(mine), "--shard", "0/2", "--force"]) == 2
    assert "not a folder written by `streamer repack`" in capsys.readouterr().err
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    assert main(["split", str(full), str(full / "sub"), "--shard", "0/2"]) == 2
    assert "inside it or around it" in capsys.readouterr().err
    assert not (full / "sub").exists() and not (full / ".sub.partial").exists()


def test_a_trace_with_a_negative_id_names_it(full, tmp_path):
    """The message named the layer's largest id (0 here), not the one out of range."""
    routed = np.zeros((3, len(read_manifest(full).layers), 4), dtype=np.int64)
    routed[1, 0, 2] = -3
    np.savez(tmp_path / "negative.npz", experts=routed)
    with pytest.raises(StreamerError, match="layer 0 routes to expert -3, but the layer has 16"):
        split(full, tmp_path / "out", 0, 2, trace=tmp_path / "negative.npz")


def test_an_unfinished_repack_into_the_destination_is_kept(full, checkpoints, tmp_path):
    """A split removed whatever `.DST.partial` held, an interrupted `repack --delete-source`'s
    too: the only copy of the source shards it had deleted."""
    source, dst = tmp_path / "src", tmp_path / "model"
    shutil.copytree(checkpoints.hf("qwen3_moe"), source)

    def interrupt(line: str) -> None:
        if "deleted source shard" in line:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        repack(source, dst, delete_source=True, log=interrupt)
    partial = tmp_path / ".model.partial"
    before = {p: p.read_bytes() for p in partial.rglob("*") if p.is_file()}
    with pytest.raises(StreamerError, match="unfinished `streamer repack` into .*with --resume"):
        split(full, dst, 0, 2, log=lambda _: None)
    assert {p: p.read_bytes() for p in partial.rglob("*") if p.is_file()} == before
    repack(source, dst, delete_source=True, resume=True, log=lambda _: None)
    assert verify(dst, log=lambda _: None) == []
