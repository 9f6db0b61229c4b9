"""`ssh` for launches to "other hosts" on this machine: runs the command here, as sshd runs it.
With -tt the command gets a terminal, as sshd gives it: its stdin, stdout and stderr all on one
pty (default modes: echo on, `\n` written as `\r\n`) that stays open when the client's input
ends; the client's end (a kill) hangs it up. A host whose name begins with `down` is off."""

from __future__ import annotations

import os
import pty
import select
import sys


def main(args: list[str]) -> int:
    terminal = "-tt" in args
    while args[0].startswith("-"):
        args = args[2:] if args[0] == "-o" else args[1:]
    host, command = args[0], ["bash", "-c", " ".join(args[1:])]
    if host.startswith("down"):  # a host that is off, as ssh says it
        print(f"ssh: connect to host {host} port 22: Connection refused", file=sys.stderr)
        return 255
    if not terminal:
        os.execvp(command[0], command)
    pid, main_fd = pty.fork()
    if pid == 0:
        os.execvp(command[0], command)
    inputs = [0]
    while True:
        ready, _, _ = select.select([main_fd, *inputs], [], [])
        if 0 in ready:
            data = os.read(0, 65536)
            if data:
                os.write(main_fd, data)
            else:
                inputs = []  # sshd passes no end of input to a terminal
        if main_fd in ready:
            try:
                data = os.read(main_fd, 65536)
            except OSError:  # the command and its terminal have ended
                data = b""
            if not data:
                break
            os.write(1, data)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) & 255


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
