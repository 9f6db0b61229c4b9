"""Progress of long work: a bar with an ETA when stderr is a terminal (tqdm), nothing otherwise.

Long work also logs plain lines (one per layer or file); the bar only adds what a person watching
a terminal wants between them: how far within the step, and how long is left.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager


@contextmanager
def progress_bar(total: int, what: str, unit: str = "it"):
    """A bar over `total` units of `what` (tqdm's: `.update(n)`), disabled unless on a terminal."""
    from tqdm import tqdm

    bar = tqdm(
        total=total,
        desc=what,
        unit=unit,
        unit_scale=unit == "B",
        unit_divisor=1024,  # bytes in binary units, as every size is printed (io/sizes.py)
        disable=not sys.stderr.isatty(),
        leave=False,
        file=sys.stderr,
    )
    try:
        yield bar
    finally:
        bar.close()


def above(bar, log):
    """`log` for use while `bar` is shown: each line is written above the bar, not into it."""

    def write(message: str) -> None:
        with bar.external_write_mode(file=sys.stderr):
            log(message)

    return write


PREFILL_BAR_TOKENS = 512  # a shorter prompt's prefill is over before a bar says anything


class PrefillProgress:
    """mlx-lm's `prompt_progress_callback` as a bar of prompt tokens (on a terminal only, for a
    prompt of PREFILL_BAR_TOKENS or more), updated after each prefill chunk and gone at the first
    token. One instance serves one generation after another."""

    def __init__(self) -> None:
        self.bar = None

    def __call__(self, done: int, total: int) -> None:
        if done == 0:
            self.close()  # a new prompt (an earlier one may have stopped part way)
        if self.bar is None:
            if done >= total or total < PREFILL_BAR_TOKENS:
                return
            from tqdm import tqdm

            self.bar = tqdm(
                total=total,
                desc="prefill",
                unit="tok",
                disable=not sys.stderr.isatty(),
                leave=False,
                file=sys.stderr,
            )
        self.bar.update(done - self.bar.n)
        if done >= total:
            self.close()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
