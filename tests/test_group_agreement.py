"""Ranks of a group started with other options (a wrapper script, another streamer's defaults):
refused after the load, before the run's first collective, with one line naming the rank and the
option, instead of summing rows of other tokens, failing in the ring with no word of why, or
hanging. The ranks are threads of this process (as in test_group_checks.py), then one real launch.
"""

from __future__ import annotations

import argparse
import sys
from types import SimpleNamespace

import pytest
from mlx_launch import launch
from test_group_checks import as_ranks, gathered

import streamer.parallel.agreement
from streamer.parallel.agreement import check_same_settings, command_settings
from streamer.parallel.group import GroupError


def run_group(settings: list[dict]) -> list:
    """Each rank's check_same_settings: None, or the error it raised."""
    return as_ranks(len(settings), lambda group, r: check_same_settings(group, settings[r]))


@pytest.fixture(autouse=True)
def threads_for_ranks(monkeypatch):
    monkeypatch.setattr(streamer.parallel.agreement, "_all_gather", gathered)


def settings(**changed) -> dict:
    args = argparse.Namespace(
        max_tokens=8, temp=0.0, kv_bits=None, seed=None, memory_budget=None, read_path=None
    )
    prompt = changed.pop("prompt", "hello")
    model = SimpleNamespace(streamer=SimpleNamespace(dtype=changed.pop("dtype", "float32")))
    vars(args).update(changed)
    return command_settings(args, model, "1.0", **{"the templated prompt": prompt})


def test_alike_ranks_pass_whatever_each_machine_decides():
    per_machine = settings(seed=3, memory_budget=0, read_path="slots")
    assert run_group([settings(), per_machine, settings()]) == [None, None, None]


def test_ranks_on_other_counts_of_cores_pass():
    """A machine's cores change no token (tests/test_cpu_cores.py), yet a rank given --threads of
    its own (a wrapper fitting each host's cores) was refused: `rank 1 runs with --threads 4 and
    rank 0 with 1: every rank must compute the same tokens`."""
    assert run_group([settings(threads=1), settings(threads=4)]) == [None, None]


@pytest.mark.parametrize(
    "changed, named",
    [
        ({"max_tokens": 3}, "rank 2 runs with --max-tokens 3 and rank 0 with 8:"),
        ({"kv_bits": 4}, "rank 2 runs with --kv-bits 4 and rank 0 with None:"),
        ({"dtype": "bfloat16"}, "rank 2 runs with --dtype bfloat16 and rank 0 with float32:"),
        (
            {"prompt": "a\nb"},
            "rank 2 runs with the templated prompt 'a\\nb' and rank 0 with xxx",
        ),
        (
            {"prompt": "x" * 50 + "y"},
            "rank 2 runs with the templated prompt unlike rank 0's (both begin 'xxxxx",
        ),
    ],
)
def test_a_rank_with_another_option_is_named_on_every_rank(changed, named):
    base = {"prompt": "x" * 50} if "prompt" in changed else {}
    results = run_group([settings(**base), settings(**base), settings(**changed)])
    assert all(isinstance(r, GroupError) for r in results), results
    assert {str(r) for r in results} == {str(results[0])}  # one line, said by rank 0
    assert str(results[0]).startswith(named)


def test_launched_ranks_with_other_token_budgets_stop_naming_the_option(tmp_path, checkpoints):
    """Before: both ranks failed `a rank is gone from the group` (the ring broke on a collective
    the other rank never made), the launch naming no cause."""
    from streamer.parallel.split import split

    full = checkpoints.repacked(checkpoints.mlx("qwen3_moe"))
    for rank in range(2):
        split(full, tmp_path / f"shard{rank}", rank, 2, log=lambda _: None)
    script = (
        "import os, sys; from streamer.cli import main; "
        "budget = '3' if os.environ['MLX_RANK'] == '1' else '8'; "
        f"sys.exit(main(['generate', '--model', '{tmp_path}/shard{{rank}}', '--prompt', 'hi', "
        "'--max-tokens', budget]))"
    )
    result = launch([sys.executable, "-c", script], tmp_path, streamer=True)
    assert result.returncode == 2, result.stderr[-3000:]
    said = "rank 0 exited with status 2: rank 1 runs with --max-tokens 3 and rank 0 with 8:"
    assert result.stderr.strip().splitlines()[-1].startswith(f"streamer: error: {said}")


def test_the_group_fault_rank_0_says_is_said_though_it_comes_late(tmp_path, checkpoints):
    """Rank 0 alone says a fault every rank finds (here shards given to the wrong ranks); rank 0
    slowed before saying it. Before: rank 1 ended at once, the launcher stopped rank 0 unsaid
    (most runs, without the slowing) and the launch ended `rank 1 exited with status 2 (it wrote
    nothing on stderr)`: no word of why."""
    from streamer.parallel.split import split

    full = checkpoints.repacked(checkpoints.mlx("qwen3_moe"))
    for rank in range(2):
        split(full, tmp_path / f"shard{1 - rank}", rank, 2, log=lambda _: None)
    script = (
        "import os, sys, time; import streamer.cli as cli; report = cli.report; "
        "cli.report = lambda *a: (time.sleep(1 if os.environ['MLX_RANK'] == '0' else 0), "
        f"report(*a))[1]; sys.exit(cli.main(['generate', '--model', '{tmp_path}/shard{{rank}}', "
        "'--prompt', 'hi']))"
    )
    result = launch([sys.executable, "-c", script], tmp_path, streamer=True)
    assert result.returncode == 2, result.stderr[-3000:]
    said = "rank 0 exited with status 2: rank 0 ("
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"streamer: error: {said}"), result.stderr[-3000:]
    assert last.endswith("holds shard 1/2, which is rank 1's: give rank 0 the folder of shard 0/2.")


def test_launched_ranks_whose_chat_templates_differ_stop_naming_the_prompt(tmp_path, checkpoints):
    """Rank 1's copy of the chat template edited (another version on one Mac). Before: the ranks
    compared the prompt as typed, and each ran its own templated prompt, summing rows of other
    tokens: garbage text, status 0."""
    from streamer.parallel.split import split

    full = checkpoints.repacked(checkpoints.mlx("qwen3_moe"))
    for rank in range(2):
        split(full, tmp_path / f"shard{rank}", rank, 2, log=lambda _: None)
    template = tmp_path / "shard1" / "chat_template.jinja"
    template.write_text("Other. " + template.read_text())
    command = ["generate", "--model", f"{tmp_path}/shard{{rank}}", "--prompt", "hi"]
    result = launch([*command, "--max-tokens", "4"], tmp_path, streamer=True)
    assert result.returncode == 2, result.stderr[-3000:]
    said = (
        "rank 0 exited with status 2: rank 1 runs with the templated prompt 'Other. <|user|>hi\\n"
    )
    assert result.stderr.strip().splitlines()[-1].startswith(f"streamer: error: {said}")


def test_a_rank_running_another_streamer_is_named():
    """A host with another streamer (its defaults, or what the ranks send each other, may differ)
    ran on until something failed or hung."""
    other = {**settings(), "streamer version": "0.0.1"}
    results = run_group([settings(), settings(), other])
    assert all(isinstance(r, GroupError) for r in results), results
    assert str(results[0]) == (
        "rank 2 runs with streamer version 0.0.1 and rank 0 with 1.0: every "
        "rank must compute the same tokens, so install the same versions of streamer and mlx on "
        "every host."
    )
