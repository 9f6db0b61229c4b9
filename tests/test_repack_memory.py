"""What a repack holds in memory while it writes the experts: no resident weight."""

from __future__ import annotations

import gc

import mlx.core as mx

import streamer.repack
from fixtures import tiny_config, write_hf_checkpoint
from streamer.repack import repack


def test_the_resident_weights_are_freed_once_written(tmp_path, monkeypatch):
    """The model and the checkpoint's lazily loaded shards held every resident weight to the
    end of the repack, each evaluated as it was written: all of them at once (DeepSeek-V3's 34 GB
    from its FP8 download, where the largest is 1.9 GB). Now each is freed once written."""
    vocab, hidden = 1 << 16, 128  # 2 x 16 MiB of embedding and output in bfloat16: the most
    src = write_hf_checkpoint(tmp_path / "src", tiny_config("qwen3_moe", vocab_size=vocab))
    write_layer, held = streamer.repack.write_layer, []

    def measured(*args, **kwargs):
        held.append(mx.get_active_memory() - before)
        return write_layer(*args, **kwargs)

    monkeypatch.setattr(streamer.repack, "write_layer", measured)
    gc.collect()
    before = mx.get_active_memory()
    repack(src, tmp_path / "out", log=lambda _: None)
    assert len(held) == 2 and max(held) < vocab * hidden * 2 // 4  # not even a quarter of one
