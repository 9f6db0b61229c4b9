"""Fuzzing the two parsers of untrusted bytes: a safetensors header and a manifest.

Whatever the input, the only exception allowed out is StreamerError (with a message).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
from fuzzing import FUZZ, mutations, only_streamer_errors
from hostile_files import safetensors_file
from hypothesis import given
from hypothesis import strategies as st

from streamer.errors import StreamerError
from streamer.io.manifest import read_manifest
from streamer.io.safetensors import read_header

# -- safetensors headers ---------------------------------------------------------------------------

VALID_HEADER = {
    "__metadata__": {"format": "pt"},
    "a": {"dtype": "BF16", "shape": [2, 4], "data_offsets": [0, 16]},
    "b": {"dtype": "F32", "shape": [3], "data_offsets": [16, 28]},
}


@FUZZ
@given(header=mutations(VALID_HEADER), data_len=st.integers(0, 40))
def test_fuzz_safetensors_header_structure(header, data_len):
    with tempfile.TemporaryDirectory() as tmp:
        raw = json.dumps(header, allow_nan=True).encode()
        only_streamer_errors(lambda: read_header(safetensors_file(Path(tmp), raw, bytes(data_len))))


@FUZZ
@given(
    raw=st.binary(max_size=64),
    data=st.binary(max_size=32),
    length=st.one_of(st.none(), st.integers(0, (1 << 64) - 1)),
)
def test_fuzz_safetensors_header_bytes(raw, data, length):
    with tempfile.TemporaryDirectory() as tmp:
        only_streamer_errors(lambda: read_header(safetensors_file(Path(tmp), raw, data, length)))


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
        read_header(safetensors_file(tmp_path, header.encode()))
