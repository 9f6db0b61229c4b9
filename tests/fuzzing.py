"""What the fuzz tests share: hypothesis settings, JSON strategies, a valid document mutated a
few subtrees at a time, and the one property (only a StreamerError, with a message, gets out)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from streamer.errors import StreamerError


def fuzz_settings(examples: int) -> settings:
    """`examples` inputs per test, or FUZZ_N of them (FUZZ_N=5000 for a longer hunt)."""
    return settings(
        max_examples=int(os.environ.get("FUZZ_N", examples)),
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )


FUZZ = fuzz_settings(200)  # the parsers: 200 keeps the suite fast

scalars = st.one_of(
    st.integers(-2, 70000),  # near the valid values: offsets, sizes, shapes
    st.none(),
    st.booleans(),
    st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.floats(),
    st.text(max_size=8),
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


def paths(value, prefix=()):
    """Every path (tuple of keys/indices) into a JSON value."""
    yield prefix
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, child in items:
        yield from paths(child, (*prefix, key))


def replaced(value, path, new):
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = replaced(value[path[0]], path[1:], new)
    return copy


@st.composite
def mutations(draw, valid):
    """A valid document with a few subtrees replaced by arbitrary JSON (or deleted)."""
    doc = valid
    for _ in range(draw(st.integers(1, 3))):
        options = list(paths(doc))
        path = draw(st.sampled_from(options[1:] or options))  # the root itself: see the bytes tests
        if (
            path
            and isinstance(doc, dict)
            and draw(st.booleans())
            and isinstance(_parent(doc, path), dict)
        ):
            parent = dict(_parent(doc, path))
            parent.pop(path[-1], None)
            doc = replaced(doc, path[:-1], parent)
        else:
            doc = replaced(doc, path, draw(json_values))
    return doc


def _parent(doc, path):
    for key in path[:-1]:
        doc = doc[key]
    return doc


def only_streamer_errors(call) -> None:
    try:
        call()
    except StreamerError as e:
        assert str(e)
