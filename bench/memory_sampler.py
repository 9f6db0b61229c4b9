"""Peak resident memory of this process, sampled on a thread: anonymous and file-backed apart."""

from __future__ import annotations

import threading


class MemorySampler:
    """Peak resident memory of this process, split anonymous / file-backed (Linux /proc).

    ru_maxrss counts file pages the process has mapped (streamer's mmap'd experts), which the
    kernel can reclaim; peak anonymous RSS is what the process really holds.
    """

    def __init__(self, interval: float = 0.02):
        self.peak_anon = 0
        self.peak_file = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)
        self._thread.start()

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.sample()

    def sample(self) -> None:
        try:
            with open("/proc/self/status") as f:
                fields = dict(
                    line.split(":", 1) for line in f if line.startswith(("RssAnon", "RssFile"))
                )
        except OSError:
            return
        self.peak_anon = max(self.peak_anon, int(fields["RssAnon"].split()[0]) * 1024)
        self.peak_file = max(self.peak_file, int(fields["RssFile"].split()[0]) * 1024)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()
