"""What speculative decoding's verify passes cost: the drafts they checked and kept, the tokens
they emitted, and the expert reads only rejected drafts routed to (wasted)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .io.sizes import size_text


@dataclass
class PassCall:
    """One MoE layer call of a speculative verify pass: its routing (evaluated with the pass), what
    one expert read costs there, and the experts it found in memory instead (slot or cache hits)."""

    indices: object  # mx.array [..., inputs, k]
    read_bytes: int
    hits: set[int] = field(default_factory=set)


@dataclass
class Drafts:
    """Speculative decoding: verify passes, the draft tokens they checked and accepted, the tokens
    they emitted, and the expert reads only rejected drafts routed to (wasted)."""

    passes: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    wasted_experts: int = 0
    wasted_bytes: int = 0

    def line(self, wasted_bytes_per_token: float) -> str:
        """The stats line's part for drafts (`wasted_bytes_per_token`: per decoded token)."""
        kept = f"{self.accepted / self.drafted:.0%}" if self.drafted else "n/a"
        return (
            f" | drafts: {self.accepted / self.passes:.1f} of {self.drafted / self.passes:.1f} "
            f"kept per pass ({kept}), {self.emitted / self.passes:.2f} tokens/pass, wasted "
            f"{size_text(wasted_bytes_per_token)}/token"
        )

    def count_pass(self, calls: list[PassCall], drafted: int, accepted: int) -> None:
        """A verify pass over the last token and `drafted` drafts, `accepted` of them kept. An
        expert only the rejected inputs routed to was read for nothing: counted as waste (each
        call's routing was evaluated with the pass: no sync)."""
        self.passes += 1
        self.drafted += drafted
        self.accepted += accepted
        kept = accepted + 1
        for call in calls if kept <= drafted else ():
            routed = np.array(call.indices)
            routed = routed.reshape(-1, routed.shape[-1])  # one row per input, in order
            wasted = set(np.unique(routed[kept:]).tolist()) - set(routed[:kept].ravel().tolist())
            wasted -= call.hits
            self.wasted_experts += len(wasted)
            self.wasted_bytes += len(wasted) * call.read_bytes
