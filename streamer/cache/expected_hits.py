"""The slot pool's hit rate to expect at a budget, by how locally a model routes.

Routed experts found in the pool (LFU with aging, cache/policies.py SlotLFU, in pools grouped as
loading/residency.py groups them) at a budget of each share of all expert bytes, per routing
profile of bench/routing_model.py, a routing model fitted to trained models' published cache
curves: `high` routes like Qwen3-30B-A3B, `low` like OLMoE and gpt-oss, `uniform` with no
locality. Computed once by that replay (issue 35; 48 layers of 128 experts, top-8, 2000 decode
tokens over 4 prompts, seed 0, the cold starts included):

    python bench/routing_model.py --profile P --policy pool --top-k 8 --json \
        --budgets 0.05,0.1,0.15,0.2,0.25,0.3,0.4,0.5,0.6,0.7,0.8,0.9

tests/test_routing_model.py replays a few points again and holds this table to them. A budget
that holds every expert reads nothing (1.0).
"""

from __future__ import annotations

import numpy as np

SHARES = (0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
# fmt: off
PER_MILLE = {  # routed experts per 1000 found in the pool, at each of SHARES
    "high":    (   0,  410,  574,  678,  754,  812,  862,  936,  972,  982,  986,  989,  991, 1000),
    "medium":  (   0,  329,  473,  571,  648,  713,  770,  864,  933,  972,  981,  987,  990, 1000),
    "low":     (   0,  205,  315,  403,  480,  558,  631,  754,  862,  952,  972,  982,  988, 1000),
    "uniform": (   0,   42,   89,  136,  184,  235,  287,  387,  488,  589,  690,  791,  892, 1000),
}
# fmt: on
PROFILE_HITS = {p: tuple(h / 1000 for h in hits) for p, hits in PER_MILLE.items()}
PROFILES = tuple(PROFILE_HITS)
TYPICAL = "medium"  # what plan and a load's message lead with


def expected_pool_hits(share: float, profile: str = TYPICAL) -> float:
    """The pool's hit rate to expect at a budget of `share` of all expert bytes."""
    return float(np.interp(min(max(share, 0.0), 1.0), SHARES, PROFILE_HITS[profile]))


def expected_hits_line(share: float) -> str:
    """`high 81%, medium 71%, low 56%, uniform 24%` at `share` 0.25."""
    return ", ".join(f"{p} {expected_pool_hits(share, p):.0%}" for p in PROFILES)
