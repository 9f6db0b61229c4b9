"""The benchmark's quick mode, run as a user runs it: one JSON object with sane values.

No timing assertions: this machine is shared and timings are noise. Traffic figures are exact.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_quick_bench_json(tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [
        sys.executable,
        "bench/run.py",
        "--quick",
        "--json",
        "--data",
        str(tmp_path / "data"),
        "--results",
        str(tmp_path / "results"),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    model = result["model"]
    for key in (
        "decode_tok_s",
        "baseline_tok_s",
        "ratio",
        "bytes_read_per_token",
        "peak_rss_bytes",
        "syncs_per_token",
        "ttft_s",
        "page_cache_hit_rate",
        "streamer",
        "mlx_lm",
        "disk",
        "routing",
    ):
        assert key in result, key
    assert result["decode_tok_s"] > 0
    baseline = result["mlx_lm"]
    if baseline.get("fits") is False:
        # the machine's free memory (shared with other jobs) could not hold mlx-lm's resident
        # model beside the reserve: the bench says so and reports no baseline figures
        assert "it does not fit, skipped" in proc.stderr
        assert baseline["needs_bytes"] > model["checkpoint_bytes"]
        assert result["baseline_tok_s"] is None and result["ratio"] is None
        assert result["routing"] is None  # measured on the baseline's run
    else:
        assert result["baseline_tok_s"] > 0
        assert result["ratio"] == pytest.approx(result["decode_tok_s"] / result["baseline_tok_s"])
        assert 0 < result["routing"]["top10pct_experts_share"] <= 1
    # Every decode step reads top_k expert records in every MoE layer (each record's tensors, not
    # its padding to the next 16 KiB page), with one sync per layer.
    reads = model["top_k"] * model["moe_layers"]
    assert (
        reads * (model["record_bytes"] - 16384)
        < result["bytes_read_per_token"]
        <= reads * model["record_bytes"]
    )
    assert result["syncs_per_token"] == model["moe_layers"]
    assert result["syncs_per_moe_layer"] == 1
    assert 0 <= result["page_cache_hit_rate"] <= 1
    assert result["peak_rss_bytes"] > model["resident_bytes"]
    streamer = result["streamer"]
    assert (
        streamer["decode_tok_s"]["min"]
        <= streamer["decode_tok_s"]["median"]
        <= streamer["decode_tok_s"]["max"]
    )
    assert streamer["split"]["read_ms_per_token"] >= 0 and streamer["peak_mlx_bytes"] > 0
    assert result["disk"]["pread_gbps"] > 0
    saved = json.loads((tmp_path / "results" / "quick-warm.json").read_text())
    assert saved["decode_tok_s"] == result["decode_tok_s"]


@pytest.fixture
def bench_path(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))  # bench/ is a folder of scripts, not a package


def test_routing_profile_reaches_every_worker_and_names_the_result(bench_path):
    """bench/run.py --routing PROFILE: every worker the scenarios start (common_args) gets the
    profile, and the result's file is named by it, so runs at different routings never overwrite
    each other; without it the workers keep the checkpoint's routing and the name is as before."""
    from engines import common_args
    from run import parser, result_name

    routed = parser().parse_args(["cold", "--routing", "medium", "--dtype", "float32"])
    plain = parser().parse_args(["cold", "--dtype", "float32"])
    args = common_args(routed, repeats=1)
    assert args[args.index("--routing") + 1] == "medium"
    assert "--routing" not in common_args(plain)
    names = {
        result_name("m", plain),
        result_name("m", routed),
        result_name("m", parser().parse_args(["cold", "--routing", "uniform"])),
        result_name("m", parser().parse_args(["cold", "--routing", "medium", "--tag", "t"])),
    }
    assert result_name("m", plain) == "m-cold" and len(names) == 4
    with pytest.raises(SystemExit):  # not a profile: argparse's one-line error
        parser().parse_args(["warm", "--routing", "sticky"])


def test_balloon_refuses_to_starve_the_machine(bench_path):
    from balloon import Balloon, BalloonError, mem_available

    with pytest.raises(BalloonError, match="must stay available"):
        with Balloon(mem_available(), reserve=1 << 30):
            pass


def test_next_layer_guesses_on_the_demo_model(bench_path, tmp_path):
    """bench/next_layer.py on the trained demo model: the true routing rebuilt from the recorded
    hidden states is the routing the experts got (checked inside), recalls are fractions, 2k
    guesses find at least what k find, and the next router on this layer's residual guesses far
    better than chance (k / experts = 0.125); beside a pool of a quarter of the experts, the share
    of its misses each guess fetches ahead is a fraction, larger with 2k, and nothing for the
    last token's experts (the pool has just taken them)."""
    from next_layer import GUESSES, main

    out = tmp_path / "recall.json"
    main(["--max-tokens", "512", "--out", str(out)])
    recall = json.loads(out.read_text())
    for guess in GUESSES:
        k, twice = recall[f"{guess} k"], recall[f"{guess} 2k"]
        assert len(k) == 3 and all(0 <= a <= b <= 1 for a, b in zip(k, twice))
        covers = [recall[f"{guess} {n} covers"] for n in ("k", "2k")]
        assert all(0 <= a <= b <= 1 for a, b in zip(*covers))  # 2k fetches what k does, and more
        assert all(e >= 0 for n in ("k", "2k") for e in recall[f"{guess} {n} extra"])
    assert min(recall["early k"]) > 0.25 and min(recall["late k"]) > 0.25
    # the last token's experts are what the pool just took: guessing them fetches nothing
    assert recall["previous token k covers"] == [0, 0, 0]
    assert recall["previous token k extra"] == [0, 0, 0]
    assert min(recall["late k covers"]) > 0.25


def test_settle_interval_replays_the_schedules(bench_path, tmp_path):
    """bench/settle_interval.py: an expert routed every token misses once synced and on every
    token until the first settle deferred (a token more when the settle leaves the last token's
    calls for the next, as the pool's own does); on the demo model each schedule settles as often as
    it says and misses no more than it routes."""
    from settle_interval import SCHEDULES, main, misses_under

    tokens = [[np.array([3])] for _ in range(20)]  # one layer, expert 3 every token
    prefill = [np.array([], dtype=int)]
    assert sum(misses_under(prefill, tokens, 8, 2, None, 0)["misses"]) == 1
    assert sum(misses_under(prefill, tokens, 8, 2, [16], 0)["misses"]) == 16
    assert misses_under(prefill, tokens, 8, 2, [1, 2, 4, 8, 16], 0)["misses"][:2] == [1, 0]
    assert misses_under(prefill, tokens, 8, 2, [1, 2, 4, 8, 16], 1)["misses"][:3] == [1, 1, 0]
    out = tmp_path / "settle.json"
    main(["--prompts", "2", "--decode", "64", "--budgets", "0.25", "--out", str(out)])
    rows = {row["schedule"]: row for row in json.loads(out.read_text())["results"]}
    assert set(rows) == set(SCHEDULES)
    settles = {"synced": 0, "every 16": 4, "every 4": 16, "1, 2, 4, 8, 16": 7}  # of 64 tokens
    settles["1, 2, 4, 8, 16, a token behind"] = 7
    for name, row in rows.items():
        assert row["settles"] == settles[name]
        assert 0 < row["misses_first_16"] <= row["misses_all"] <= 64 * row["routed_per_token"]


def test_generate_rounds_on_the_demo_model(bench_path, tmp_path):
    """bench/generate_rounds.py: each round's rate and a time per decode piece, for both engines
    (streamer on the demo model repacked, mlx-lm on its download), both ways for streamer."""
    from generate_rounds import main

    from streamer.cli import DEMO_MODEL
    from streamer.repack import repack

    repacked = tmp_path / "demo"
    repack(DEMO_MODEL, repacked, log=lambda _: None)
    for engine, folder in (("mlx_lm", DEMO_MODEL), ("streamer", repacked)):
        out = tmp_path / f"{engine}.json"
        main([engine, str(folder), "--max-tokens", "6", "--rounds", "2", "--out", str(out)])
        rounds = json.loads(out.read_text())["rounds"]
        assert len(rounds) == 2 * (1 if engine == "mlx_lm" else 2)
        for r in rounds:
            assert r["decode_tok_s"] > 0 and len(r["ms_per_piece"]) == 5


def test_sizes_parse_as_streamers_options_do(bench_path):
    """bench/run.py's sizes by streamer's rule: its own parser took -1G (a negative reserve, a
    budget refused only by the worker, after the checkpoints were made), 8Gi, and 8 as 8 bytes."""
    from run import parser

    args = parser().parse_args(["--available", "6G,512M", "--reserve", "1.5GiB"])
    assert args.available == [6 << 30, 512 << 20] and args.reserve == 3 << 29
    for flag in ("--reserve=-1G", "--memory-budget=8Gi", "--disk-budget=8"):
        with pytest.raises(SystemExit):
            parser().parse_args([flag])


def test_speculative_bench_quick(tmp_path):
    """bench/speculative.py on the quick shape (it asserts every drafted run prints the plain
    run's tokens), then its plot and tables; traffic is exact, timings are not checked."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    out = tmp_path / "speculative.json"
    cmd = [sys.executable, "bench/speculative.py", "--preset", "quick", "--layers", "2"]
    cmd += ["--tokens", "8", "--rates", "0,1", "--budgets", "8M", "--data", str(tmp_path)]
    cmd += ["--prompt-lookup"]
    proc = subprocess.run(
        [*cmd, "--results", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    warm, squeezed = result["curves"]
    for curve in (warm, squeezed):
        none, every = curve["oracle"]
        assert none["acceptance"] == 0 and every["acceptance"] == 1
        assert every["tokens_per_pass"] == 4 and none["tokens_per_pass"] == 1
        assert none["wasted_mb_per_token"] > 0 == every["wasted_mb_per_token"]
        assert [r["drafter"] for r in curve["drafters"]] == ["prompt lookup"]
        assert all(r["exact"] for r in curve["oracle"] + curve["drafters"])
        # on the CPU a verify pass computes each position bit for bit as a single step does,
        # so the oracle drafts plain decoding's own tokens
        assert curve["pass_against_steps"]["identical"]
        assert curve["plain"]["oracle_truth"] == "plain"
    assert squeezed["regime"] == "squeezed, slot pool 0.00781 GiB (53% of the experts)"
    assert "PASS speculative greedy output on cpu: 6 drafted runs" in proc.stderr
    # the slot pool syncs once per layer and pass (in place, a cached file needs no sync at all)
    assert squeezed["oracle"][1]["syncs_per_token"] * 4 == squeezed["plain"]["syncs_per_token"]
    assert {(r["drafter"], r["text"]) for r in result["acceptance"]} == {
        ("prompt lookup", "code"),
        ("prompt lookup", "prose"),
    }
    plot = subprocess.run(
        [sys.executable, "bench/speculative_plot.py", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert plot.returncode == 0 and "break-even" in plot.stdout, plot.stderr[-3000:]
    assert out.with_suffix(".png").stat().st_size > 0
    assert "| | prompt lookup |" in plot.stdout


def test_speculative_exactness_says_where_output_differs(bench_path):
    """The GPU check's verdict: the first token a drafted run changed, and plain's own repeats."""
    from speculative import exactness, first_difference

    assert first_difference([1, 2, 3], [[1, 2, 3], [1, 5, 3], [1, 2]]) == 1
    assert first_difference([1, 2, 3], [[1, 2, 3]]) is None
    plain = {"repeats_agree": True}
    same = {"rate": 1.0, "exact": True, "first_difference": None}
    off = {"drafter": "prompt lookup", "exact": False, "first_difference": 7}
    curve = {"regime": "slot pool 4 GiB", "plain": plain, "oracle": [same], "drafters": [off]}
    result = {"settings": {"device": "cuda"}, "curves": [curve]}
    assert exactness(result) == (
        "FAIL speculative greedy output on cuda: slot pool 4 GiB, prompt lookup: first differs "
        "at token 7"
    )
    curve["drafters"] = []
    assert exactness(result).startswith("PASS speculative greedy output on cuda: 1 drafted run")


def test_overlap_probe_gathers_once_a_layer_and_changes_nothing(bench_path):
    """bench/cuda_overlap.py's token, with a stand-in gather on the CPU's streams: one gather a
    layer in every gathering mode, on either stream, and none in `compute`; the gathers change
    no value (compute, now and both early modes give one x); a guess routes the asked misses
    outside the pool's slots and the rest inside, none read twice in a token."""
    import mlx.core as mx
    from cuda_overlap import LAYERS, MODES, ROUTED, SLOTS, routed, token

    calls = []

    def gather(guess):
        calls.append(guess)
        return [mx.take(mx.arange(1024 * 4, dtype=mx.float32).reshape(1024, 4), guess, axis=0)]

    weights = [mx.random.normal((2048, 2048), key=mx.random.key(i)) * 0.02 for i in range(2)]
    x = mx.random.normal((1, 2048), key=mx.random.key(9))
    side, own = mx.new_stream(mx.cpu), mx.default_stream(mx.cpu)
    outs = {}
    for mode in MODES:
        calls.clear()
        outs[mode] = token(x, weights, gather, mode, 3, 1, side if mode == "early-side" else own)
        mx.eval(outs[mode])
        assert len(calls) == (0 if mode == "compute" else LAYERS)
    for mode in ("now", "early", "early-side"):
        assert mx.array_equal(outs[mode], outs["compute"])
    guess = routed(x, 3, 1)
    assert guess.size == ROUTED and (guess[:3] >= SLOTS).all() and (guess[3:] < SLOTS).all()
    token_misses = {e for layer in range(LAYERS) for e in routed(x, 3, layer)[:3].tolist()}
    assert len(token_misses) == 3 * LAYERS  # one x, yet no record read twice in a token


def test_a_loop_shape_reaches_the_kernels_asked_for_a_whole_run(bench_path, monkeypatch):
    """bench/cuda_gather_variants.py's use_shape (a bench/paired.py --setup): the kernels built
    after it take the asked blocks per tensor and loads in flight, each in the word its own
    sizes allow: the gather and the fill, or (fill=False) the gather alone, the fill as shipped.
    MLX's kernel builder is recorded, not called (it exists on CUDA only)."""
    from types import SimpleNamespace

    from cuda_gather_variants import use_shape

    from streamer.io import cuda_gather

    for name in ("GATHER_SHAPE", "FILL_SHAPE"):
        monkeypatch.setattr(cuda_gather, name, getattr(cuda_gather, name))  # restored after
    built = []

    def record(**kwargs):
        built.append(kwargs)
        return lambda **call: built.append(call) or [mx.zeros((1,), mx.uint32)]

    monkeypatch.setattr(mx.fast, "cuda_kernel", record)
    tensors = [SimpleNamespace(nbytes=n, dtype=mx.uint8) for n in (786432, 4096)]
    addresses = np.full((1, 2), 1 << 20, dtype=np.uint64)

    def kernels() -> tuple[int, str, int, str]:
        """The gather's and the fill's threads per tensor and source, as built now."""
        built.clear()
        gather = cuda_gather.ExpertGather(tensors, alignment=16384)
        cuda_gather.SlotFill(tensors)(np.array([0], np.uint32), addresses, [])
        return gather._threads, built[0]["source"], built[2]["grid"][0], built[1]["source"]

    shipped = kernels()
    assert shipped[0] == 2 * cuda_gather.THREADS and "uint4 w[8]" in shipped[1]
    assert shipped[2] == 64 * cuda_gather.THREADS and "uint4 w[1]" in shipped[3]
    use_shape(16, 4, fill=False)
    threads, gather, fill_threads, fill = kernels()
    assert threads == 16 * cuda_gather.THREADS and "uint4 w[4]" in gather
    assert (fill_threads, fill) == shipped[2:]
    use_shape(16, 4)
    threads, gather, fill_threads, fill = kernels()
    assert fill_threads == 16 * cuda_gather.THREADS and "uint4 w[4]" in fill


def test_peers_run_here_as_on_a_mac(bench_path, monkeypatch, tmp_path):
    """bench/peers.py's stand-ins: Metal's working-set size reported from the machine's memory,
    macOS's F_NOCACHE taken as no read-ahead (every other fcntl command as before); the budgets
    parsed per peer; nunspark's one layer slot routed by the routing model for the layer it runs,
    its own router back after each layer."""
    import fcntl
    from types import SimpleNamespace

    import mlx.core as mx
    import mlx.nn as nn
    from peers import route, stand_ins
    from squeezed_io import peer_budgets

    had_nocache = hasattr(fcntl, "F_NOCACHE")
    monkeypatch.setattr(mx, "device_info", mx.device_info)
    monkeypatch.setattr(fcntl, "fcntl", fcntl.fcntl)
    try:
        stand_ins()
        assert mx.device_info()["max_recommended_working_set_size"] > 1 << 30
        with open(tmp_path / "f", "wb") as f:
            assert fcntl.fcntl(f.fileno(), fcntl.F_NOCACHE, 1) == 0
            assert fcntl.fcntl(f.fileno(), fcntl.F_GETFL) & os.O_WRONLY
    finally:
        if not had_nocache:
            del fcntl.F_NOCACHE
    assert peer_budgets("nunspark=0.75,bigrig=1") == {
        "boyle": 2 * 10**9,
        "nunspark": 750_000_000,
        "bigrig": 10**9,
    }
    with pytest.raises(SystemExit, match="PEER=GB"):
        peer_budgets("llama=1")

    class Engine:  # nunspark's StreamingEngine, as far as route() reaches into it
        _router_attr = "gate"
        args = SimpleNamespace(num_experts=16, num_experts_per_tok=2)

        def _moe_attn_and_mix(self, slot, layer, h, mask, cache):
            return getattr(slot.mlp, self._router_attr)(h)

    engine, real = Engine(), nn.Linear(8, 16)
    slot = SimpleNamespace(mlp=SimpleNamespace(gate=real))
    positions = route(engine, "medium", SimpleNamespace(num_layers=3))
    positions.start(0, 4)
    picked = [engine._moe_attn_and_mix(slot, layer, mx.zeros((1, 1, 8)), None, None)
              for layer in range(3)]  # fmt: skip
    assert slot.mlp.gate is real
    for layer, logits in enumerate(picked):
        assert (logits > -100).sum().item() == 2  # the profile's two experts, the rest off
        assert mx.array_equal(logits[0], positions.logits[layer][:1])


def test_a_slow_disk_throttles_the_whole_disk(bench_path, tmp_path):
    """bench/slow_disk.py names the disk a file lies on as the kernel's throttles take it: a
    whole disk's MAJOR:MINOR, never a partition's."""
    from slow_disk import disk_of

    disk = disk_of(tmp_path)
    sysfs = Path(f"/sys/dev/block/{disk}")
    if not sysfs.exists():
        pytest.skip(
            f"{tmp_path} lies on no block device (e.g. a tmpfs or overlay): nothing to name"
        )
    assert not (sysfs / "partition").exists()
    assert (sysfs / "dev").read_text().strip() == disk


def test_generated_checkpoint_progress_says_binary_units(bench_path, tmp_path):
    """Its progress said "0.01/0.01 GB (12 MB/s)": decimal units, where every size streamer
    prints is binary (streamer/io/sizes.py)."""
    from generate_checkpoint import write_checkpoint
    from presets import PRESETS

    said: list[str] = []
    write_checkpoint(tmp_path / "ckpt", PRESETS["quick"], sparse=True, log=said.append)
    last = [line for line in said if line.startswith("[generate]")][-1]
    assert re.match(r"\[generate\] \S+ [KMG]iB of \S+ [KMG]iB \(\S+ [KMG]iB/s\) ", last), last


def test_the_threads_asked_of_the_bench_are_the_threads_it_ran_and_records(
    bench_path, checkpoints, capsys
):
    """`bench/run.py --threads 0` ran streamer's workers on every core (common_args dropped a 0)
    while the result's settings said 0; and a worker's result never said what its load decided
    (`--threads 1000`: the cores this process may use)."""
    from engines import common_args
    from run import parser
    from worker import main as worker

    from streamer.cpu_cores import usable_cores

    with pytest.raises(SystemExit):
        parser().parse_args(["cold", "--threads", "0"])
    assert "0 cores: give 1 or more" in capsys.readouterr().err
    asked = common_args(parser().parse_args(["cold", "--threads", "1"]))
    assert asked[asked.index("--threads") + 1] == "1"
    assert "--threads" not in common_args(parser().parse_args(["cold"]))
    folder = checkpoints.repacked(checkpoints.mlx("qwen3_moe"))
    words = ["--prompt-tokens", "4", "--decode-tokens", "2", "--repeats", "1", "--threads", "1000"]
    worker(["streamer", str(folder), *words])
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["threads"] == usable_cores()
