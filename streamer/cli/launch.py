"""`streamer launch`: mlx.launch whose exit status is the group's.

MLX's launcher (mlx 0.32.4, mlx/_distributed_utils/launch.py) starts the ranks, relays their
input and output, and stops the others once one ends with an error, but its `main` returns None
whatever the ranks returned: `mlx.launch ... ; echo $?` prints 0 when every rank failed. Its
statuses are read once per rank from the command class it is given (`exit_status`, after the
rank's output is drained), and nothing a rank can do reaches the launcher's own status. So this
command runs MLX's own `main`, parser and all, handing its relay a command class that records
each rank's end, and returns the first failing rank's status with one line saying why. A rank
that ends with status 0 while the others run on leaves them waiting on it forever (MLX stops the
others only for a failure): after STREAMER_LAUNCH_GRACE seconds (30) they are stopped and the
launch fails naming that rank. A hostfile is checked first (hostfile.py), and a streamer command
runs in each rank with the working directory off sys.path, so a folder named `streamer` there
(a clone) cannot stand in for the installed package, as it does for `python -m streamer`. The
launcher's input reaches the ranks with its end (input_relay.py), which MLX's relay never passes;
the class recording the ranks' ends also runs those on other hosts (launch_ranks.py).
"""

from __future__ import annotations

import argparse
import difflib
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from ..errors import StreamerError
from .hostfile import check_host_list, check_hostfile, hostfile_of, option
from .input_relay import relaying_input
from .interrupts import second_ctrl_c_exits, stopping_first
from .launch_help import say_usage_if_asked
from .launch_ranks import RankEnd, Ranks, recorder
from .output import report


def add_parser(sub) -> None:
    p = sub.add_parser(
        "launch",
        help="run a command in every rank of an expert-parallel group: mlx.launch's options, "
        "then `-- generate ...`; exits with the first failing rank's status",
        prefix_chars="+",  # every word, options included, is mlx.launch's to parse (--help too)
        add_help=False,
    )
    p.add_argument("words", nargs=argparse.REMAINDER)
    p.set_defaults(run=launch, commands=tuple(sub.choices))


NO_COMMAND = "give the command to run after `--`: streamer launch -n 2 -- generate ..."
# a rank's own Python with the working directory off sys.path, then `python -m streamer`'s code
RANK_BOOTSTRAP = (
    "import runpy, sys; sys.path[:] = [p for p in sys.path if p not in ('', '.')]; "
    "runpy.run_module('streamer', run_name='__main__', alter_sys=True)"
)


def launch(args: argparse.Namespace) -> int:
    say_usage_if_asked(args.words)  # before mlx.launch's own help
    words = _command_words(args.words, args.commands)
    hosts = check_host_list(words)
    hostfile = hostfile_of(words)
    if hostfile is not None:
        hosts = check_hostfile(hostfile, option(words, "--backend"))
    _check_chat_input(args.words, hosts[0])
    ranks = Ranks(_grace())
    with _recording(ranks), second_ctrl_c_exits(), stopping_first(ranks.commands):
        _mlx_main(words)
    if ranks.alone is not None:
        end = ranks.alone
        return report(
            f"streamer: error: rank {end.rank} ended (status {end.status}) while the other ranks "
            f"ran on, waiting on it; they were stopped {ranks.grace:g} s later. Every rank must "
            "run the group's command to its end (STREAMER_LAUNCH_GRACE sets the wait).",
            2,
        )
    failed = [end for end in ranks.ends if end.status != 0]
    if not failed:
        return 0
    first = _cause(failed)
    return report(f"streamer: error: {_ended(first)}", _shell_status(first.status))


def _cause(failed: list[RankEnd]) -> RankEnd:
    """The failed rank the launch names: not one the launcher stopped because another had failed
    (ended by its signal; one it stopped as it exited keeps its own status), and one that said
    why where one did (a fault every rank finds is said by rank 0 alone; a silent rank may end
    first)."""
    own = [end for end in failed if not (end.stopped and end.status < 0)] or failed
    return next((end for end in own if end.last_line), own[0])


def _command_words(words: list[str], commands: tuple[str, ...]) -> list[str]:
    """mlx.launch's words; a streamer subcommand after `--` runs as this Python's `-m streamer`
    (under --python, that interpreter's: mlx.launch puts it first)."""
    if not words or words[-1] == "--":
        raise StreamerError(NO_COMMAND)
    if "--" not in words:
        return words  # --help, --print-python, or a command mlx.launch's parser finds alone
    at = words.index("--")
    command = words[at + 1 :]
    if command and command[0] not in commands:
        _check_not_mistyped(command[0], commands)
    if command and command[0] in commands:
        own_python = any(w == "--python" or w.startswith("--python=") for w in words[:at])
        python = [] if own_python else [sys.executable]
        command = [*python, "-c", RANK_BOOTSTRAP, *command]
    return [*words[: at + 1], *command]


def _check_not_mistyped(program: str, commands: tuple[str, ...]) -> None:
    """A word after `--` that is no streamer command runs as a program on each rank: one that is
    no program here either, but close to a command, is that command mistyped (each rank failed
    with `exec: genrate: not found`)."""
    close = difflib.get_close_matches(program, commands, 1)
    if close and shutil.which(program) is None:
        raise StreamerError(
            f"{program!r} after `--` is neither a streamer command nor a program here (did you "
            f"mean {close[0]}?)."
        )


def _check_chat_input(words: list[str], rank_0_host: str) -> None:
    """A chat whose rank 0 is on another host reads the terminal `ssh -tt` opens there, which the
    end of the launcher's input (a pipe's, a file's) never reaches: it waited for ever."""
    command = words[words.index("--") + 1 :] if "--" in words else []
    typed = sys.stdin is not None and sys.stdin.isatty()
    if command[:1] != ["chat"] or rank_0_host == "127.0.0.1" or typed:
        return
    raise StreamerError(
        f"chat's rank 0 runs on {rank_0_host}, in the terminal ssh opens there, which the end of "
        "this input never reaches: type the chat at a terminal (/quit ends it), or run rank 0 "
        'here, as host 0 of a hostfile with "ssh": "127.0.0.1" and its own "ips".'
    )


def _grace() -> float:
    text = os.environ.get("STREAMER_LAUNCH_GRACE", "30")
    try:
        grace = float(text)
    except ValueError:
        grace = -1.0
    if not 0 < grace < float("inf"):
        raise StreamerError(f"STREAMER_LAUNCH_GRACE is {text!r}, not a number of seconds above 0.")
    return grace


def _mlx_main(words: list[str]) -> None:
    try:
        from mlx._distributed_utils import launch as mlx_launch
    except ImportError as e:
        raise StreamerError(f"this mlx has no launcher to run ({e}); use mlx.launch") from e
    argv, error = sys.argv, argparse.ArgumentParser.error
    sys.argv = ["streamer launch", *words]  # what MLX's parser reads, and names in its errors

    def one_line(parser: argparse.ArgumentParser, message: str) -> None:
        if message == "No script is provided":  # `streamer launch -n 2`: said as without `--`
            raise StreamerError(NO_COMMAND)
        raise StreamerError(f"{message} (streamer launch --help lists mlx.launch's options)")

    argparse.ArgumentParser.error = one_line  # its usage block, as every command's, one line
    try:
        mlx_launch.main()
    finally:
        sys.argv, argparse.ArgumentParser.error = argv, error


@contextmanager
def _recording(ranks: Ranks) -> Iterator[None]:
    """MLX's relay, run with its command class extended to record each rank's end in
    `ranks.ends` (in the order they end), and watched for a rank that ends alone; MPI groups,
    which mpirun relays and MLX drops the status of, refused."""
    from mlx._distributed_utils import launch as mlx_launch

    relay, mpi = mlx_launch._launch_with_io, mlx_launch.launch_mpi

    def recorded_relay(command_class, arguments, verbose):
        done = threading.Event()
        watch = threading.Thread(target=_stop_if_alone, args=(ranks, len(arguments), done))
        watch.start()
        try:
            with relaying_input() as given:
                return relay(recorder(command_class, ranks, given), arguments, verbose)
        finally:
            done.set()
            watch.join()

    def refuse_mpi(*_):
        raise StreamerError(
            "streamer launch runs ring, jaccl and nccl groups: start an MPI group with mpirun, "
            "whose exit status is the ranks' (mlx.launch --backend mpi drops it)"
        )

    mlx_launch._launch_with_io, mlx_launch.launch_mpi = recorded_relay, refuse_mpi
    try:
        yield
    finally:
        mlx_launch._launch_with_io, mlx_launch.launch_mpi = relay, mpi


def _stop_if_alone(ranks: Ranks, count: int, done: threading.Event) -> None:
    """Once a rank has ended with status 0 and the others have not followed within the grace,
    stop them (MLX stops the others only after a failure: they would wait on it forever)."""
    while not done.wait(0.2):
        first = ranks.ends[0] if ranks.ends else None
        if first is None or len(ranks.ends) == count or first.status != 0:
            continue
        if time.monotonic() - first.at >= ranks.grace:
            ranks.alone = first
            ended = {end.rank for end in ranks.ends}
            for command in list(ranks.commands):
                if command._rank not in ended:
                    command.terminate()
            return


def _ended(end: RankEnd) -> str:
    """`rank 1 exited with status 2: <its last line, without its own prefix>`."""
    if end.status < 0:
        how = f"rank {end.rank} was ended by {_signal_name(-end.status)}"
    else:
        how = f"rank {end.rank} exited with status {end.status}"
    said = end.last_line.removeprefix("streamer: error: ").removeprefix(f"rank {end.rank}: ")
    return f"{how}: {said}" if said else f"{how} (it wrote nothing on stderr)"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _shell_status(status: int) -> int:
    """A status as a shell reports it: a rank ended by signal N is 128 + N."""
    return 128 - status if status < 0 else status
