"""The peers on this CPU, under the routing model: boyle, nunspark and bigrig as points of
bench/squeezed_io.py (issue 35's goal: squeezed tok/s at the medium profile 1.5x the best peer's).

    pip install boyle==0.2.1 nunspark==0.13.0 bigrig==0.9.1  # pure-Python wheels: mlx, mlx-lm
    python bench/squeezed_io.py --routing medium --temp 0 \
        --points slots,mapped,boyle,nunspark,bigrig

All are Apple-silicon engines, but pure Python over mlx and mlx-lm, so they run on mlx[cpu]. These
things of theirs are Metal's or macOS's, and are stood in for here (nothing else is changed):
- boyle reads `max_recommended_working_set_size` from `mx.device_info()`, which the CPU backend
  does not report: it gets the machine's memory, and only caps boyle's wired limit (a no-op here).
- boyle's expert reads are preads on descriptors marked with macOS's F_NOCACHE (no read-ahead,
  nothing added to the page cache), which Linux lacks: here the mark is POSIX_FADV_RANDOM (no
  read-ahead; what it reads stays cached as the squeezed cgroup allows). boyle's other way,
  `direct=False`, copies out of a mapping and read 4x its bytes here (the kernel's fault-around).
- nunspark wires memory the same way and, without the key, leaves it (its own fallback).
- bigrig (bigrig_engine.calibrate) runs macOS's `vm_stat` for free memory and compressor growth,
  and `sysctl -n hw.memsize` for installed memory (its ceiling, 35% of it, is set from that at
  import): here `vm_stat`'s pages free are Linux's MemAvailable, its swapouts /proc/vmstat's
  pswpout and its compressor empty (Linux has none), and hw.memsize is the machine's memory.
  bigrig's F_NOCACHE is its own constant, used only with `nocache=True` (off by default: it reads
  through mappings of its blob), so it needs none.

bigrig's budget: bigrig plans against a whole-process ceiling (`--memory`) of which it holds back
3.4 GB (the OS and runtime, a 3 GB working-memory reserve measured on Metal, its prompt cache),
so it refuses any ceiling under 4.7 GB for the 12-layer model. Its own way past that is
an explicit residency (`capacity`, "an explicit request always wins"; it warns and runs): here the
budget is bigrig's expert pool, `budget // (layers * bytes per expert)` experts a layer (at least
top-k), with the ceiling set to the same bytes. Its planner then holds some layers whole at the same
memory (`plan_full_layers`) and fills those at load, rebinding a layer's (128, ...) tensors once
an expert: the load peaks at about 1.6x the pool (3.3 GB at 2 GB), so under a 2.9 GiB squeeze a
2 GB pool is killed while it loads and 1 GB runs. Its packed blob (`ensure_packed`, what its first
run makes: the one layout its zero-copy admit path reads) is made once beside the MLX folder, in a
BIGRIG_HOME of its own (`packed_bigrig`), where its other state (knee, usage, consent) would go.
It decodes with mlx-lm's generate_step on its own model, as its Session does (stream_generate);
its next-layer staging is off by default (BIGRIG_STAGE), so its routers are its MoE blocks' gates
only.

The routing model (bench/profile_routing.py) replaces each peer's routers as it does mlx-lm's and
streamer's: boyle and bigrig keep mlx-lm's MoE blocks (gate beside switch_mlp) and swap only the
expert container, so `install` finds them; nunspark runs one reusable layer slot, so each layer's
router is swapped for the routing model's while that layer runs. Every engine then computes the same
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

# Each peer's budget in GB where --peer-budgets names none: what a 2.9 GiB squeeze holds (bigrig's
# load at 2 GB outgrows it: the module's note)
BUDGETS_GB = {"boyle": 2, "nunspark": 2, "bigrig": 1}
PEERS = tuple(BUDGETS_GB)
NOCACHE = -48  # F_NOCACHE's stand-in: no fcntl command has a negative number


def machine_memory() -> int:
    """Bytes of memory this machine has (what the stand-ins report for Metal's and macOS's)."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def mlx_lm_tokens(model, prompt: mx.array, max_tokens: int, temp: float) -> Iterator[int]:
    """Token ids from mlx-lm's generate_step on `model` (worker.py's seeded sampler): how boyle
    and bigrig decode (their own loops are mlx-lm's), and streamer."""
    from worker import tokens

    for token, _ in tokens(model, prompt, max_tokens, temp):
        yield int(token)


def stand_ins() -> None:
    """What the peers read from Metal, as the CPU backend would report it (the module's note)."""
    reported = mx.device_info

    def device_info() -> dict:
        memory = machine_memory()
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


def bigrig_stand_ins() -> None:
    """bigrig's `vm_stat` and `sysctl hw.memsize`, as Linux reports them (the module's note);
    before bigrig_engine.session is imported, which sets its ceiling from installed memory."""
    from bigrig_engine import calibrate

    def vm_stat(key: str) -> int:
        if key == "Pages free":
            with open("/proc/meminfo") as f:
                kib = next(int(ln.split()[1]) for ln in f if ln.startswith("MemAvailable:"))
            return kib * 1024 // calibrate.PAGE
        if key == "Swapouts":
            with open("/proc/vmstat") as f:
                return next((int(ln.split()[1]) for ln in f if ln.startswith("pswpout ")), 0)
        return 0  # speculative, purgeable, inactive, compressor: not Linux's

    calibrate._vm = vm_stat
    calibrate.total_gb = lambda: machine_memory() / 1e9


def packed_bigrig(mlx_folder: Path) -> Path:
    """bigrig's home beside `mlx_folder`, its packed expert blob in it (`ensure_packed`), once."""
    home = mlx_folder.with_name(mlx_folder.name + "-bigrig")
    os.environ["BIGRIG_HOME"] = str(home)
    from bigrig_engine import stream

    stream.ensure_packed(str(mlx_folder))
    return home


def packed_nunspark(mlx_folder: Path) -> Path:
    """nunspark's own layout of `mlx_folder` (`nunspark pack`), beside it, once."""
    packed = mlx_folder.with_name(mlx_folder.name + "-nunspark")
    if not (packed / "manifest.json").exists():
        from nunspark.packer import pack

        pack(mlx_folder, packed)
    return packed


class Boyle:
    """boyle 0.2.1 at `budget` bytes (all it wires: resident weights, expert slots, KV)."""

    def __init__(self, mlx_folder: Path, budget: int, routing: str, temp: float):
        self.temp = temp
        from boyle import loader

        # headroom: boyle's default 4 GB of activations would not fit the squeeze; 12 layers of
        # batch-1 decode need far less
        self.engine = loader.load(mlx_folder, budget=budget, headroom=256 << 20, max_context=512)
        self.files = sorted(mlx_folder.glob("*.safetensors"))
        from profile_routing import install

        self.positions = install(self.engine.model, routing) if routing else None
        self.residency = f"boyle: {self.engine.plan}"

    def tokens(self, prompt: mx.array, max_tokens: int) -> Iterator[int]:
        return mlx_lm_tokens(self.engine.model, prompt, max_tokens, self.temp)


class Nunspark:
    """nunspark 0.13.0's StreamingEngine at `budget` bytes of pieces (its `--budget`)."""

    def __init__(self, mlx_folder: Path, budget: int, routing: str, temp: float):
        self.temp = temp
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

        yield from stream_generate(
            self.engine, prompt.tolist(), max_tokens=max_tokens, temp=self.temp
        )


class Bigrig:
    """bigrig 0.9.1's Session with an expert pool of `budget` bytes (the module's note)."""

    def __init__(self, mlx_folder: Path, budget: int, routing: str, temp: float):
        self.temp = temp
        bigrig_stand_ins()
        home = packed_bigrig(mlx_folder)
        from bigrig_engine import session, stream

        manifest, blob = stream.expert_source(str(mlx_folder))
        layers = manifest["layers"].values()
        per_expert = max(int(layer["bytes_per_expert"]) for layer in layers)
        experts = max(int(layer["n_experts"]) for layer in layers)
        top_k = stream.model_top_k(str(mlx_folder), manifest)
        capacity = min(experts, max(top_k, budget // (per_expert * len(layers))))
        self.engine = session.Session(
            str(mlx_folder),
            capacity=capacity,
            budget_gb=budget / 1e9,
            monitor=False,
            remember=False,
            persist=False,
            preference="exact",  # never its compress mode: that alters the weights
        )
        self.files = sorted(mlx_folder.glob("*.safetensors")) + [Path(blob)]
        from profile_routing import install

        self.positions = install(self.engine.model, routing) if routing else None
        stats = self.engine.handle.stats()
        self.residency = (
            f"bigrig: {stats['capacity']}/{experts} experts a layer "
            f"({stats.get('resident_gb', 0):.2f} GB pool), "
            f"{stats['full_layers']} layers whole; blob in {home}"
        )

    def tokens(self, prompt: mx.array, max_tokens: int) -> Iterator[int]:
        return mlx_lm_tokens(self.engine.model, prompt, max_tokens, self.temp)


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


def open_peer(name: str, mlx_folder: Path, budget: int, routing: str, temp: float):
    """A peer's engine with `files` (what it reads), `positions`, `residency`, `tokens()` (at
    `temp`, as streamer's point decodes)."""
    stand_ins()
    engine = {"boyle": Boyle, "nunspark": Nunspark, "bigrig": Bigrig}[name]
    return engine(mlx_folder, budget, routing, temp)
