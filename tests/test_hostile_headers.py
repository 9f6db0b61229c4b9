"""Hostile safetensors headers: each a StreamerError naming the file and what is wrong."""

from __future__ import annotations

import pytest
from hostile_files import safetensors_file

from streamer.errors import StreamerError
from streamer.io.safetensors import read_header


@pytest.mark.parametrize(
    "header, data, message",
    [
        (
            {
                "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]},
            },
            bytes(24),
            "tensors 'a' and 'b' overlap",
        ),
        (
            {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}},
            bytes(8),
            "data ends at byte 16 but the file holds only 8",
        ),
        (
            {"a": {"dtype": "F32", "shape": [4], "data_offsets": [-8, 8]}},
            bytes(16),
            "invalid data_offsets",
        ),
        (
            {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}},
            bytes(16),
            "16 bytes for shape [3]",
        ),
        (
            {"a": {"dtype": ["F32"], "shape": [4], "data_offsets": [0, 16]}},
            bytes(16),
            "unsupported dtype",
        ),
        (
            {"a": {"dtype": "F32", "shape": [-4], "data_offsets": [0, 16]}},
            bytes(16),
            "invalid shape",
        ),
        ([1, 2], b"", "not a JSON object"),
    ],
)
def test_bad_safetensors_headers(tmp_path, header, data, message):
    path = safetensors_file(tmp_path, header, data)
    with pytest.raises(StreamerError, match="model.safetensors") as err:
        read_header(path)
    assert message in str(err.value)


def test_absurd_header_length(tmp_path):
    path = safetensors_file(tmp_path, {}, length=1 << 62)
    with pytest.raises(
        StreamerError, match="header length 4611686018427387904 is impossible.*Download it again"
    ):
        read_header(path)


def test_duplicate_keys_in_a_safetensors_header(tmp_path):
    entry = '{"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}'
    raw = f'{{"a": {entry}, "a": {entry}}}'.encode()  # json.loads keeps the last
    path = safetensors_file(tmp_path, raw, bytes(4))
    with pytest.raises(StreamerError, match="model.safetensors: header names 'a' twice"):
        read_header(path)


def test_non_string_metadata_values(tmp_path):
    header = {
        "__metadata__": {"format": 1},
        "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
    }
    path = safetensors_file(tmp_path, header, bytes(4))
    with pytest.raises(StreamerError, match="__metadata__ must map names to strings"):
        read_header(path)


def test_an_integer_of_thousands_of_digits(tmp_path):
    """Python refuses to parse an integer of over 4300 digits with a plain ValueError, not a
    JSONDecodeError: it reached the user as a traceback."""
    raw = b'{"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, ' + b"9" * 5000 + b"]}}"
    path = safetensors_file(tmp_path, raw, bytes(4))
    with pytest.raises(StreamerError, match="header holds an integer of over 4300 digits; "):
        read_header(path)


@pytest.mark.parametrize("dtype", ["F64", "F8_E5M2", "F4", "F6_E2M3", "C64"])
def test_a_safetensors_dtype_mlx_cannot_load(tmp_path, dtype):
    """A dtype the safetensors format defines but MLX cannot load was called corruption ("the
    file is corrupt or truncated"): downloading it again cannot help."""
    header = {"a": {"dtype": dtype, "shape": [4], "data_offsets": [0, 4]}}
    path = safetensors_file(tmp_path, header, bytes(4))
    with pytest.raises(StreamerError, match=f"tensor 'a' is {dtype}, which MLX cannot load") as e:
        read_header(path)
    assert "corrupt" not in str(e.value) and "model.safetensors" in str(e.value)
