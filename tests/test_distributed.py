"""Expert-parallel runs: 2 ranks on this machine over MLX's ring backend, started by mlx.launch on
127.0.0.1 exactly as users start them across Macs. Each launch is bounded in time.

Each rank computes the routed experts it owns and one all_sum per MoE layer gives every rank the
single-process output: float32 logits within 1e-5, the same 64 greedy tokens, and each rank
reads only its own share of the experts.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import sys
from pathlib import Path

import numpy as np
import pytest
from mlx_launch import RANKS, launch

import streamer
from streamer.cpu_cores import in_words, usable_cores
from streamer.parallel.split import split

WORKER = Path(__file__).with_name("distributed_worker.py")
PROMPT = (
    "The function returns the value of the argument, or raises an error if the file is missing."
)


@pytest.fixture(scope="module")
def models(checkpoints, tmp_path_factory) -> dict[str, Path]:
    """Float (bf16 experts computed in float32) and 4-bit models, full and split in 2 shards."""
    root = tmp_path_factory.mktemp("expert-parallel")
    folders = {
        "float": checkpoints.repacked(checkpoints.hf("qwen3_moe")),
        "quantized": checkpoints.repacked(checkpoints.mlx("qwen3_moe")),
    }
    for name, full in list(folders.items()):
        for rank in range(RANKS):
            split(full, root / f"{name}-shard{rank}", rank, RANKS, log=lambda _: None)
        folders[f"{name}-shards"] = root / f"{name}-shard{{rank}}"
    folders["root"] = root
    folders["draft"] = checkpoints.hf("qwen3_moe")  # the float weights: a draft kept most times
    return folders


RUNS = {  # name: (model folder, mode)
    "float-shards": ("float-shards", "stream"),
    "quantized-shards": ("quantized-shards", "stream+drafts"),
    "quantized-resident": ("quantized-shards", "resident+drafts"),
    "float-full": ("float", "stream"),
}


@pytest.fixture(scope="module")
def parallel(models) -> dict[str, list[dict]]:
    """Every run of RUNS on 2 ranks, in one launch: name -> per-rank results."""
    root = models["root"]
    command = [sys.executable, str(WORKER), "--prompt", PROMPT, "--draft", str(models["draft"])]
    for name, (model, mode) in RUNS.items():
        command += ["--run", str(models[model]), str(root / f"{name}-{{rank}}.npz"), mode]
    result = launch(command, root)
    runs = {}
    for name in RUNS:
        files = [root / f"{name}-{rank}.npz" for rank in range(RANKS)]
        assert all(f.exists() for f in files), result.stdout[-2000:] + result.stderr[-4000:]
        runs[name] = [dict(np.load(f)) for f in files]
    return runs


@pytest.fixture(scope="module")
def single(models) -> dict[str, dict]:
    """The same runs in this process, alone, on the full folders."""
    sys.path.insert(0, str(WORKER.parent))
    from distributed_worker import run

    results = {}
    for name, (model, mode) in RUNS.items():
        full = models[model.removesuffix("-shards")]
        out = models["root"] / f"{name}-single.npz"
        run(str(full), str(out), mode, PROMPT, 64, None, str(models["draft"]))
        results[name] = dict(np.load(out))
    return results


@pytest.mark.parametrize("name", list(RUNS))
def test_every_rank_computes_the_single_process_output(parallel, single, name):
    alone = single[name]
    assert len(alone["tokens"]) == 64
    for rank, result in enumerate(parallel[name]):
        diff = np.abs(result["logits"] - alone["logits"]).max()
        tolerance = 0.0 if name.startswith("quantized") else 1e-5
        assert diff <= tolerance, f"rank {rank}: max abs logit difference {diff}"
        assert result["tokens"].tolist() == alone["tokens"].tolist(), f"rank {rank}"
        # one all_sum per MoE layer call, nothing else, and no host sync beyond one process's:
        # none on the sync-free (resident) path, one per layer call on the streamed paths
        assert result["collectives"] == result["layer_calls"] > 0
        assert result["syncs"] == alone["syncs"], f"rank {rank}"
        expected = 0 if RUNS[name][1].startswith("resident") else result["layer_calls"]
        assert result["syncs"] == expected, f"rank {rank}"


@pytest.mark.parametrize("name", ["quantized-shards", "quantized-resident"])
def test_drafted_group_output_is_the_plain_output(parallel, single, name):
    """Speculative decoding on 2 ranks: every verify pass is a chunk of the last token and its
    drafts, and the ranks keep the same drafts (the same logits after each layer's sums), so
    the greedy tokens are one process's plain tokens, in the passes one process takes."""
    alone = single[name]
    for drafter, count in (("lookup", 64), ("draft", 24)):
        plain = alone["tokens"].tolist()[:count]
        assert alone[f"{drafter}_tokens"].tolist() == plain, drafter
        for rank, result in enumerate(parallel[name]):
            assert result[f"{drafter}_tokens"].tolist() == plain, (drafter, rank)
            for figure in ("passes", "accepted", "drafted"):
                key = f"{drafter}_{figure}"
                assert result[key] == alone[key], (key, rank)
    # each drafter's passes keep some drafts and reject others: both ends of a pass on the group
    for drafter in ("lookup", "draft"):
        assert 0 < alone[f"{drafter}_accepted"] < alone[f"{drafter}_drafted"], drafter


def test_a_rank_drafting_otherwise_stops_every_rank(parallel):
    """A rank whose drafts differ (here made to) would run a pass of another length and hang the
    group: every rank finds it before that pass and stops with the same line, still in step
    (the launch's later runs completed)."""
    messages = [str(result["out_of_step"]) for result in parallel["quantized-shards"]]
    assert messages[0] == messages[1]
    assert messages[0].startswith("rank 1 computed other tokens or drafts than rank 0 by output")
    assert all("tokens" in result for result in parallel["float-full"])


@pytest.mark.parametrize("name", ["float-shards", "quantized-shards", "float-full"])
def test_each_rank_reads_only_its_share(parallel, single, name):
    reads = []
    for rank, result in enumerate(parallel[name]):
        routed = result["trace"][:, 1:]
        experts = routed[routed >= 0]
        assert experts.size, f"rank {rank} read no experts"
        assert (experts % RANKS == rank).all(), f"rank {rank} read another rank's experts"
        reads.append(int(result["experts_read"]))
    # together the ranks read exactly what one process reads alone, each about half
    assert sum(reads) == single[name]["experts_read"]
    assert min(reads) > 0.3 * sum(reads)


def test_each_shard_holds_only_its_share_on_disk(models):
    full = models["quantized"]
    for rank in range(RANKS):
        shard = Path(str(models["quantized-shards"]).replace("{rank}", str(rank)))
        for layer_file in sorted((full / "experts").iterdir()):
            assert (shard / "experts" / layer_file.name).stat().st_size * RANKS == (
                layer_file.stat().st_size
            )


def test_generate_under_mlx_launch(models):
    """`mlx.launch ... -- streamer generate`, drafting by prompt lookup, prints once, from rank
    0, what one process prints without drafts, and every rank's statistics in one line: each
    rank's reads add up to one process's drafting alike. The prompt repeats itself, as the
    random model's answer then does: lookup finds drafts that are kept."""
    prompt = "def read(path): return open(path).read()"
    model, tokenizer = streamer.load(models["quantized"], memory_budget=0)
    alone = streamer.generate(model, tokenizer, prompt, max_tokens=16)
    drafted = streamer.generate(model, tokenizer, prompt, 16, prompt_lookup=1)
    assert drafted == alone
    stats = model.streamer.stats
    steps, passes = stats.decode_tokens, stats.drafts.passes
    alone_mb, alone_reads = (
        stats.decode.bytes_read / steps / 2**20,
        stats.decode.experts_read / steps,
    )
    assert 0 < stats.drafts.accepted and passes < steps  # some passes of several tokens
    args = ["--prompt", prompt, "--max-tokens", "16", "--memory-budget", "0"]
    args += ["--ignore-chat-template", "--prompt-lookup", "1"]  # the text as streamer.generate
    shards = str(models["quantized-shards"])
    result = launch(
        [sys.executable, "-m", "streamer", "generate", "--model", shards, *args], models["root"]
    )
    assert result.stdout == alone + "\n", result.stderr
    lines = [line for line in result.stderr.splitlines() if "expert MiB/token by rank" in line]
    assert len(lines) == 1 and "kept per pass" in lines[0], result.stderr
    found = re.search(
        rf"{RANKS} ranks \| expert MiB/token by rank (?P<mb>[\d. ]+) \| "
        r"reads/token by rank (?P<reads>[\d. ]+) \| .*"
        r"all_sum (?P<sums>\d+)/token, (?P<us>\d+) us each \((?P<ms>[\d.]+) ms/token.* "
        r"peak RSS by rank [\d. ]+ GiB",
        lines[0],
    )
    assert found, lines[0]
    # each rank read a part, together what one process reads (printed rounded)
    mb, reads = ([float(v) for v in found[k].split()] for k in ("mb", "reads"))
    assert len(mb) == len(reads) == RANKS and min(mb) > 0 and min(reads) > 0
    assert sum(mb) == pytest.approx(alone_mb, abs=0.01 * RANKS)
    assert sum(reads) == pytest.approx(alone_reads, abs=0.1 * RANKS)
    # the collective's time per token: one all_sum per MoE layer (2) and pass, at one's time
    sums = 2 * passes / steps
    assert int(found["sums"]) == round(sums)
    assert float(found["ms"]) == pytest.approx(sums * int(found["us"]) / 1e3, abs=0.01)


def test_a_rank_given_another_ranks_shard_is_named(models, tmp_path):
    for rank in range(RANKS):  # rank r gets shard (r + 1) mod 2
        other = str(models["quantized-shards"]).replace("{rank}", str((rank + 1) % RANKS))
        (tmp_path / f"swapped{rank}").symlink_to(other)
    result = launch(
        [sys.executable, "-m", "streamer", "generate", "--model", str(tmp_path / "swapped{rank}")]
        + ["--prompt", "x", "--max-tokens", "2"],
        tmp_path,
    )
    errors = [line for line in result.stderr.splitlines() if line.startswith("streamer: error")]
    assert errors == [
        f"streamer: error: rank 0 ({socket.gethostname()}:{Path(other).resolve().parent}"
        f"/quantized-shard1) holds shard 1/2, which is rank 1's: give rank 0 the folder of "
        "shard 0/2."
    ], result.stderr
    assert result.stdout == ""


def test_a_rank_with_a_damaged_shard_is_named_and_the_group_ends(models, tmp_path):
    """A fault in one rank's own files (here a truncated expert file) is said by that rank, with
    the file, and the launch ends instead of leaving the other rank waiting at the group check."""
    shards = str(models["quantized-shards"])
    shutil.copytree(shards.replace("{rank}", "1"), tmp_path / "rank1")
    (tmp_path / "rank0").symlink_to(shards.replace("{rank}", "0"))
    damaged = sorted((tmp_path / "rank1" / "experts").iterdir())[0]
    os.truncate(damaged, damaged.stat().st_size - 4096)
    result = launch(  # by `streamer launch`, which a bare streamer command runs under
        ["generate", "--model", str(tmp_path / "rank{rank}"), "--prompt", "x", "--max-tokens", "2"],
        tmp_path,
        streamer=True,
    )
    errors = [line for line in result.stderr.splitlines() if line.startswith("streamer: error")]
    # rank 1 says what is wrong with its files (mlx.launch relays the ranks' lines in any order)
    own = [line for line in errors if line.startswith(f"streamer: error: rank 1: {damaged} holds ")]
    assert len(own) == 1, result.stderr
    # rank 1 takes part in the group's check with its error: rank 0 says which rank failed and
    # why (it said only that a rank was gone), unless mlx.launch stopped it first
    told = f"streamer: error: rank 1 cannot load its folder: {damaged} holds "
    # the launcher's last line names the first rank to fail: rank 1, or rank 0 telling of it
    *others, summary = [line for line in errors if line not in own]
    assert len(others) <= 1 and all(line.startswith(told) for line in others), result.stderr
    first = (
        "rank 1 exited with status 2: ",
        "rank 0 exited with status 2: rank 1 cannot load its folder: ",
    )
    assert summary in {f"streamer: error: {said}{own[0].split(': ', 3)[3]}" for said in first}, (
        result.stderr
    )
    assert result.returncode == 2  # mlx.launch exits 0 whatever its ranks return
    assert "Traceback" not in result.stderr
    # both ended, with an error or stopped by mlx.launch once the other had ended
    assert re.search(r"Node with rank 1 exited with code (2|-15)\b", result.stderr)
    assert re.search(r"Node with rank 0 exited with code (2|-15)\b", result.stderr)
    assert result.stdout == ""


def test_verbose_false_under_mlx_launch_prints_the_answer_alone(models):
    """`--verbose False` left out the residency and stats lines but printed the group's
    "expert-parallel over 2 ranks" line."""
    args = ["-p", "def read(path):", "-m", "4", "--ignore-chat-template", "--verbose", "False"]
    shards = str(models["quantized-shards"])
    result = launch(
        [sys.executable, "-m", "streamer", "generate", "--model", shards, *args], models["root"]
    )
    assert result.returncode == 0 and result.stdout.strip(), result.stderr
    assert "[streamer]" not in result.stderr and "decode:" not in result.stderr, result.stderr


def test_ranks_on_one_machine_share_its_cores(models):
    """`streamer launch -n 2` on one machine: each rank took every core the process may use, so 2
    ranks on 2 cores ran 4 matmul threads; each takes its share, and the residency line says why
    (the line is rank 0's, the same decision every rank's)."""
    args = ["-p", "def read(path):", "-m", "2", "--ignore-chat-template"]
    command = ["generate", "--model", str(models["quantized-shards"]), *args]
    result = launch(command, models["root"], streamer=True)
    assert result.returncode == 0, result.stderr
    usable = usable_cores()
    share = f"{in_words(max(usable // RANKS, 1))} (the {in_words(usable)} this process may use"
    assert f"; matmuls on {share}, shared by {RANKS} ranks on this host)\n" in result.stderr
