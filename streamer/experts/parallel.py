"""One rank's part of an expert-parallel MoE layer: it wraps the layer's compute mode.

The expert container's output is [..., k, D]: one row per routed slot, which the model's MoE
block then weights and sums. Each rank fills the rows of the experts it owns and leaves zeros
elsewhere, and one all_sum of that output per layer gives every rank the single-process rows
exactly (each row is one rank's value plus zeros), so every architecture's router and score code
runs unchanged. It costs k x D values per token and layer.

In a synced compute mode (the layer learns its routing on the host to prefetch) a rank computes only
the slots it owns, on its own records: the compute mode gets just those tokens and slots. In a
sync-free mode (resident, or files all in the page cache) the graph's shapes cannot depend on
the routing, so every slot is computed: other ranks' experts on one of this rank's records, then
zeroed. No host sync is added there.
"""

from __future__ import annotations

import time

import mlx.core as mx
import numpy as np

from ..expert_traffic import ExpertTraffic
from .mapped import InPageCache
from .resident import Resident

SYNC_FREE = (Resident, InPageCache)


class ExpertShare:
    """Which of one layer's experts this rank computes (`record_of[e]`: expert e's record in this
    rank's files, -1 for another rank's) and the group whose rows are summed. `expert_ids`: the
    model's expert id of each record (None: record e is expert e), for routing traces."""

    def __init__(
        self,
        record_of: np.ndarray,
        group: mx.distributed.Group,
        expert_ids: tuple[int, ...] | None = None,
    ):
        owned = record_of >= 0
        self.record_of = record_of
        self.group = group
        self._expert_of = None if expert_ids is None else np.array(expert_ids)
        stand_in = record_of[owned][0]  # computed in place of other ranks' experts, then zeroed
        self._records = mx.array(np.where(owned, record_of, stand_in).astype(np.uint32))
        self._owned = mx.array(owned)

    def __call__(self, layer, x: mx.array, indices: mx.array, traffic: ExpertTraffic) -> mx.array:
        """The layer's output: this rank's rows, summed over the ranks (the layer's collective)."""
        if isinstance(layer.compute_mode, SYNC_FREE):
            out = layer.compute_mode(layer, x, self._records[indices], traffic)
            out = mx.where(self._owned[indices][..., None], out, 0.0)
        else:
            out = self._owned_slots(layer, x, indices, traffic)
        traffic.collectives += 1
        traffic.collective_bytes += out.nbytes
        return mx.distributed.all_sum(out, group=self.group)

    def _owned_slots(
        self, layer, x: mx.array, indices: mx.array, traffic: ExpertTraffic
    ) -> mx.array:
        start = time.perf_counter()
        routed = np.array(indices)  # the layer's sync; the compute mode then finds the routing done
        traffic.sync_seconds += time.perf_counter() - start
        records = self.record_of[routed.ravel()]
        slots = np.flatnonzero(records >= 0)
        k, width = indices.shape[-1], x.shape[-1]
        if not slots.size:  # none of this token's experts is ours: the compute mode is not called
            traffic.syncs += 1
            return mx.zeros((*indices.shape, width), dtype=x.dtype)
        mine = records[slots].astype(np.uint32)
        if routed.size == k:  # one token: its owned slots, as the container takes a token's k
            rows = self._read(layer, x.reshape(1, width), mx.array(mine[None]), traffic)[0]
        else:  # a prompt chunk: one row per owned slot
            tokens = x.reshape(-1, width)[mx.array(slots // k)]
            rows = self._read(layer, tokens, mx.array(mine[:, None]), traffic)[:, 0]
        out = mx.zeros((routed.size, width), dtype=rows.dtype)
        out[mx.array(slots)] = rows
        return out.reshape(*indices.shape, width)

    def _read(self, layer, x: mx.array, records: mx.array, traffic: ExpertTraffic) -> mx.array:
        """The compute mode on this rank's records; what it traces is named by the model's ids."""
        trace = layer.stats.trace
        traced = len(trace) if trace is not None else 0
        out = layer.compute_mode(layer, x, records, traffic)
        if trace is not None and self._expert_of is not None:
            trace[traced:] = [
                (index, tuple(sorted(self._expert_of[list(experts)].tolist())))
                for index, experts in trace[traced:]
            ]
        return out
