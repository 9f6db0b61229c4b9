"""Stop strings in serve's output (streamer/server/output.py): the text before the first one,
whatever pieces it comes in, partial matches held back; a token's work bounded by its own text."""

from __future__ import annotations

import random
import sys

from streamer.server import output
from streamer.server.output import StopStrings


def _expected(stream: str, stops: list[str]) -> str:
    """The stream cut at its first stop string (the one starting first), found the plain way."""
    ends = [stream.find(s) for s in stops if s in stream]
    return stream[: min(ends)] if ends else stream


def _fed(pieces: list[str], stops: list[str]) -> tuple[str, bool]:
    """What StopStrings passes on for `pieces`, and whether a stop string ended it."""
    stopper, sent = StopStrings(stops), []
    for piece in pieces:
        text, stopped = stopper.feed(piece)
        sent.append(text)
        if stopped:
            return "".join(sent), True
        assert not any(s in "".join(sent) for s in stops)  # nothing of a stop passed on
    return "".join(sent) + stopper.flush(), False


def test_the_text_is_cut_at_the_first_stop_string_however_it_is_split():
    generator = random.Random(0)
    for _ in range(2000):
        count = generator.randint(0, 3)  # none: the text passes whole
        stops = ["".join(generator.choices("ab", k=generator.randint(1, 5))) for _ in range(count)]
        stream = "".join(generator.choices("abc", k=generator.randint(0, 20)))
        cuts = sorted(generator.sample(range(len(stream) + 1), generator.randint(0, len(stream))))
        pieces = [stream[i:j] for i, j in zip([0, *cuts], [*cuts, len(stream)])]
        text, stopped = _fed(pieces, stops)
        if len(pieces) == 1:  # one piece: the stop that starts first
            assert text == _expected(stream, stops), (stream, stops)
        assert stopped == any(s in stream for s in stops), (pieces, stops)
        assert stream.startswith(text) and not any(s in text for s in stops)
        assert not stopped or any(stream[len(text) :].startswith(s) for s in stops)
        assert stopped or text == stream


def test_a_token_costs_steps_in_proportion_to_its_own_text():
    """16 stops of 1,000 characters, one held back whole but its last character: each further
    character compared every held-back end of the text with each stop (about 16,000 steps)."""
    stops = ["a" * 999 + "b", *("a" + chr(ord("c") + i) * 999 for i in range(15))]
    stopper = StopStrings(stops)
    assert stopper.feed("a" * 999) == ("", False)
    steps = 0

    def count(frame, event, arg):
        nonlocal steps
        steps += event == "line" and frame.f_code.co_filename == output.__file__
        return count

    sys.settrace(count)
    try:
        assert stopper.feed("a") == ("a", False)
    finally:
        sys.settrace(None)
    assert steps < 500, steps
