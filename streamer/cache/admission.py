"""Misses admitted into slots by the gather kernel as it reads them (settle.ADMIT_AS_READ): a
gathered pool's decode calls leave its settles nothing to copy, and the pool learns within the
token instead of at the next settle (bench/settle_copies.py --admit-on-miss, bench/findings.md).

Per decode call one admission kernel (io/cuda_gather.py SlotAdmit, `admit` here) plans each
routed entry: the slot it is read from (its slot, or none: the file) and a slot the gather kernel
also writes its bytes into. A miss takes the next slot of a victim queue if its expert was routed
more often than the victim's, by the counts of the last settle (SlotLFU.refresh's rule); the
kernel updates the device's slot table, each slot's key and the queue's cursor in place. The host
never pulls them: a settle replays the calls through `admit` on the policy's own slot_of and
slot_key, each with the queue, counts and cursor of the epoch (the settle) it was queued in, so
the policy holds what the device holds once those calls ran. The settle then counts the window
in the LFU and begins an epoch: a queue (empty slots first, then held slots, coldest first), the
counts in float32 (what the kernel compares) and a cursor at 0, uploaded as new arrays (calls in
flight keep theirs). A synced call (`place`: it settles every call and fences first) moves slots
on the host; the table and keys are uploaded anew then (the pool's `version` changes). A prompt
gathered whole reads by the table and admits nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from . import settle
from .policies import SlotLFU
from .slot_memory import SlotTensor


def admit(
    keys: np.ndarray,
    table: np.ndarray,
    owner: np.ndarray,
    queue: np.ndarray,
    counts: np.ndarray,
    cursor: int,
) -> tuple[np.ndarray, np.ndarray, int]:
    """One call's plan for its routed `keys` (routed order, repeats allowed): per entry the slot it
    is read from (`table`'s, -1: the file) and the slot its bytes also go to (-1: none), and the
    cursor in `queue` after it. Each miss this call has not admitted yet takes `queue[cursor]`,
    unless that slot's key was routed as often (`counts`): then it stays a miss, and the next one
    tries the same slot. Slots the call reads are passed over: a victim is never read by its call.
    `table` (key -> slot, -1: none) and `owner` (slot -> key, -1: none) are updated in place."""
    source = table[keys]
    to = np.full(len(keys), -1, dtype=np.int64)
    read = set(source[source >= 0].tolist())
    for j, key in enumerate(keys.tolist()):
        if source[j] >= 0 or table[key] >= 0:  # a hit, or a repeat of a miss admitted here
            continue
        while cursor < len(queue) and int(queue[cursor]) in read:
            cursor += 1
        if cursor == len(queue):
            break  # every slot of the queue taken or read: the rest stay misses
        victim = int(queue[cursor])
        old = int(owner[victim])
        if old >= 0 and counts[key] <= counts[old]:
            continue
        cursor += 1
        if old >= 0:
            table[old] = -1
        owner[victim], table[key], to[j] = key, victim, victim
    return source, to, cursor


@dataclass
class Epoch:
    """A settle's victim queue and counts, and the cursor past the slots taken or passed since
    then: the host's, which the replay moves, and the device's arrays (queue, counts, cursor)."""

    queue: np.ndarray
    counts: np.ndarray
    cursor: int
    arrays: tuple[mx.array, mx.array, mx.array]


def epoch(policy: SlotLFU) -> Epoch:
    """An epoch from `policy` now: empty slots first, then held slots by ascending count."""
    score = np.where(policy.slot_key >= 0, policy._score(), -1.0)
    queue = np.argsort(score, kind="stable")
    counts = policy.counts.astype(np.float32)
    cursor = mx.array(np.zeros(1, dtype=np.uint32))
    return Epoch(queue, counts, 0, (mx.array(queue.astype(np.uint32)), mx.array(counts), cursor))


def admitting(
    policy: SlotLFU, tensors: Sequence[SlotTensor], base: dict[int, int]
) -> Admission | None:
    """A pool's Admission when settle.ADMIT_AS_READ, else None."""
    return Admission(policy, tensors, base) if settle.ADMIT_AS_READ else None


class Admission:
    """A gathered pool's admissions: the device's table and keys, the epoch, the kernels, and
    the admitting calls not yet settled (their routed indices, each with its epoch)."""

    def __init__(self, policy: SlotLFU, tensors: Sequence[SlotTensor], base: dict[int, int]):
        self.policy, self.tensors, self.base = policy, tuple(tensors), base  # base: SlotPool's
        self._epoch = epoch(policy)
        self._calls: list[tuple[mx.array, Epoch]] = []  # not settled: routed indices, epoch
        self._device: tuple = (-1, None, None)  # the pool's version, table, owner (uint32)
        self._admit = None  # the admission kernel (SlotAdmit)
        self.last = mx.zeros((1,), mx.uint8)  # a view of the last gather's stack, waited for
        self._gathers: dict[int, object] = {}  # a gather kernel's alignment -> its plan mode
        self._bases: dict[int, mx.array] = {}  # layer -> its first key, for the kernel

    def table(self, version: int, slot_of: np.ndarray) -> mx.array:
        """Every key's slot on the device (uint32, -1: none), which the admission kernels update;
        uploaded with each slot's key for the pool's first call and after a synced call moved
        slots (`version`): the host then holds exactly what the device holds."""
        if self._device[0] != version:
            owner = self.policy.slot_key.astype(np.uint32)
            self._device = (version, mx.array(slot_of.astype(np.uint32)), mx.array(owner))
        return self._device[1]

    def gather(
        self, version: int, layer: int, kernel, indices: mx.array, sources, arrays
    ) -> list[mx.array]:
        """A decode call's stacks: its plan made on the device (SlotAdmit), then `kernel`'s
        gather in plan mode (io/cuda_gather.py), which writes the admitted experts' slots."""
        from ..io.cuda_gather import ExpertGather, SlotAdmit

        if self._admit is None:
            self._admit = SlotAdmit(len(self.policy.slot_key))
        if kernel.alignment not in self._gathers:
            self._gathers[kernel.alignment] = ExpertGather(
                self.tensors, kernel.alignment, admits=True
            )
        if layer not in self._bases:
            self._bases[layer] = mx.array(np.array([self.base[layer]], dtype=np.uint32))
        table = self.table(version, self.policy.slot_of)
        state = (table, self._device[2], *self._epoch.arrays)
        plan = self._admit(indices, self._bases[layer], *state, self.last)
        self._calls.append((indices, self._epoch))
        stacks = self._gathers[kernel.alignment](indices, plan, sources, arrays)
        # The next admission waits for this gather (a view of its stack is its input): it may
        # evict a slot this gather reads. MLX orders a CUDA graph's kernels by the arrays they
        # pass, not by writes through pointers; where the routing is not computed from the
        # layer before (the bench's routing model) nothing else orders them, and on an H100
        # admissions ran at once: the device's table went its own way (bench/findings.md).
        self.last = stacks[0].view(mx.uint8).reshape(-1)[:1]
        return stacks

    def settle(self, deferred: list[tuple[int, mx.array, Callable]]) -> None:
        """The pool's `deferred` calls (layer, routed indices, count) replayed in order on the
        policy (`_replay`); each call's distinct experts given to its count with those it found
        in a slot, and counted by the LFU; then a new epoch. Nothing is copied."""
        routed, base = settle.pulled([indices for _, indices, _ in deferred]), self.base
        for (layer, indices, count), experts in zip(deferred, routed):
            keys = base[layer] + experts.astype(np.int64)
            source = self._replay(indices, keys)
            keys, first = np.unique(keys, return_index=True)
            count(keys - base[layer], source[first] >= 0)
            self.policy._count(keys)
        self._epoch = epoch(self.policy)

    def _replay(self, indices: mx.array, keys: np.ndarray) -> np.ndarray:
        """One call's source slot per routed key: an admitting call's through `admit`, with its
        epoch; a prompt gathered whole (no admitting call of its own) read by the table."""
        if not self._calls or self._calls[0][0] is not indices:
            return self.policy.slot_of[keys]
        _, at = self._calls.pop(0)
        policy = self.policy
        source, _, at.cursor = admit(
            keys, policy.slot_of, policy.slot_key, at.queue, at.counts, at.cursor
        )
        return source
