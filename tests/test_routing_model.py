"""bench/routing_model.py (the routing model fitted to published cache curves, and its replay) and
bench/worker.py --routing (that model in place of both engines' routers)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))  # scripts, not a package

from routing_model import PROFILES, RoutingModel, overlap, replay  # noqa: E402

RANGES = {  # hits at 25% of each layer's experts, per-layer LRU (issue 35)
    "high": (0.70, 0.88),
    "medium": (0.55, 0.82),
    "low": (0.40, 0.65),
    "uniform": (0.22, 0.28),
}


def test_the_check_interface():
    """The command issue 35 names, exactly: one JSON object whose hits are keyed by the budgets
    as given, every one a rate, never fewer with more cache."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [sys.executable, "bench/routing_model.py", "--profile", "medium", "--experts", "128"]
    cmd += ["--top-k", "8", "--budgets", "0.125,0.25,0.5", "--policy", "lru"]
    cmd += ["--tokens", "2000", "--json"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    hits = json.loads(proc.stdout)["hits"]
    assert list(hits) == ["0.125", "0.25", "0.5"]
    assert RANGES["medium"][0] < hits["0.25"] < RANGES["medium"][1]
    assert hits["0.125"] <= hits["0.25"] <= hits["0.5"] < 1


@pytest.mark.parametrize("profile", list(RANGES))
def test_each_profile_in_its_range_and_monotonic(profile):
    """Fewer layers than the check's 48 (layers are drawn independently: only the noise grows),
    the same tokens; the range holds for two seeds."""
    for seed in (0, 1):
        model = RoutingModel(profile, 128, 8, layers=8, seed=seed)
        result = replay(model, [0.125, 0.25, 0.5], "lru", tokens=2000, prompts=4)
        low, high = RANGES[profile]
        assert low < result["hits"][1] < high, (profile, seed, result)
        assert result["hits"][0] <= result["hits"][1] <= result["hits"][2]
        # the cold start of a prompt hits less than its steady state (uniform: no locality)
        if profile != "uniform":
            assert result["cold"][1] < result["steady"][1]


def test_seeded_and_prefix_stable():
    a = RoutingModel("high", 128, 8, layers=6, seed=3)
    b = RoutingModel("high", 128, 8, layers=6, seed=3)
    long = a.prompt(2, 100)
    assert np.array_equal(long, b.prompt(2, 100))
    assert np.array_equal(
        long[:40], b.prompt(2, 40)
    )  # a prompt's routing does not depend on length
    assert not np.array_equal(long, a.prompt(3, 100))  # another prompt, another working set
    assert not np.array_equal(long, RoutingModel("high", 128, 8, layers=6, seed=4).prompt(2, 100))
    # k distinct experts per (token, layer), all valid
    assert long.shape == (100, 6, 8)
    assert all(len(set(row)) == 8 for row in long.reshape(-1, 8).tolist())
    assert long.min() >= 0 and long.max() < 128


def test_reuse_between_tokens_ordered_by_profile():
    """Consecutive-token overlap: high (Qwen3-30B-A3B: about 45% published) above medium above
    low, and uniform at chance (k / N)."""
    share = {
        name: overlap(RoutingModel(name, 128, 8, layers=8).prompt(0, 300)) for name in PROFILES
    }
    assert share["high"] > share["medium"] > share["low"] > share["uniform"]
    assert abs(share["uniform"] - 8 / 128) < 0.02


def test_pool_policies_replay_the_real_classes():
    """The pool's policies replay through cache/policies.py, grouped as the slot pools are, and
    also never lose hits with more slots."""
    model = RoutingModel("medium", 128, 8, layers=12)
    for policy in ("pool", "pool-lru", "lfu"):
        hits = replay(model, [0.125, 0.25, 0.5], policy, tokens=600, prompts=2)["hits"]
        assert 0 < hits[0] <= hits[1] <= hits[2] < 1, (policy, hits)


def test_the_optimum_bounds_every_policy():
    """`opt` (Belady: knows the future) evicts the expert routed again latest: on a b c a b with
    two slots it keeps a (one hit) where LRU keeps none; on the routing model it has at least the
    hits of every online policy with as many slots per layer."""
    from routing_model import POLICIES

    trace = np.array([0, 1, 2, 0, 1]).reshape(5, 1, 1)
    assert POLICIES["opt"]([trace], 4, 0.5)[0].ravel().tolist() == [0, 0, 0, 1, 0]
    assert POLICIES["lru"]([trace], 4, 0.5)[0].sum() == 0
    model = RoutingModel("medium", 128, 8, layers=6)
    best = replay(model, [0.125, 0.25], "opt", tokens=400, prompts=2)["hits"]
    for policy in ("lru", "lfu"):
        hits = replay(model, [0.125, 0.25], policy, tokens=400, prompts=2)["hits"]
        assert all(h <= b for h, b in zip(hits, best)), (policy, hits, best)


def test_static_holds_each_prompts_most_routed_experts():
    """`static` (hindsight: each prompt's most routed experts per layer, held throughout): on
    a a b a c with one slot it holds a (3 hits); on the routing model it has at least the hits of
    the pool's own LFU, which learns those frequencies as it goes, and no more than Belady's."""
    from routing_model import POLICIES

    trace = np.array([0, 0, 1, 0, 2]).reshape(5, 1, 1)
    assert POLICIES["static"]([trace], 4, 0.25)[0].ravel().tolist() == [1, 1, 0, 1, 0]
    model = RoutingModel("medium", 128, 8, layers=6)
    static = replay(model, [0.125, 0.25], "static", tokens=400, prompts=2)["hits"]
    lfu = replay(model, [0.125, 0.25], "lfu", tokens=400, prompts=2)["hits"]
    best = replay(model, [0.125, 0.25], "opt", tokens=400, prompts=2)["hits"]
    assert all(a <= b <= c for a, b, c in zip(lfu, static, best)), (lfu, static, best)


def test_bad_budgets_are_one_line_errors():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for budgets in ("0.25,x", "0,0.5", "1.5", "0.01"):  # 0.01: fewer slots than top-k
        cmd = [sys.executable, "bench/routing_model.py", "--profile", "low", "--budgets", budgets]
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0
        assert "Traceback" not in proc.stderr and "budget" in proc.stderr


def test_worker_routing_same_experts_in_both_engines(checkpoints):
    """--routing's gates make mlx-lm's resident model and streamer's streamed one (a slot pool
    smaller than the experts) route every prompt and decode position through the same experts:
    the routing model's."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from profile_routing import install
    from worker import load, prompt_ids

    from streamer.families.architectures import recording_routing

    src = checkpoints.mlx("qwen3_moe", dtype="float32")
    traces = {}
    for engine, folder in (("mlx_lm", src), ("streamer", checkpoints.repacked(src))):
        model = load(engine, folder, memory_budget=1 << 16, read_path="slots")
        positions = install(model, "high", seed=5)
        positions.start(7, 6 + 5 + 2)
        with recording_routing(model, prefill=True) as trace:
            for _ in generate_step(prompt_ids(6, seed=7), model, max_tokens=5):
                pass
            mx.eval(model.parameters())
        traces[engine] = [(layer, sorted(experts)) for layer, experts in trace]
    assert traces["mlx_lm"] == traces["streamer"]
    expected = positions.model.prompt(7, 6 + 5 + 2)  # [positions, layers, k]
    for layer in range(expected.shape[1]):
        routed = [experts for at, experts in traces["mlx_lm"] if at == layer]
        assert len(routed) >= 6 + 4  # the prompt's positions, then each decode step's
        assert routed == [sorted(e) for e in expected[: len(routed), layer].tolist()]


def test_paired_runs_both_engines_prompt_by_prompt(checkpoints, capsys):
    """bench/paired.py: mlx-lm resident and streamer's slot path in one process, ABBA, each pair
    the same tokens through the same routing; the summary is the median pair and the spread."""
    from paired import main
    from test_slots import slot_bytes

    src = checkpoints.mlx("qwen3_moe", dtype="float32")
    folder = checkpoints.repacked(src)
    args = [str(src), str(folder), "--routing", "medium", "--pairs", "3", "--prompt-tokens", "6"]
    args += ["--memory-budget", str(12 * slot_bytes(folder))]
    result = main([*args, "--decode-tokens", "70"])
    assert json.loads(capsys.readouterr().out) == result
    pairs, summary = result["pairs"], result["summary"]
    assert [p["first"] for p in pairs] == ["mlx_lm", "streamer", "mlx_lm"]
    assert summary["same_tokens"] and all(p["same_tokens"] for p in pairs)
    ratios = sorted(p["ratio"] for p in pairs)
    assert summary["ratio_median"] == ratios[1] and summary["ratio_range"] == [ratios[0], ratios[2]]
    assert all(0 < p["hits"] < 1 for p in pairs)  # a pool of some of the experts: both
    for p in pairs:  # the bus floor: mlx-lm's step plus the misses' and copies' bytes
        assert p["bus_mb_per_token"] > 0 and 0 < p["floor_ratio"] < 1
        assert p["to_floor"] == pytest.approx(p["step_ratio"] / p["floor_ratio"])
    assert result["bus_gbps"] == 45.0 and result["kernel_gbps"] is None  # no layer gathers here
    with pytest.raises(SystemExit, match="cold start"):
        main([*args, "--decode-tokens", "20"])
    with pytest.raises(SystemExit, match="bus-gbps"):
        main([*args, "--bus-gbps", "0"])


def test_bus_rate_times_the_gather_kernel_where_layers_gather(checkpoints, monkeypatch):
    """bench/paired.py's `bus_rate`: the gather kernel (here its CPU stand-in) reading experts
    from the files with no slot named, timed; None where no layer gathers (this CPU's own)."""
    from paired import bus_rate
    from test_slots import gathered_model, slot_bytes

    import streamer

    folder = checkpoints.repacked(checkpoints.mlx("qwen3_moe", dtype="float32"))
    plain, _ = streamer.load(folder, memory_budget=6 * slot_bytes(folder), read_path="slots")
    assert bus_rate(plain) is None
    plain.streamer.close()
    model, _, stand_ins, _ = gathered_model(monkeypatch, folder, 6, "fill")
    assert bus_rate(model, experts=4, repeats=2) > 0
    assert sum(s.calls for s in stand_ins.values()) == 2 and not any(
        s.hits for s in stand_ins.values()
    )
    model.streamer.close()


def test_paired_plot_draws_the_pairs_beside_the_bus_floor(tmp_path):
    """bench/paired_plot.py: a PNG of the pairs and the floor from their bytes a token; a run
    that counted none is refused unless --mb-per-token gives them."""
    from paired_plot import main

    pair = {"mlx_lm_step_ms": 11.0, "step_ratio": 0.5, "bus_mb_per_token": 300.0}
    counted, older = tmp_path / "m1.json", tmp_path / "m0.json"
    counted.write_text(json.dumps({"pairs": [pair, {**pair, "mlx_lm_step_ms": 25.0}]}))
    older.write_text(json.dumps({"pairs": [{"mlx_lm_step_ms": 12.0, "step_ratio": 0.6}]}))
    main([str(tmp_path / "a.png"), str(counted), "--goal", "0.8"])
    assert (tmp_path / "a.png").stat().st_size > 10_000
    with pytest.raises(SystemExit, match="mb-per-token"):
        main([str(tmp_path / "b.png"), str(counted), str(older)])
    main([str(tmp_path / "b.png"), str(counted), str(older), "--mb-per-token", "306"])
    assert (tmp_path / "b.png").exists()


def test_step_bytes_plot_fits_the_step_to_the_bytes(tmp_path):
    """bench/step_bytes_plot.py: pairs on a known line (8 ms + MB at 40 GB/s) give that line back,
    and a goal the bytes it allows; runs that all moved the same bytes are refused."""
    from step_bytes_plot import main

    def run(name: str, mb: float) -> str:
        pairs = [
            {"bus_mb_per_token": mb, "streamer_step_ms": 8 + mb / 40, "mlx_lm_step_ms": 12.0}
        ] * 2
        (tmp_path / name).write_text(json.dumps({"pairs": pairs}))
        return str(tmp_path / name)

    result = main([str(tmp_path / "a.png"), run("m25.json", 300), run("u25.json", 800)])
    assert result["intercept_ms"] == pytest.approx(8) and result["marginal_gbps"] == pytest.approx(
        40
    )
    assert (tmp_path / "a.png").stat().st_size > 10_000
    goal = main(
        [str(tmp_path / "b.png"), str(tmp_path / "m25.json"), str(tmp_path / "u25.json")]
        + ["--goal", "0.75"]
    )
    assert goal["goal_mb_per_token"] == pytest.approx((12 / 0.75 - 8) * 40)
    with pytest.raises(SystemExit, match="same bytes"):
        main([str(tmp_path / "c.png"), str(tmp_path / "m25.json")])


def test_plans_table_is_the_replay():
    """streamer/cache/expected_hits.py's table (plan's expected hits) is what the replay its
    docstring names gives, recomputed here at one point per profile."""
    from streamer.cache.expected_hits import PER_MILLE, PROFILE_HITS, SHARES

    at = SHARES.index(0.25)
    for profile in ("medium", "uniform"):
        model = RoutingModel(profile, 128, 8, layers=48, seed=0)
        hits = replay(model, [0.25], "pool", tokens=2000, prompts=4)["hits"][0]
        assert round(hits * 1000) == PER_MILLE[profile][at]
    for profile, hits in PROFILE_HITS.items():
        assert len(hits) == len(SHARES) and hits[0] == 0 and hits[-1] == 1
        assert list(hits) == sorted(hits), profile


def test_mac_projection_more_locality_is_faster():
    """The projection's rows: the read path's hits add up, more locality reads less and runs
    faster, and the pool reading around the page cache finds nothing there."""
    from mac_projection import project

    rows = project("16 GB Mac (M4)", ["high", "uniform"], tokens=140)
    by = {(r["profile"], r["path"]): r for r in rows}
    for r in rows:
        assert abs(r["pool"] + r["page_cache"] + r["disk"] - 1) < 1e-9
        assert 0 < r["tok_s_disk_3"] < r["tok_s_disk_9.5"] < 1 / r["compute_s"]
    for path in ("pool + page cache", "pool, F_NOCACHE"):
        assert by["high", path]["tok_s_disk_3"] > by["uniform", path]["tok_s_disk_3"]
    assert by["high", "pool, F_NOCACHE"]["page_cache"] == 0


def _evaluated(array) -> bool:
    """Whether `array` has been computed: MLX detaches an evaluated array from its graph, so its
    graph is then one source node and no operation."""
    import io

    import mlx.core as mx

    dot = io.StringIO()
    mx.export_to_dot(dot, array)
    return "shape=rectangle" not in dot.getvalue()


def test_profile_router_sync_waits_for_the_hidden_state(checkpoints, monkeypatch):
    """Under --routing, streamer's routing sync (the slot path's host_routing) returns only once
    the router's input is computed, as with a real router, so the previous layer's compute is
    counted in sync_seconds and not in the read path's fence (read_seconds); the routed experts
    stay the routing model's."""
    import mlx.core as mx
    import numpy as np
    from mlx_lm.generate import generate_step
    from profile_routing import ProfileGate, install
    from worker import load, prompt_ids

    import streamer.experts.slots as slots

    inputs, checked = [], []
    gate_call = ProfileGate.__call__

    def recording_gate(self, x):
        inputs.append(x)
        return gate_call(self, x)

    def routing_then_check(layer, indices, traffic):
        out = real_routing(layer, indices, traffic)
        checked.append(_evaluated(inputs[-1]))  # the input of the router this call routes by
        return out

    real_routing = slots.host_routing
    monkeypatch.setattr(ProfileGate, "__call__", recording_gate)
    monkeypatch.setattr(slots, "host_routing", routing_then_check)
    folder = checkpoints.repacked(checkpoints.mlx("qwen3_moe", dtype="float32"))
    model = load("streamer", folder, memory_budget=1 << 16, read_path="slots")
    positions = install(model, "medium", seed=3)
    positions.start(0, 6 + 4 + 2)
    for _ in generate_step(prompt_ids(6, seed=0), model, max_tokens=4):
        assert not _evaluated(inputs[-1] + 1)  # the probe itself: a fresh op is not computed
    assert len(checked) >= 2 * 4 and all(checked), checked
    used = positions.used[0]
    logits = ProfileGate(positions, 0)(mx.zeros((1, 2, 8)))  # the values are the model's own
    assert np.array_equal(np.array(logits[0]), np.array(positions.logits[0][used : used + 2]))


def test_overlap_plot_draws_every_run(tmp_path):
    """bench/overlap_plot.py: each bench/cuda_overlap.py run becomes a group of bars in one PNG."""
    from overlap_plot import MODES, main

    runs = []
    for i, hidden in enumerate((0.02, -0.25)):
        run = {f"{mode}_ms": 5.0 + j + i for j, mode in enumerate(MODES)}
        run |= {"hidden_early": hidden, "hidden_early-side": -1.0}
        runs.append(tmp_path / f"run{i}.json")
        runs[-1].write_text(json.dumps(run))
    out = tmp_path / "overlap.png"
    drawn = main([str(out), *map(str, runs)])
    assert [r["hidden_early"] for r in drawn] == [0.02, -0.25]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
