"""How many bytes of expert files a load may still page-lock whole on CUDA: one allowance shared
by every slot pool of the load (loading/pools.py), taken as a file is locked and given back as it
is unlocked (io/cuda_copy.py). Given to each pool alone, every pool of a load could lock the
plan's `pinnable` (loading/residency.py): several times the host memory it allows.

A load's pools are used by one thread at a time (the model's claim: loading/handle.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PinAllowance:
    left: int  # bytes that may still be locked
