"""A memory balloon: a child process that holds N bytes of RAM so the page cache cannot use them.

The child maps N anonymous bytes and mlocks them; where mlock is not permitted (RLIMIT_MEMLOCK,
no CAP_IPC_LOCK) it writes to every page instead, which pins them as well when there is no swap
(and otherwise holds them until the kernel swaps them out: check `SwapTotal`).

Safety: the balloon refuses a size that would leave less than `reserve` bytes available; it is
killed when the `with` block exits, at interpreter exit, and (Linux) when its parent dies
(PR_SET_PDEATHSIG), and it also exits when its stdin closes. It sets oom_score_adj=1000 so that if
memory runs out anyway, the kernel kills the balloon first.

    with Balloon(8 << 30, reserve=4 << 30) as b:   # hold 8 GiB, refuse unless 4 GiB stay free
        ...
"""

from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import mmap
import os
import signal
import subprocess
import sys
import time

import numpy as np

GiB = 1 << 30


def mem_available() -> int:
    """Bytes the kernel could hand out without swapping (MemAvailable on Linux)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import psutil

    return psutil.virtual_memory().available


class BalloonError(RuntimeError):
    pass


class Balloon:
    def __init__(
        self,
        nbytes: int,
        *,
        reserve: int = 2 * GiB,
        log=lambda m: print(m, file=sys.stderr, flush=True),
    ):
        self.nbytes, self.reserve, self.log = int(nbytes), int(reserve), log
        self.proc: subprocess.Popen | None = None
        self.method: str | None = None

    def __enter__(self) -> Balloon:
        available = mem_available()
        if self.nbytes < 0 or available - self.nbytes < self.reserve:
            raise BalloonError(
                f"refusing a {self.nbytes / GiB:.1f} GiB balloon: "
                f"{available / GiB:.1f} GiB is available and "
                f"{self.reserve / GiB:.1f} GiB must stay available"
            )
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), str(self.nbytes)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        atexit.register(self.release)
        for line in self.proc.stdout:
            if line.startswith("ready"):
                self.method = line.split()[1]
                break
            self.log(line.rstrip())
        else:
            self.release()
            raise BalloonError(
                f"the balloon exited before inflating (exit code {self.proc.returncode})"
            )
        self.log(
            f"[balloon] holding {self.nbytes / GiB:.1f} GiB ({self.method}); "
            f"{mem_available() / GiB:.1f} GiB available"
        )
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def release(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream:
                stream.close()
        self.proc = None
        atexit.unregister(self.release)

    def __exit__(self, *exc) -> None:
        self.release()


def _inflate(nbytes: int) -> None:
    """The child: hold `nbytes`, report `ready <method>`, wait until stdin closes."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    if sys.platform.startswith("linux"):
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the parent
        try:
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write("1000")
        except OSError:
            pass
    region = mmap.mmap(-1, max(nbytes, mmap.PAGESIZE))
    address = ctypes.addressof(ctypes.c_char.from_buffer(region))
    libc.mlock.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    method = "mlock" if libc.mlock(address, len(region)) == 0 else "touch"
    pages = np.frombuffer(region, dtype=np.uint8)
    step = GiB
    start = time.perf_counter()
    for lo in range(
        0, len(pages), step
    ):  # mlock already faulted the pages in; touching is cheap then
        pages[lo : lo + step : mmap.PAGESIZE] = 1
        print(
            f"[balloon] {min(lo + step, len(pages)) / GiB:.1f}/{len(pages) / GiB:.1f} GiB "
            f"({method}, "
            f"{time.perf_counter() - start:.1f} s)",
            flush=True,
        )
    print(f"ready {method}", flush=True)
    sys.stdin.read()  # returns when the parent closes the pipe or dies


if __name__ == "__main__":
    _inflate(int(sys.argv[1]))
