"""`streamer launch`: mlx.launch's own launcher (2 ranks, ring backend, 127.0.0.1) exiting with the
first failing rank's status and one line naming it, where mlx.launch exits 0 whatever its ranks
return. Here the ranks are shell commands (a launch takes a second); tests/test_distributed.py
runs streamer's own commands under it (a rank whose shard is damaged)."""

from __future__ import annotations

import json
import os
import pty
import select
import shlex
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
from mlx_launch import LAUNCH_SECONDS, finish, free_ports, launch, start


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


def test_the_failed_rank_named_is_one_that_said_why():
    """A fault every rank finds (shards given to the wrong ranks) is said by rank 0 alone; when
    silent rank 1 ended first, or rank 0 was being stopped as it exited on its own, the launch
    said `rank 1 exited with status 2 (it wrote nothing on stderr)`."""
    from streamer.cli.launch import _cause
    from streamer.cli.launch_ranks import RankEnd

    said = "streamer: error: rank 0 (host:/shard1) holds shard 1/2, which is rank 1's"
    silent = RankEnd(1, 2, False, "")
    assert _cause([silent, RankEnd(0, 2, False, said)]).rank == 0
    assert _cause([silent, RankEnd(0, 2, True, said)]).rank == 0  # its own status: not stopped
    assert _cause([RankEnd(0, -15, True, ""), silent]) is silent  # the launcher's stop: not it
    assert _cause([RankEnd(0, -15, True, "")]).rank == 0


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


@pytest.mark.parametrize("number", [signal.SIGTERM, signal.SIGHUP])
def test_a_launcher_ended_by_a_signal_stops_its_ranks_first(tmp_path, number):
    """SIGTERM (a CI job's timeout, `kill`) or SIGHUP to the launcher alone. Before: it died at
    once and its ranks ran on, orphaned (a serving group stayed up)."""
    script = 'echo $$ > pid.$MLX_RANK; echo "ready $MLX_RANK"; exec sleep 60'
    process = start(shell(script), tmp_path, streamer=True)
    ready = {process.stdout.readline(), process.stdout.readline()}
    assert ready == {"ready 0\n", "ready 1\n"}
    process.send_signal(number)
    result = finish(process)
    assert result.returncode == 128 + signal.SIGTERM, result.stderr  # how the ranks were ended
    assert result.stderr.splitlines()[-1] in {
        f"streamer: error: rank {r} was ended by SIGTERM (it wrote nothing on stderr)"
        for r in (0, 1)
    }
    left = []
    for rank in range(2):
        pid = int((tmp_path / f"pid.{rank}").read_text())
        try:
            os.kill(pid, signal.SIGKILL)  # an orphan, ended here
            left.append(rank)
        except ProcessLookupError:  # ended, and reaped by the launcher
            pass
    assert not left, f"ranks {left} outlived the launcher"


def test_the_end_of_input_reaches_every_rank(tmp_path):
    """MLX's relay passes the launcher's input to the ranks but never its end. Before: `cat`
    read for ever (a chat from a pipe never ended, `--prompt -` hung)."""
    script = 'cat > in.$MLX_RANK; echo "read $MLX_RANK"'
    result = launch(shell(script), tmp_path, "two\nlines", streamer=True, ends=True)
    assert (result.returncode, sorted(result.stdout.split())) == (0, ["0", "1", "read", "read"])
    assert [(tmp_path / f"in.{r}").read_text() for r in (0, 1)] == ["two\nlines"] * 2


def launched_on(stdin, tmp_path, script: str) -> subprocess.CompletedProcess:
    """`streamer launch` of `script` on 2 ranks with `stdin` (a descriptor, or the shell's
    `<&-`: closed)."""
    argv = [sys.executable, "-m", "streamer", "launch", "--backend", "ring", "-n", "2"]
    argv += ["--starting-port", str(free_ports()), "--", *shell(script)]
    closed = stdin == "<&-"
    process = subprocess.Popen(
        ["sh", "-c", 'exec "$@" <&-', "sh", *argv] if closed else argv,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        stdin=None if closed else stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # finish() ends the group on a timeout
    )
    return finish(process)


def test_a_launcher_started_with_its_input_closed_runs(tmp_path):
    """Before: MLX's relay read `sys.stdin`, None with descriptor 0 closed: a traceback, and the
    launch never ended."""
    result = launched_on("<&-", tmp_path, 'cat; echo "ok $MLX_RANK"')
    assert (result.returncode, sorted(result.stdout.split())) == (0, ["0", "1", "ok", "ok"])


def test_ctrl_d_typed_at_a_terminal_ends_the_ranks_input(tmp_path):
    """Before: the ranks read on after Ctrl-D (a chat ended only on /quit or Ctrl-C)."""
    main, terminal = pty.openpty()
    try:
        os.write(main, b"hi\n\x04")  # a line, then Ctrl-D at the start of the next
        result = launched_on(terminal, tmp_path, 'cat > in.$MLX_RANK; echo "ok $MLX_RANK"')
    finally:
        os.close(main)
        os.close(terminal)
    assert (result.returncode, sorted(result.stdout.split())) == (0, ["0", "1", "ok", "ok"])
    assert [(tmp_path / f"in.{r}").read_text() for r in (0, 1)] == ["hi\n"] * 2


def test_a_prompt_read_from_input_is_refused_under_mlx_launch(tmp_path):
    """mlx.launch relays its input to the ranks but never its end: `--prompt -` read it for
    ever, a silent hang (streamer launch passes the end on: test_distributed_serve.py)."""
    command = [sys.executable, "-m", "streamer", "generate", "--model", "unused", "--prompt", "-"]
    result = launch(command, tmp_path, "hello\n")
    assert "--prompt - reads standard input to its end, which never comes " in result.stderr


def test_a_launch_without_a_command_or_of_mpi_is_refused_in_one_line(tmp_path):
    """And mlx.launch's own parser errors: one line, not its usage block."""
    for words, said in [
        (["-n", "0", "--", "true"], "invalid positive_number value: '0' (streamer launch --help"),
        ([], "give the command to run after `--`"),
        (["-n", "2", "--"], "give the command to run after `--`"),
        (["-n", "2"], "give the command to run after `--`"),  # mlx's "No script is provided"
        # each rank ran `genrate` as a program: "exec: genrate: not found", status 127
        (["-n", "2", "--", "genrate", "-p", "hi"], "(did you mean generate?)"),
        (["--backend", "mpi", "--", "true"], "start an MPI group with mpirun"),
        # ssh took it for its option (mlx.launch quotes it for the shell only)
        (["--hosts=127.0.0.1,-oProxyCommand=touch x", "--", "true"], "read as an option"),
        # as in a hostfile's "ips": each rank failed to join (`Can't parse address ::1:5000`)
        (["--hosts", "::1,::1", "--", "true"], "names '::1', an IPv6 address, which MLX's"),
        # mlx.launch ignored -n: one rank
        (["--hostfile", "h.json", "-n", "2", "--", "true"], "-n repeats the hosts of --hosts"),
        # MLX: `The ring backend requires IPs to be provided instead of hostnames`
        (["--hosts", "127.0.0.1, 127.0.0.1", "--", "true"], "' 127.0.0.1', with spaces"),
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


def streamer_launch(words: list[str], cwd, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "streamer", "launch", *words],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=LAUNCH_SECONDS,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **(env or {})},
    )


def test_a_malformed_hostfile_is_refused_in_one_line(tmp_path):
    """`[]` and `{"hosts": []}` ran nothing and exited 0; "envs" a string, "ssh" a number
    and an integer of 5000 digits were tracebacks; an IPv6 address failed each rank's join
    (`Can't parse address ::1:5000`) with a hint at unreachable hosts. Unreadable JSON is
    refused as every JSON file is (io/json_file.py: parse_json), by the hostfile's name."""
    host = {"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}
    for content, said in [
        ("[]", ": the list of hosts is empty"),
        ('{"hosts": []}', ": the list of hosts is empty"),
        ('{"envs": "A=1", "hosts": [HOST]}', ": \"envs\" is 'A=1', not a list"),
        ('[{"ssh": 5, "ips": ["127.0.0.1"]}]', ': host 0\'s "ssh" is 5, not a host name'),
        ('[HOST, {"ssh": "b", "ips": ["b"]}]', ": host 1's \"ips\" holds 'b', not an IP"),
        ('{"host": [HOST]}', ": no list of hosts"),
        # MLX: `The ring backend requires IPs to be provided instead of hostnames`
        ('{"backend": "ring", "hosts": [HOST, {"ssh": "b"}]}', ': host 1 has no "ips": the ring'),
        ('[{"ssh": "a", "ips": ["::1"]}]', ": host 0's \"ips\" holds '::1', an IPv6 address"),
        (
            '[{"ssh": "-oProxyCommand=x", "ips": []}]',
            ": host 0's \"ssh\" is '-oProxyCommand=x', which",
        ),
        ("[{", " is not valid JSON"),
        ("[" + "9" * 5000 + "]", " holds an integer of over 4300 digits; mlx.launch reads"),
        ("[" * 100000, " is nested too deeply to be read; mlx.launch reads"),
    ]:
        hostfile = tmp_path / "hosts.json"
        hostfile.write_text(content.replace("HOST", json.dumps(host)))
        result = streamer_launch(["--hostfile", str(hostfile), "--", "true"], tmp_path)
        assert result.returncode == 2 and result.stderr.count("\n") == 1, (content, result.stderr)
        assert f"hostfile {hostfile}{said}" in result.stderr, result.stderr


def test_a_hostfile_past_any_cluster_s_is_refused_unread(tmp_path):
    """A hostfile grown sparse to terabytes was read whole before its JSON was parsed: hours, or
    the memory."""
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text("[]")
    os.truncate(hostfile, 32 << 20)
    result = streamer_launch(["--hostfile", str(hostfile), "--", "true"], tmp_path)
    assert result.returncode == 2 and result.stderr == (
        f"streamer: error: hostfile {hostfile} holds over 16.00 MiB, more than a hostfile of "
        "thousands of hosts: give the hostfile.\n"
    )


def test_a_rank_that_ends_alone_is_named_and_the_others_stopped(tmp_path, monkeypatch):
    """Rank 1 exits 0 at once; rank 0 would wait on it forever (here: a long sleep)."""
    monkeypatch.setenv("STREAMER_LAUNCH_GRACE", "2")
    started = time.monotonic()
    result = launch(shell("[ $MLX_RANK = 1 ] && exit 0; exec sleep 120"), tmp_path, streamer=True)
    assert time.monotonic() - started < 60, result.stderr
    assert result.returncode == 2, result.stderr
    last = result.stderr.splitlines()[-1]
    assert last.startswith("streamer: error: rank 1 ended (status 0) while the other ranks"), last


def test_a_folder_named_streamer_in_the_ranks_directory_is_not_imported(tmp_path):
    """A clone named `streamer` in the ranks' working directory stood in for the package
    (`ImportError: cannot import name '__version__' from 'streamer' (unknown location)`)."""
    shadow = tmp_path / "work"
    (shadow / "streamer").mkdir(parents=True)  # the clone's package, first on the path if cwd is
    (shadow / "streamer" / "__init__.py").write_text("raise SystemExit('the clone ran')\n")
    words = ["--backend", "ring", "--hosts", "127.0.0.1", "-n", "2"]
    words += ["--starting-port", str(free_ports()), "--cwd", str(shadow), "--", "plan", "--help"]
    result = streamer_launch(words, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("usage: streamer plan") == 2 and "clone" not in result.stderr


def test_a_rank_that_cannot_join_its_group_says_so_in_one_line(monkeypatch):
    """MLX's ring gives up after ~30 s (`[ring] Couldn't connect`): a line, not a traceback."""
    import mlx.core as mx

    from streamer.errors import StreamerError
    from streamer.parallel.group import launched_group

    def unreachable(*_, **__):
        raise RuntimeError("[ring] Couldn't connect (error: 111)")

    monkeypatch.setenv("MLX_RANK", "1")
    monkeypatch.setattr(mx.distributed, "init", unreachable)
    with pytest.raises(StreamerError, match=r"rank 1 cannot join its group \(\[ring\] Couldn't"):
        launched_group()


def test_one_rank_launched_on_the_ring_runs_alone(tmp_path, monkeypatch):
    """`streamer launch -n 1` (one host: mlx.launch writes "" as the ring's hostfile). Before:
    `rank 0 cannot join its group ([json.exception.parse_error.101] parse error ...)`."""
    from streamer.parallel.group import launched_group

    hostfile = tmp_path / "ring"
    hostfile.write_text("\n")  # as mlx.launch's script writes it: `echo '' > $fname`
    monkeypatch.setenv("MLX_RANK", "0")
    monkeypatch.setenv("MLX_HOSTFILE", str(hostfile))
    assert launched_group() is None


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="a FIFO to name")
def test_a_ring_hostfile_that_is_no_regular_file_is_refused_unread(tmp_path, monkeypatch):
    """MLX_HOSTFILE naming a FIFO: the group's check for a ring of one read it until something
    wrote it (and MLX's ring, asked next, waits on it too); /dev/zero until memory ran out."""
    from hostile_files import refused_without_hanging

    from streamer.parallel.group import launched_group

    fifo = tmp_path / "ring"
    os.mkfifo(fifo)
    monkeypatch.setenv("MLX_RANK", "0")
    for path, kind in ((fifo, "a FIFO"), (Path("/dev/zero"), "a character device")):
        monkeypatch.setenv("MLX_HOSTFILE", str(path))
        refused_without_hanging(launched_group, f"{path} is {kind}", "the ring's hostfile")


def test_a_ring_hostfile_listing_no_host_runs_alone(tmp_path):
    """`[]` as the ring's hostfile: MLX's ring, asked for the group, died of a floating point
    exception (SIGFPE)."""
    hostfile = tmp_path / "ring"
    hostfile.write_text("[]")
    env = {**os.environ, "MLX_RANK": "0", "MLX_HOSTFILE": str(hostfile)}
    code = "from streamer.parallel.group import launched_group; print(launched_group())"
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert (result.returncode, result.stdout) == (0, "None\n"), result.stderr


def launched_remotely(
    tmp_path, script: str, typed: str, hosts: tuple[str, ...] = ("host0", "host1")
) -> subprocess.CompletedProcess:
    """`streamer launch` of `script` on a rank per host of `hosts`, "other hosts" reached
    through tests/fake_ssh.py (a terminal each, as `ssh -tt` gives), `typed` on its input (kept
    open)."""
    bin_folder = tmp_path / "bin"
    bin_folder.mkdir()
    ssh = bin_folder / "ssh"
    fake = Path(__file__).with_name("fake_ssh.py")
    ssh.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} {shlex.quote(str(fake))} "$@"\n')
    ssh.chmod(0o755)
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps([{"ssh": host, "ips": ["127.0.0.1"]} for host in hosts]))
    argv = [sys.executable, "-m", "streamer", "launch", "--hostfile", str(hostfile)]
    argv += ["--starting-port", str(free_ports()), "--", *shell(script)]
    read_end, write_end = os.pipe()
    path = f"{bin_folder}{os.pathsep}{os.environ['PATH']}"
    process = subprocess.Popen(
        argv,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "PATH": path},
        stdin=read_end,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    os.close(read_end)
    os.write(write_end, typed.encode())
    try:
        return finish(process)
    finally:
        os.close(write_end)


def test_a_remote_rank_stopped_after_another_failed_is_stopped_without_a_traceback(tmp_path):
    """A remote rank's terminal writes `\\r\\n`, and echoes what it is given before mlx.launch's
    script turns its echo off. Before: MLX read `/tmp/tmp.X\\r` (or the echoed input) as the
    rank's pid file, its kill script failed (`CalledProcessError` traceback), and the failed
    rank, whose errors come on its terminal, `wrote nothing on stderr`."""
    script = '[ $MLX_RANK = 1 ] || exec sleep 60; sleep 1; echo "bad disk" >&2; exit 3'
    result = launched_remotely(tmp_path, script, "hello\n")
    assert result.returncode == 3, result.stderr
    assert "Traceback" not in result.stderr and "/tmp/" not in result.stdout, result
    last = result.stderr.splitlines()[-1]
    assert last == "streamer: error: rank 1 exited with status 3: bad disk", result.stderr


def test_a_chat_whose_rank_0_is_remote_is_refused_input_that_ends(tmp_path):
    """Rank 0 on another host reads the terminal ssh opens there, which the end of a pipe never
    reaches. Before: `... | streamer launch --hostfile H -- chat ...` answered, then waited for
    ever (ended only by Ctrl-C)."""
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(
        json.dumps([{"ssh": f"mac{r}", "ips": [f"10.0.0.{r + 1}"]} for r in (0, 1)])
    )
    words = ["--hostfile", str(hostfile), "--", "chat", "--model", "unused"]
    result = subprocess.run(
        [sys.executable, "-m", "streamer", "launch", *words],
        cwd=tmp_path,
        input="hello\n",
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PATH": str(tmp_path)},  # no ssh: a launch that ran fails otherwise
    )
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "chat's rank 0 runs on mac0, in the terminal ssh opens there" in result.stderr


def test_the_end_of_input_is_typed_on_a_remote_ranks_terminal():
    """A remote rank reads the terminal `ssh -tt` opens on its host, which never ends when the
    ssh client's input does. Before: a remote chat read on after the launcher's input ended
    (Ctrl-D typed to the launcher) and ended only on /quit or Ctrl-C."""
    import termios
    import threading

    from streamer.cli.input_relay import InputRelay

    main, terminal = pty.openpty()  # the remote terminal, kept open as sshd keeps it
    attributes = termios.tcgetattr(terminal)
    attributes[3] &= ~termios.ECHO  # as mlx.launch's remote script sets it (stty -echo)
    termios.tcsetattr(terminal, termios.TCSANOW, attributes)
    typed_read, typed_write = os.pipe()
    os.write(typed_write, b"hi\nthere")  # the last line without its newline
    os.close(typed_write)
    relay, echo_off = InputRelay(), threading.Event()
    echo_off.set()
    relay.take(types.SimpleNamespace(stdin=open(os.dup(main), "wb")), echo_off)  # ssh's stdin
    threading.Thread(target=relay.read, args=(open(typed_read, "rb"),), daemon=True).start()
    read = []
    try:
        while read.count(b"") < 2:  # Ctrl-D is typed again: one typed as a chat's prompt
            ready, _, _ = select.select([terminal], [], [], 30)  # switches modes is lost
            assert ready, f"the terminal's input never ended: {read}"
            read.append(os.read(terminal, 1024))
    finally:
        relay.stop()
        os.close(main)
        os.close(terminal)
    assert read == [b"hi\n", b"there\n", b"", b""]


def test_a_host_that_cannot_be_reached_is_named_with_what_ssh_said(tmp_path):
    """MLX reads a rank's first output as the name of its pid file, stderr's too. Before: ssh's
    own error was taken for it, and the launch said `rank 1 exited with status 255 (it wrote
    nothing on stderr)`."""
    result = launched_remotely(tmp_path, "exec sleep 60", "", ("host0", "down1"))
    assert result.returncode == 255, result.stderr
    assert result.stderr.splitlines()[-1] == (
        "streamer: error: rank 1 exited with status 255: ssh: connect to host down1 port 22: "
        "Connection refused"
    ), result.stderr
