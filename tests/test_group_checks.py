"""The load-time check that an expert-parallel group's folders fit together, every message path:
the ranks are threads of this process, their all_gather a barrier, each with its own manifest
(a real split shard's, or one edited the way a wrong copy would be). Every rank must find the
same fault and say the same line (rank 0 prints it), naming the rank with the wrong files.
"""

from __future__ import annotations

import dataclasses
import socket
import threading
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

import streamer.parallel.group
from streamer.errors import StreamerError
from streamer.io.manifest import read_manifest
from streamer.parallel.group import GroupError, expert_shares, peer_gone
from streamer.parallel.split import split

HOST = socket.gethostname()


class Rank:
    """Rank `rank` of a group of `ranks` threads meeting at `barrier`."""

    def __init__(self, rank: int, ranks: int, rows: list, barrier: threading.Barrier):
        self._rank, self._ranks, self.rows, self.barrier = rank, ranks, rows, barrier

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._ranks


def gathered(group: Rank, row: np.ndarray) -> np.ndarray:
    group.rows[group.rank()] = row
    group.barrier.wait()
    rows = np.stack(group.rows)
    group.barrier.wait()  # every rank has its copy before the next gather writes
    return rows


GATHER = streamer.parallel.group._all_gather  # the real one, for the tests of a rank gone


@pytest.fixture(autouse=True)
def threads_for_ranks(monkeypatch):
    monkeypatch.setattr(streamer.parallel.group, "_all_gather", gathered)


def as_ranks(ranks: int, call) -> list:
    """`call(group, rank)` on `ranks` threads, each a rank of one group: each one's result, or
    the error it raised."""
    rows, barrier = [None] * ranks, threading.Barrier(ranks, timeout=30)
    results: list = [None] * ranks

    def rank(r: int) -> None:
        try:
            results[r] = call(Rank(r, ranks, rows, barrier), r)
        except Exception as e:
            results[r] = e

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(ranks)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def run_group(folders: list[Path], manifests: list, totals: list[int]) -> list:
    """Each rank's expert_shares (its records, or the error it raised)."""
    return as_ranks(
        len(manifests), lambda group, r: expert_shares(group, folders[r], manifests[r], totals)
    )


def the_error(results: list) -> str:
    """The one line every rank raised."""
    assert all(isinstance(r, StreamerError) for r in results), results
    assert len({str(r) for r in results}) == 1, results
    return str(results[0])


@pytest.fixture(scope="module")
def group(checkpoints, tmp_path_factory):
    """A 4-bit model's full folder, its two shards and their manifests."""
    full = checkpoints.repacked(checkpoints.mlx("qwen3_moe"))
    root = tmp_path_factory.mktemp("group-checks")
    shards = [root / f"shard{r}" for r in range(2)]
    for rank, folder in enumerate(shards):
        split(full, folder, rank, 2, log=lambda _: None)
    manifest = read_manifest(full)
    totals = [layer.num_experts for layer in manifest.layers]
    return full, shards, manifest, [read_manifest(f) for f in shards], totals


def where(folder: Path) -> str:
    return f"{HOST}:{folder.resolve()}"


def test_shards_that_fit_give_each_rank_its_records(group):
    _, shards, _, manifests, totals = group
    records = run_group(shards, manifests, totals)
    for rank, layers in enumerate(records):
        for record_of, total in zip(layers, totals):
            mine = np.flatnonzero(record_of >= 0)
            assert (mine % 2 == rank).all() and len(mine) == total // 2
            assert record_of[mine].tolist() == list(range(len(mine)))  # in the shard's order


def test_a_shard_loaded_alone_is_refused(group):
    _, shards, _, manifests, totals = group
    with pytest.raises(StreamerError) as e:
        expert_shares(None, shards[1], manifests[1], totals)
    assert str(e.value) == (
        f"{shards[1]} holds only shard 1/2 of a model's experts: run it on 2 ranks with "
        "`streamer launch`, or load the full repacked folder."
    )


def test_a_rank_with_another_model_is_named(group):
    _, shards, _, manifests, totals = group
    other = dataclasses.replace(manifests[1].shard, model="ab" * 16)
    wrong = [manifests[0], dataclasses.replace(manifests[1], shard=other)]
    assert the_error(run_group(shards, wrong, totals)) == (
        f"rank 1 ({where(shards[1])}) holds another model than rank 0 ({where(shards[0])}): "
        "give every rank a shard (streamer split) or a copy of the same repacked model."
    )


def test_shards_of_another_split_count_are_named(group, tmp_path):
    full, shards, manifest, manifests, totals = group
    folders = [shards[0], shards[1], full]  # three ranks, the shards of a split in two
    assert the_error(run_group(folders, [*manifests, manifest], totals)) == (
        f"rank 0 ({where(shards[0])}) holds shard 0/2, but the group has 3 ranks: split the "
        "model into 3 shards or launch 2 ranks."
    )


def test_a_rank_with_another_ranks_shard_is_named(group):
    _, shards, _, manifests, totals = group
    swapped = [shards[1], shards[0]]
    assert the_error(run_group(swapped, manifests[::-1], totals)) == (
        f"rank 0 ({where(shards[1])}) holds shard 1/2, which is rank 1's: give rank 0 the "
        "folder of shard 0/2."
    )


def with_experts(manifest, ids: list[int]):
    """The manifest as if its first MoE layer's records held experts `ids`."""
    first = dataclasses.replace(manifest.layers[0], expert_ids=tuple(ids))
    return dataclasses.replace(manifest, layers=(first, *manifest.layers[1:]))


def test_an_expert_on_two_ranks_is_named(group):
    full, shards, manifest, manifests, totals = group
    # rank 0 computes the even experts of its full folder, rank 1's records say expert 0 too
    ids = [0, *manifests[1].layers[0].expert_ids[1:]]
    results = run_group([full, shards[1]], [manifest, with_experts(manifests[1], ids)], totals)
    assert the_error(results) == (
        f"MoE layer 0 expert 0 is computed by rank 0 ({where(full)}) and rank 1 "
        f"({where(shards[1])}): the ranks' shards were split differently (--trace or not, or "
        "from other folders). Split every shard the same way."
    )


def test_an_expert_on_no_rank_is_named(group):
    _, shards, _, manifests, totals = group
    ids = list(manifests[1].layers[0].expert_ids)  # 1, 3, ...: drop expert 1
    results = run_group(shards, [manifests[0], with_experts(manifests[1], ids[1:])], totals)
    assert the_error(results) == (
        "MoE layer 0 expert 1 is computed by no rank: the ranks' shards were split differently "
        "(--trace or not, or from other folders). Split every shard the same way."
    )


def test_too_few_experts_for_the_ranks_is_refused(group):
    full, _, manifest, _, totals = group
    ranks = totals[0] + 1  # full folders: the experts interleaved, one rank left with none
    results = run_group([full] * ranks, [manifest] * ranks, totals)
    assert the_error(results) == (
        f"MoE layer 0 has {totals[0]} experts: too few to give each of {ranks} ranks a share. "
        "Launch fewer ranks."
    )


def test_a_rank_gone_before_a_gather_is_named(monkeypatch):
    """The ring backend can return a gather whose ended rank's row was never written: the row's
    leading mark is missing, and the survivors name that rank instead of reading its zeros."""

    def without_rank_1(x, group):
        return mx.concatenate([x, mx.zeros_like(x)])  # rank 1 sent nothing

    monkeypatch.setattr(mx.distributed, "all_gather", without_rank_1)
    with pytest.raises(GroupError) as e:
        GATHER(None, np.arange(3, dtype=np.int64))
    assert str(e.value) == (
        "rank 1 is gone from the group (its part of a collective never came): its own error "
        "says why."
    )
    monkeypatch.setattr(mx.distributed, "all_gather", lambda x, group: mx.concatenate([x, x]))
    assert GATHER(None, np.arange(3, dtype=np.int64)).tolist() == [[0, 1, 2], [0, 1, 2]]


def test_a_lost_peer_is_one_line_and_other_errors_stay_errors():
    gone = peer_gone(RuntimeError("[ring] connection to a peer was lost"))
    assert isinstance(gone, GroupError) and str(gone) == (
        "a rank is gone from the group ([ring] connection to a peer was lost): its own error "
        "says why."
    )
    assert peer_gone(RuntimeError("[matmul] shapes do not match")) is None
