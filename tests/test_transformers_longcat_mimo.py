"""What the LongCat-Flash and MiMo-V2-Flash checkpoints transformers writes exercise, and the
configs of theirs that streamer reads otherwise than mlx-lm would (test_transformers_written.py
streams each tiny checkpoint against transformers' logits)."""

from __future__ import annotations

import json

import pytest
import torch
from test_parity import PROMPT
from test_transformers_written import assert_streams_as
from transformers import AutoConfig, AutoTokenizer

from fixtures import TINY_CONFIGS
from fixtures.transformers_families import FAMILIES
from fixtures.transformers_written import write_transformers_checkpoint
from streamer.errors import StreamerError
from streamer.io.checkpoint import Checkpoint
from streamer.repack import repack


def _prompt(folder) -> torch.Tensor:
    return torch.tensor([AutoTokenizer.from_pretrained(folder).encode(PROMPT)])


def test_longcat_flash_routes_zero_experts_written_without_down_proj(tmp_path):
    """What the LongCat-Flash check exercises: transformers routes some of the prompt's choices
    to zero (identity) experts and some to routed ones, on corrected scores; it writes the zero
    experts' unused gate and up rows as `experts.{e}.gate_proj` / `up_proj` with no
    `down_proj` (which the repack drops: streamer/repack/layouts.py)."""
    oracle = write_transformers_checkpoint(tmp_path, "longcat_flash")
    routed, zero = oracle.config.n_routed_experts, oracle.config.zero_expert_num
    with Checkpoint(tmp_path) as ckpt:
        names = {n.split(".experts.")[1] for n in ckpt.tensors if ".layers.0.mlp.experts." in n}
    every = range(routed + zero)
    assert names == {f"{e}.{p}_proj.weight" for e in every for p in ("gate", "up")} | {
        f"{e}.down_proj.weight" for e in range(routed)
    }
    chosen = []
    for name, module in oracle.named_modules():
        if name.endswith("mlp.router"):
            assert module.e_score_correction_bias.abs().min() > 0
            module.register_forward_hook(lambda _m, _i, out: chosen.append(out[2].flatten()))
    with torch.no_grad():
        oracle(_prompt(tmp_path))
    chosen = torch.cat(chosen)
    assert (chosen >= routed).any() and (chosen < routed).any()


def test_mimo_v2_flash_window_and_sinks_change_what_transformers_computes(tmp_path):
    """What the MiMo-V2-Flash check exercises: the prompt is longer than the sliding window of 4
    keys and the sliding layers' sinks are nonzero, and each changes transformers' logits
    (so that streaming the same logits checks both)."""
    oracle = write_transformers_checkpoint(tmp_path, "mimo_v2_flash")
    prompt = _prompt(tmp_path)
    with torch.no_grad():
        logits = oracle(prompt).logits
        oracle.config.sliding_window = prompt.shape[1]  # every key in the window
        unwindowed = oracle(prompt).logits
        oracle.config.sliding_window = 4
        for module in oracle.modules():
            if getattr(module, "sinks", None) is not None:
                module.sinks.fill_(-torch.inf)  # no sink
        unsunk = oracle(prompt).logits
    assert (logits - unwindowed).abs().max() > 1e-2
    assert (logits - unsunk).abs().max() > 1e-2


def test_mimo_v2_flash_rope_mlx_lm_cannot_compute_is_refused(tmp_path):
    """transformers 5 keeps a RoPE per layer type; mlx-lm's model rotates one share of the head
    in every layer, so a config.json whose types rotate different shares is refused, by name."""
    write_transformers_checkpoint(tmp_path / "src", "mimo_v2_flash")
    path = tmp_path / "src" / "config.json"
    config = json.loads(path.read_text())
    config["rope_parameters"]["sliding_attention"]["partial_rotary_factor"] = 0.5
    path.write_text(json.dumps(config))
    with pytest.raises(StreamerError, match="rope_parameters.*one partial_rotary_factor"):
        repack(tmp_path / "src", tmp_path / "dst", log=lambda _: None)
    assert not (tmp_path / "dst").exists()


def test_mimo_v2_flash_carrying_the_hub_fields_streams_what_transformers_computes(
    tmp_path, monkeypatch
):
    """A config transformers 5 makes from a published config.json keeps the hub's own fields
    (hybrid_layer_pattern, swa_*, rope_theta, sliding_window_size, ...), which its model does not
    read: it attends to sliding_window_size + 1 keys, rotates by its per-type rope_parameters and
    gives the sliding layers twice the KV heads. Here they disagree with its own fields, as they
    would once a published config is made smaller: transformers' own fields decide."""
    own = AutoConfig.for_model("mimo_v2_flash").to_dict()
    published = TINY_CONFIGS["mimo_v2_flash"]
    hub = {k: v for k, v in published.items() if k not in own and k != "torch_dtype"}
    monkeypatch.setitem(FAMILIES, "mimo_v2_flash", {**FAMILIES["mimo_v2_flash"], **hub})
    oracle = write_transformers_checkpoint(tmp_path / "src", "mimo_v2_flash")
    config = json.loads((tmp_path / "src" / "config.json").read_text())
    assert config["sliding_window"] == config["sliding_window_size"] + 1
    assert config["hybrid_layer_pattern"] == published["hybrid_layer_pattern"]
    assert_streams_as(oracle, tmp_path)
