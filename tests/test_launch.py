"""`streamer launch`: mlx.launch's own launcher (2 ranks, ring backend, 127.0.0.1) exiting with the
first failing rank's status and one line naming it, where mlx.launch exits 0 whatever its ranks
return. Here the ranks are shell commands (a launch takes a second); tests/test_distributed.py
runs streamer's own commands under it (a rank whose shard is damaged)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from mlx_launch import finish, launch, start


def shell(script: str) -> list[str]:
    return ["sh", "-c", script]


def test_the_first_failing_rank_is_the_groups_status(tmp_path):
    # rank 1 fails; rank 0, still running, is stopped by the launcher (-15): not the cause
    result = launch(
        shell(
            'echo "out $MLX_RANK"; [ $MLX_RANK = 1 ] || exec sleep 60; echo "bad disk" >&2; exit 3'
        ),
        tmp_path,
        streamer=True,
    )
    assert result.returncode == 3, result.stderr
    assert (
        result.stderr.splitlines()[-1] == "streamer: error: rank 1 exited with status 3: bad disk"
    )
    assert "out 1" in result.stdout


def test_a_group_that_succeeds_exits_0(tmp_path):
    result = launch(shell('echo "out $MLX_RANK"'), tmp_path, streamer=True)
    assert (result.returncode, sorted(result.stdout.split("\n"))) == (0, ["", "out 0", "out 1"])
    assert "streamer: error" not in result.stderr


def test_ctrl_c_reaches_the_ranks_and_their_status_is_the_groups(tmp_path):
    process = start(shell('echo "ready $MLX_RANK"; exec sleep 60'), tmp_path, streamer=True)
    ready = {process.stdout.readline(), process.stdout.readline()}
    assert ready == {"ready 0\n", "ready 1\n"}  # both ranks run, relayed by the launcher
    os.killpg(process.pid, signal.SIGINT)  # as a terminal's Ctrl-C: every process of the group
    result = finish(process)
    # the launcher waited for the ranks' ends (they were not stopped: the signal ended them)
    assert result.returncode == 130, result.stderr
    last = result.stderr.splitlines()[-1]
    assert last in {
        f"streamer: error: rank {r} was ended by SIGINT (it wrote nothing on stderr)"
        for r in (0, 1)
    }


def test_a_launch_without_a_command_or_of_mpi_is_refused_in_one_line(tmp_path):
    """And mlx.launch's own parser errors: one line, not its usage block."""
    for words, said in [
        (["-n", "0", "--", "true"], "invalid positive_number value: '0' (streamer launch --help"),
        ([], "give the command to run after `--`"),
        (["-n", "2", "--"], "give the command to run after `--`"),
        (["--backend", "mpi", "--", "true"], "start an MPI group with mpirun"),
    ]:
        result = subprocess.run(
            [sys.executable, "-m", "streamer", "launch", *words],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
        assert said in result.stderr
