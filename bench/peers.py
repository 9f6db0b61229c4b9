"""The peers on this CPU, under the routing model: boyle and nunspark as points of
bench/squeezed_io.py (issue 35's goal: squeezed tok/s at the medium profile 1.5x the best peer's).

    pip install boyle==0.2.1 nunspark==0.13.0   # pure-Python wheels over mlx and mlx-lm
    python bench/squeezed_io.py --routing medium --temp 0 --points slots,mapped,boyle,nunspark

Both are Apple-silicon engines, but pure Python over mlx and mlx-lm, so they run on mlx[cpu]. Three
things of theirs are Metal's or macOS's, and are stood in for here (nothing else is changed):
- boyle reads `max_recommended_working_set_size` from `mx.device_info()`, which the CPU backend
  does not report: it gets the machine's memory, and only caps boyle's wired limit (a no-op here).
- boyle's expert reads are preads on descriptors marked with macOS's F_NOCACHE (no read-ahead,
  nothing added to the page cache), which Linux lacks: here the mark is POSIX_FADV_RANDOM (no
  read-ahead; what it reads stays cached as the squeezed cgroup allows). boyle's other way,
  `direct=False`, copies out of a mapping and read 4x its bytes here (the kernel's fault-around).
- nunspark wires memory the same way and, without the key, leaves it (its own fallback).

The routing model (bench/profile_routing.py) replaces each peer's routers as it does mlx-lm's and
streamer's: boyle keeps mlx-lm's MoE blocks (gate beside switch_mlp) and swaps only the expert
container, so `install` finds them; nunspark runs one reusable layer slot, so each layer's router
is swapped for the routing model's while that layer runs. Every engine then computes the same
experts at the same positions, and greedy tokens must agree with streamer's.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import mlx.core as mx
from profile_routing import Positions, ProfileGate
from routing_model import RoutingModel

PEERS = ("boyle", "nunspark")
NOCACHE = -48  # F_NOCACHE's stand-in: no fcntl command has a negative number


def stand_ins() -> None:
    """What the peers read from Metal, as the CPU backend would report it (the module's note)."""
    reported = mx.device_info

    def device_info() -> dict:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return {"max_recommended_working_set_size": memory, "memory_size": memory, **reported()}

    mx.device_info = device_info
    if not hasattr(fcntl, "F_NOCACHE"):
        fcntl.F_NOCACHE = NOCACHE
        control = fcntl.fcntl

        def fcntl_call(fd, cmd, arg=0):
            if cmd != NOCACHE:
                return control(fd, cmd, arg)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            return 0

        fcntl.fcntl = fcntl_call


def packed_nunspark(mlx_folder: Path) -> Path:
    """nunspark's own layout of `mlx_folder` (`nunspark pack`), beside it, once."""
    packed = mlx_folder.with_name(mlx_folder.name + "-nunspark")
    if not (packed / "manifest.json").exists():
        from nunspark.packer import pack

        pack(mlx_folder, packed)
    return packed


class Boyle:
    """boyle 0.2.1 at `budget` bytes (all it wires: resident weights, expert slots, KV)."""

    def __init__(self, mlx_folder: Path, budget: int, routing: str):
        from boyle import loader

        # headroom: boyle's default 4 GB of activations would not fit the squeeze; 12 layers of
        # batch-1 decode need far less
        self.engine = loader.load(mlx_folder, budget=budget, headroom=256 << 20, max_context=512)
        self.files = sorted(mlx_folder.glob("*.safetensors"))
        from profile_routing import install

        self.positions = install(self.engine.model, routing) if routing else None
        self.residency = f"boyle: {self.engine.plan}"

    def tokens(self, prompt: mx.array, max_tokens: int) -> Iterator[int]:
        from worker import tokens

        for token, _ in tokens(self.engine.model, prompt, max_tokens, 0.0):
            yield int(token)


class Nunspark:
    """nunspark 0.13.0's StreamingEngine at `budget` bytes of pieces (its `--budget`)."""

    def __init__(self, mlx_folder: Path, budget: int, routing: str):
        from nunspark.engine import StreamingEngine
        from nunspark.manifest import Manifest

        packed = packed_nunspark(mlx_folder)
        manifest = Manifest.load(packed / "manifest.json")
        self.engine = StreamingEngine(packed, manifest, budget_bytes=budget)
        self.files = sorted(p for p in packed.rglob("*") if p.is_file())
        self.positions = None
        if routing:
            self.positions = route(self.engine, routing, manifest)
        self.residency = f"nunspark: {budget} bytes of pieces"

    def tokens(self, prompt: mx.array, max_tokens: int) -> Iterator[int]:
        from nunspark.generate import stream_generate

        yield from stream_generate(self.engine, prompt.tolist(), max_tokens=max_tokens, temp=0.0)


def route(engine, profile: str, manifest) -> Positions:
    """The routing model's gate in nunspark's layer slot while each layer runs."""
    args = engine.args
    experts, top_k = args.num_experts, args.num_experts_per_tok
    positions = Positions(RoutingModel(profile, experts, top_k, manifest.num_layers, 0))
    gates = [ProfileGate(positions, layer) for layer in range(manifest.num_layers)]
    mix = type(engine)._moe_attn_and_mix
    router = engine._router_attr

    def routed_mix(slot, layer, h, mask, cache):
        real = getattr(slot.mlp, router)
        setattr(slot.mlp, router, gates[layer])
        try:
            return mix(engine, slot, layer, h, mask, cache)
        finally:
            setattr(slot.mlp, router, real)

    engine._moe_attn_and_mix = routed_mix
    return positions


def open_peer(name: str, mlx_folder: Path, budget: int, routing: str):
    """A peer's engine with `files` (what it reads), `positions`, `residency`, `tokens()`."""
    stand_ins()
    return {"boyle": Boyle, "nunspark": Nunspark}[name](mlx_folder, budget, routing)
