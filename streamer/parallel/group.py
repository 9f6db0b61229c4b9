"""Expert-parallel runs over MLX's own distributed layer (mx.distributed, started by mlx.launch).

Every rank runs the whole model on the same tokens; in each MoE layer a rank computes only the
routed experts it owns and the ranks' outputs are summed (streamer/experts/parallel.py). Here:
finding the group, checking at load that the ranks' folders fit together (one model, each expert
owned by exactly one rank, every shard on the rank it was split for), and the small collectives
of the command line (a shared seed, the ranks' statistics gathered on rank 0).
"""

from __future__ import annotations

import os
import socket
import time
from collections import Counter
from pathlib import Path

import mlx.core as mx
import numpy as np

from ..errors import StreamerError
from ..io.manifest import Manifest
from ..io.ring_hostfile import ring_hosts
from .shards import interleaved

WHERE_BYTES = 1024  # room for "host:/folder" in the load-time check, or a rank's error
FAILED = -1  # a gathered header's flag: the rank's own folder failed, its row holds the error
_checking: set[int] = set()  # the groups whose load-time check this rank has begun
PRESENT = np.frombuffer(b"streamer-rank-ok", dtype=np.uint8)  # leads every rank's gathered row
# Set by mlx.launch (ring, jaccl: MLX_RANK; nccl: MLX_WORLD_SIZE) or by an MPI launcher. Without
# them no group is asked for: mx.distributed.init() tries every backend, and after it a process
# started alone was seen to ignore an early Ctrl-C (tests/test_cli.py).
LAUNCH_VARIABLES = ("MLX_RANK", "MLX_WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")


# How MLX's distributed backends begin their errors, a lost peer's among them
BACKEND_ERRORS = ("[ring]", "[jaccl]", "[mpi]", "[nccl]")


class GroupError(StreamerError):
    """A fault every rank finds alike (the ranks' folders do not fit together): rank 0 says it."""


def peer_gone(error: RuntimeError) -> GroupError | None:
    """MLX's error at a collective whose peer has ended (`[ring] connection to a peer was lost`)
    as the line the group says once, or None for any other error."""
    if not str(error).startswith(BACKEND_ERRORS):
        return None
    return GroupError(f"a rank is gone from the group ({error}): its own error says why.")


def launched_group() -> mx.distributed.Group | None:
    """The group this process was started in by mlx.launch (or MLX's own environment variables),
    or None when it runs alone."""
    if not any(v in os.environ for v in LAUNCH_VARIABLES) or not mx.distributed.is_available():
        return None
    if ring_hosts() == []:
        return None  # mlx.launch's ring of one host (`-n 1`): a plain run
    try:
        group = mx.distributed.init()
    except RuntimeError as e:  # the ring's peers unreachable (after MLX's retries, ~30 s)
        rank = os.environ.get("MLX_RANK", "?")
        raise StreamerError(
            f"rank {rank} cannot join its group ({e}): check that every host of the hostfile is "
            "up and reachable at its address, and that no other program holds its port."
        ) from None
    return group if group.size() > 1 else None


def expert_shares(
    group: mx.distributed.Group | None, folder: Path, manifest: Manifest, totals: list[int]
) -> list[np.ndarray] | None:
    """Per MoE layer, the record in this rank's folder of each of the model's `totals[i]`
    experts, -1 for those another rank computes; None when running alone. Raises StreamerError,
    on every rank, naming the rank whose folder does not fit the group."""
    shard = manifest.shard
    if group is None:
        if shard is not None:
            raise StreamerError(
                f"{folder} holds only shard {shard.rank}/{shard.ranks} of a model's experts: "
                f"run it on {shard.ranks} ranks with `streamer launch`, or load the full repacked "
                "folder."
            )
        return None
    rank, ranks = group.rank(), group.size()
    places = _check_headers(group, folder, manifest)
    records = []
    for layer, total in zip(manifest.layers, totals):
        record = np.full(total, -1, dtype=np.int64)
        if layer.expert_ids is None:  # a full folder: this rank computes its interleaved share
            mine = np.flatnonzero(interleaved(total, ranks) == rank)
            record[mine] = mine
        else:
            record[list(layer.expert_ids)] = np.arange(len(layer.expert_ids))
        records.append(record)
    owned = _all_gather(group, np.concatenate([r >= 0 for r in records]).astype(np.uint8))
    start = 0
    for index, total in enumerate(totals):
        layer_owned, start = owned[:, start : start + total], start + total
        bad = np.flatnonzero(layer_owned.sum(axis=0) != 1)
        if bad.size:
            expert = int(bad[0])
            holders = [f"rank {r} ({places[r]})" for r in np.flatnonzero(layer_owned[:, expert])]
            raise GroupError(
                f"MoE layer {index} expert {expert} is computed by "
                f"{' and '.join(holders) or 'no rank'}: the ranks' shards were split differently "
                "(--trace or not, or from other folders). Split every shard the same way."
            )
        if not layer_owned.any(axis=1).all():  # each rank needs a record of its own
            raise GroupError(
                f"MoE layer {index} has {total} experts: too few to give each of {ranks} ranks "
                "a share. Launch fewer ranks."
            )
    return records


def tell_failure(group: mx.distributed.Group, error: StreamerError) -> None:
    """A rank whose own folder failed before the group's load-time check (a damaged file, a
    missing folder) takes part in it with its error, so that rank 0 says which rank failed and
    why; left waiting there, it could say only that a rank was gone."""
    if id(group) in _checking or isinstance(error, GroupError):
        return  # past the check: the others are elsewhere, and rank 0 says a rank is gone
    header = np.zeros(3 + 16 + WHERE_BYTES, dtype=np.int64)
    header[2] = FAILED
    text = " ".join(str(error).split()).encode()[:WHERE_BYTES]
    header[19 : 19 + len(text)] = np.frombuffer(text, dtype=np.uint8)
    try:
        _all_gather(group, header)
    except (RuntimeError, StreamerError):
        pass  # another rank failed too, or is gone: this rank's own error is said all the same


def _check_headers(group: mx.distributed.Group, folder: Path, manifest: Manifest) -> list[str]:
    """Gather each rank's model identity, shard claim and "host:folder"; return the latter."""
    _checking.add(id(group))
    shard = manifest.shard
    where = f"{socket.gethostname()}:{folder.resolve()}".encode()[:WHERE_BYTES]
    header = np.zeros(3 + 16 + WHERE_BYTES, dtype=np.int64)
    header[:3] = (shard.rank, shard.ranks, 1) if shard is not None else (0, 0, 0)
    header[3:19] = np.frombuffer(bytes.fromhex(manifest.model_identity)[:16], dtype=np.uint8)
    header[19 : 19 + len(where)] = np.frombuffer(where, dtype=np.uint8)
    rows = _all_gather(group, header)
    text = rows[:, 3:].astype(np.uint8)
    places = [bytes(row[16:]).rstrip(b"\0").decode(errors="replace") for row in text]
    for rank, flag in enumerate(rows[:, 2].tolist()):
        if flag == FAILED:
            raise GroupError(f"rank {rank} cannot load its folder: {places[rank]}")
    models = [bytes(row[:16]).hex() for row in text]
    common, _ = Counter(models).most_common(1)[0]
    for rank, model in enumerate(models):
        if model != common:
            other = models.index(common)
            raise GroupError(
                f"rank {rank} ({places[rank]}) holds another model than rank {other} "
                f"({places[other]}): give every rank a shard (streamer split) or a copy of the "
                "same repacked model."
            )
    ranks = group.size()
    for rank, (claimed, of, is_shard) in enumerate(rows[:, :3].tolist()):
        if not is_shard:
            continue
        if of != ranks:
            raise GroupError(
                f"rank {rank} ({places[rank]}) holds shard {claimed}/{of}, but the group has "
                f"{ranks} ranks: split the model into {ranks} shards or launch {of} ranks."
            )
        if claimed != rank:
            raise GroupError(
                f"rank {rank} ({places[rank]}) holds shard {claimed}/{of}, which is rank "
                f"{claimed}'s: give rank {rank} the folder of shard {rank}/{of}."
            )
    return places


def _all_gather(group: mx.distributed.Group, row: np.ndarray) -> np.ndarray:
    """Every rank's `row` (1-D, same length and dtype on all), stacked in rank order. Raises
    GroupError naming a rank that did not take part: a rank that has ended (its own error said
    why) leaves its row unwritten, and the ring backend may return the rest without raising."""
    sent = np.concatenate([PRESENT, np.ascontiguousarray(row).view(np.uint8)])
    with mx.stream(mx.cpu):
        gathered = np.array(mx.distributed.all_gather(mx.array(sent)[None], group=group))
    for rank, got in enumerate(gathered):
        if got[: len(PRESENT)].tobytes() != PRESENT.tobytes():
            raise GroupError(
                f"rank {rank} is gone from the group (its part of a collective never came): "
                "its own error says why."
            )
    return gathered[:, len(PRESENT) :].copy().view(row.dtype)


def gather_floats(group: mx.distributed.Group, values: list[float]) -> np.ndarray:
    """[ranks, len(values)]: each rank's values, on every rank."""
    return _all_gather(group, np.array(values, dtype=np.float64))


def shared_seed(group: mx.distributed.Group, seed: int | None) -> int:
    """One sampling seed for all ranks (rank 0's), so that sampled tokens agree everywhere."""
    if seed is None:
        seed = int(np.random.default_rng().integers(1 << 31))
    return int(gather_floats(group, [seed])[0, 0])


def time_all_sum(
    group: mx.distributed.Group, shape: tuple[int, ...], dtype: mx.Dtype, repeat: int = 20
) -> float:
    """Median seconds of one all_sum of `shape` (sized as one MoE layer's decode collective), all
    ranks taking part: a measurement after the run, since timing the run's own collectives would
    need a host sync in every layer."""
    x = mx.zeros(shape, dtype=dtype)
    mx.eval(x)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        mx.eval(mx.distributed.all_sum(x, group=group))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def group_stats_line(group: mx.distributed.Group, model, stats) -> str:
    """Every rank's decode traffic gathered into one line (meant for rank 0 to print): expert
    bytes and reads per token and rank, and the per-token cost of the layers' all_sums, timed
    after the run at the size of the run's own (all ranks must call this together)."""
    decode = model.streamer.stats.decode
    steps = max(model.streamer.stats.decode_tokens, 1)
    each = decode.collective_bytes // max(decode.collectives, 1)  # bytes of one decode all_sum
    seconds = time_all_sum(group, (max(each // 4, 1),), mx.float32)
    rows = gather_floats(
        group,
        [
            decode.bytes_read / steps,
            decode.experts_read / steps,
            decode.syncs / steps,
            decode.collectives / steps,
            seconds,
            stats.peak_rss_bytes,
        ],
    )

    def by_rank(column: int, scale: float, digits: int) -> str:
        return " ".join(f"{v / scale:.{digits}f}" for v in rows[:, column])

    per_token = rows[0, 3] * rows[:, 4].max()
    return (
        f"{group.size()} ranks | expert MiB/token by rank {by_rank(0, 1 << 20, 2)} | "
        f"reads/token by rank {by_rank(1, 1, 1)} | syncs/token by rank {by_rank(2, 1, 1)} | "
        f"all_sum {rows[0, 3]:.0f}/token, {rows[:, 4].max() * 1e6:.0f} us each "
        f"({per_token * 1e3:.2f} ms/token, timed after the run) | "
        f"peak RSS by rank {by_rank(5, 1 << 30, 2)} GiB"  # binary units, as io/sizes.py's
    )
