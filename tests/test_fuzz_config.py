"""Fuzzing config.json values through repack and load, and the config a manifest carries through
load: whatever the values, the only exception allowed out is StreamerError (with a message)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from fuzzing import fuzz_settings, only_streamer_errors, scalars
from hypothesis import given
from hypothesis import strategies as st

import streamer
from streamer.repack import repack

CONFIG_FUZZ = fuzz_settings(60)  # each example repacks and loads a model
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
