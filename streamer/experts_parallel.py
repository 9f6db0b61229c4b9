"""One rank's part of an expert-parallel MoE layer.

The expert container's output is [..., k, D]: one row per routed slot, which the model's MoE
block then weights and sums. Each rank fills the rows of the experts it owns and leaves zeros
elsewhere, and one all_sum of that output per layer gives every rank the single-process rows
exactly (each row is one rank's value plus zeros), so every architecture's router and score code
runs unchanged. It costs k x D values per token and layer.

Where the layer knows its routing on the host (it syncs to prefetch), a rank computes only the
slots it owns, on its own records. Where the layer runs sync-free (its file is all cached, or it
is resident), the graph's shapes cannot depend on the routing, so every slot is computed: slots
of other ranks' experts on one of this rank's records, then zeroed. No host sync is added.
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .stats import ExpertTraffic


class ExpertShare:
    """Which of one layer's experts this rank computes (`record_of[e]`: its record in this rank's
    expert file, -1 for another rank's expert) and the group whose outputs are summed."""

    def __init__(self, record_of: np.ndarray, group: mx.distributed.Group):
        owned = record_of >= 0
        self.record_of = record_of
        self.group = group
        stand_in = record_of[owned][0]  # computed in place of other ranks' experts, then zeroed
        self._records = mx.array(np.where(owned, record_of, stand_in).astype(np.uint32))
        self._owned = mx.array(owned)

    def sync_free(self, container: nn.Module, x: mx.array, indices: mx.array):
        """(this rank's rows, the records computed) without knowing the routing on the host."""
        records = self._records[indices]
        out = container(x, records)
        return mx.where(self._owned[indices][..., None], out, 0.0), records

    def owned_slots(self, routed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(flat slot numbers routed to this rank's experts, their records)."""
        records = self.record_of[routed.ravel()]
        slots = np.flatnonzero(records >= 0)
        return slots, records[slots]

    def compute_slots(
        self,
        container: nn.Module,
        x: mx.array,
        shape: tuple[int, ...],
        slots: np.ndarray,
        indices: np.ndarray,
    ) -> mx.array:
        """[*shape, D]: rows of `slots` computed with expert `indices` of the installed tensors,
        zeros elsewhere."""
        k, width = shape[-1], x.shape[-1]
        if not slots.size:
            return mx.zeros((*shape, width), dtype=x.dtype)
        tokens = x.reshape(-1, width)[mx.array(slots // k)]
        rows = container(tokens, mx.array(indices.astype(np.uint32))[:, None])[:, 0]
        out = mx.zeros((math.prod(shape), width), dtype=rows.dtype)
        out[mx.array(slots)] = rows
        return out.reshape(*shape, width)

    def sum(self, out: mx.array, traffic: ExpertTraffic) -> mx.array:
        """The ranks' rows summed: the layer's one collective."""
        traffic.collectives += 1
        traffic.collective_bytes += out.nbytes
        return mx.distributed.all_sum(out, group=self.group)
