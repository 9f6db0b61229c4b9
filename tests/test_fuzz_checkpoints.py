"""tools/fuzz_checkpoints.py, a few fixed cases: the fuzzer runs, and what it finds in them is
still only streamer's one-line errors or success (a longer hunt: run the tool itself)."""

from __future__ import annotations

import pytest

from tools.fuzz_checkpoints import run_case


@pytest.mark.parametrize("case", [0, 1, 2])
def test_fuzzed_download_is_refused_in_one_line_or_repacked(checkpoints, tmp_path, case):
    record = run_case(
        "hf", checkpoints.hf("qwen3_moe"), 7, case, tmp_path, 120, None, only=("repack", "plan")
    )
    assert record["outcome"] in ("ok", "error"), record
