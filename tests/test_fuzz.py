"""Fuzzing the two parsers of untrusted bytes: a safetensors header and a manifest.

Whatever the input, the only exception allowed out is StreamerError (with a message).
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamer.errors import StreamerError
from streamer.io.manifest import read_manifest
from streamer.io.safetensors import read_header

# FUZZ_N=5000 for a longer hunt; 200 keeps the suite fast
FUZZ = settings(
    max_examples=int(os.environ.get("FUZZ_N", 200)),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

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


# -- safetensors headers ---------------------------------------------------------------------------

VALID_HEADER = {
    "__metadata__": {"format": "pt"},
    "a": {"dtype": "BF16", "shape": [2, 4], "data_offsets": [0, 16]},
    "b": {"dtype": "F32", "shape": [3], "data_offsets": [16, 28]},
}


def header_file(folder: Path, header_bytes: bytes, data: bytes, length: int | None = None) -> Path:
    path = folder / "model.safetensors"
    path.write_bytes(
        struct.pack("<Q", len(header_bytes) if length is None else length) + header_bytes + data
    )
    return path


@FUZZ
@given(header=mutations(VALID_HEADER), data_len=st.integers(0, 40))
def test_fuzz_safetensors_header_structure(header, data_len):
    with tempfile.TemporaryDirectory() as tmp:
        raw = json.dumps(header, allow_nan=True).encode()
        only_streamer_errors(lambda: read_header(header_file(Path(tmp), raw, bytes(data_len))))


@FUZZ
@given(
    raw=st.binary(max_size=64),
    data=st.binary(max_size=32),
    length=st.one_of(st.none(), st.integers(0, (1 << 64) - 1)),
)
def test_fuzz_safetensors_header_bytes(raw, data, length):
    with tempfile.TemporaryDirectory() as tmp:
        only_streamer_errors(lambda: read_header(header_file(Path(tmp), raw, data, length)))


# -- manifests -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def valid_manifest(checkpoints) -> dict:
    folder = checkpoints.repacked(checkpoints.mlx("olmoe"))
    manifest = json.loads((folder / "manifest.json").read_text())
    # keep the fuzzed document small: two experts per layer are enough structure
    for layer in manifest["moe_layers"]:
        layer["experts"] = layer["experts"][:2]
        layer["num_experts"] = 2
    manifest["config"] = {"model_type": "olmoe"}
    return manifest


def test_fuzz_manifest_structure(valid_manifest):
    @FUZZ
    @given(doc=mutations(valid_manifest))
    def check(doc):
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "manifest.json").write_text(json.dumps(doc, allow_nan=True))
            only_streamer_errors(lambda: read_manifest(tmp))

    check()


def test_fuzzed_baseline_manifest_parses(valid_manifest, tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps(valid_manifest))
    assert len(read_manifest(tmp_path).layers) == 2


@FUZZ
@given(raw=st.binary(max_size=200))
def test_fuzz_manifest_bytes(raw):
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "manifest.json").write_bytes(raw)
        only_streamer_errors(lambda: read_manifest(tmp))


def test_deeply_nested_json_is_refused_cleanly(tmp_path):
    (tmp_path / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(StreamerError, match="manifest.json"):
        read_manifest(tmp_path)
    header = ("{" + '"a":') * 50_000 + "1" + "}" * 50_000
    with pytest.raises(StreamerError, match="model.safetensors"):
        read_header(header_file(tmp_path, header.encode(), b""))


# -- config.json values, through repack and load ---------------------------------------------------

CONFIG_FUZZ = settings(
    max_examples=int(os.environ.get("FUZZ_N", 60)),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
config_values = st.one_of(
    st.integers(-3, 40),  # zero, negative, top-k above the expert count, a few layers
    st.sampled_from([1 << 31, 1 << 40, 10**30]),
    st.floats(),
    st.none(),
    st.booleans(),
    st.text(max_size=6),
    st.lists(st.integers(-2, 6), max_size=3),
    st.dictionaries(st.sampled_from(["bits", "group_size", "mode", "x"]), scalars, max_size=3),
)
# fields mlx-lm reads that the tiny qwen3_moe config may not spell out
EXTRA_FIELDS = [
    "quantization",
    "rope_scaling",
    "quantization_config",
    "eos_token_id",
    "text_config",
]


@st.composite
def config_edits(draw, config: dict) -> dict:
    edited = dict(config)
    for _ in range(draw(st.integers(1, 2))):
        key = draw(st.sampled_from(sorted(config) + EXTRA_FIELDS))
        if key in edited and draw(st.integers(0, 5)) == 0:
            del edited[key]
        else:
            edited[key] = draw(config_values)
    return edited


def linked_copy(src: Path, dst: Path, skip: str) -> Path:
    """`src`'s files as symbolic links in `dst`, except `skip` (written by the caller)."""
    dst.mkdir()
    for path in src.iterdir():
        if path.name != skip and path.is_file():
            (dst / path.name).symlink_to(path)
    return dst


def test_fuzz_config_values_through_repack_and_load(checkpoints):
    import streamer
    from streamer.repack import repack

    src = checkpoints.hf("qwen3_moe")
    config = json.loads((src / "config.json").read_text())

    @CONFIG_FUZZ
    @given(edited=config_edits(config))
    def check(edited):
        with tempfile.TemporaryDirectory() as tmp:
            folder = linked_copy(src, Path(tmp) / "src", "config.json")
            (folder / "config.json").write_text(json.dumps(edited, allow_nan=True))
            dst = Path(tmp) / "dst"
            only_streamer_errors(lambda: repack(folder, dst, log=lambda _: None))
            if dst.exists():
                only_streamer_errors(lambda: streamer.load(dst, memory_budget=0))

    check()


def test_fuzz_manifest_config_values_through_load(checkpoints):
    import streamer

    repacked = checkpoints.repacked(checkpoints.hf("qwen3_moe"))
    manifest = json.loads((repacked / "manifest.json").read_text())

    @CONFIG_FUZZ
    @given(edited=config_edits(manifest["config"]))
    def check(edited):
        with tempfile.TemporaryDirectory() as tmp:
            folder = linked_copy(repacked, Path(tmp) / "dst", "manifest.json")
            (folder / "experts").symlink_to(repacked / "experts")
            doc = {**manifest, "config": edited}
            (folder / "manifest.json").write_text(json.dumps(doc, allow_nan=True))
            only_streamer_errors(lambda: streamer.load(folder, memory_budget=0))

    check()
