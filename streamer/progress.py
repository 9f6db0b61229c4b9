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
