"""Speculative decoding on a streamed model is exact: greedy output with a draft model or prompt
lookup is plain greedy output on both read paths, sampling is mlx-lm's speculative sampling, the
KV cache is trimmed to the kept tokens, and a verify pass syncs once per layer."""

from __future__ import annotations

import mlx.core as mx
import mlx_lm
import pytest
from conftest import reference_model
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.sample_utils import make_sampler
from test_parity import PROMPT, read_paths

import streamer
from fixtures import tiny_config, write_hf_checkpoint
from streamer.speculative.draft_model import load_draft_model

TOKENS = 40


@pytest.fixture(scope="module")
def target(checkpoints):
    """The streamed model (4-bit, as mlx_lm.convert writes it) and mlx-lm's resident one."""
    src = checkpoints.mlx("qwen3_moe")
    return checkpoints.repacked(src), reference_model(src)


@pytest.fixture(scope="module")
def random_draft(checkpoints):
    """A draft with the target's tokenizer and random weights of its own: most drafts rejected."""
    folder = checkpoints.made(
        checkpoints.root / "draft-qwen3_moe-seed1",
        lambda path: write_hf_checkpoint(path, tiny_config("qwen3_moe"), seed=1),
    )
    return reference_model(folder)


def tokens(model, tokenizer, n: int = TOKENS, **kwargs) -> list[int]:
    return [r.token for r in streamer.stream_generate(model, tokenizer, PROMPT, n, **kwargs)]


@pytest.mark.parametrize("read_path", read_paths())
def test_greedy_with_drafts_is_plain_greedy(target, random_draft, read_path):
    folder, reference = target
    model, tokenizer = streamer.load(folder, memory_budget=0, read_path=read_path)
    plain = tokens(model, tokenizer)
    stats = model.streamer.stats
    layers = stats.moe_layers
    drafters = {
        "oracle": dict(draft_model=reference, num_draft_tokens=4),  # the target's own greedy
        "random draft": dict(draft_model=random_draft, num_draft_tokens=3),
        "prompt lookup": dict(prompt_lookup=2, num_draft_tokens=5),
    }
    for name, kwargs in drafters.items():
        assert tokens(model, tokenizer, **kwargs) == plain, (read_path, name)
        drafts, decode = stats.drafts, stats.decode
        assert stats.decode_tokens == TOKENS and drafts.emitted == TOKENS, name
        assert decode.layer_calls == drafts.passes * layers  # one call per layer per pass
        # one host sync per layer for a whole pass (none while a file is in the page cache)
        assert decode.syncs <= decode.layer_calls
        if read_path == "slots":
            assert decode.syncs == decode.layer_calls
        if name == "oracle":  # every draft kept: k+1 tokens per pass
            assert drafts.accepted == drafts.drafted and drafts.passes == -(-TOKENS // 5)
            assert drafts.wasted_experts == 0
        if name == "random draft":  # rejected drafts' reads counted as waste
            assert drafts.accepted < drafts.drafted
            assert drafts.wasted_experts > 0 and drafts.wasted_bytes > 0
            assert drafts.wasted_bytes <= decode.bytes_read
        if name == "prompt lookup":  # the random model repeats itself: lookup finds drafts
            assert drafts.accepted > 0 and drafts.passes < TOKENS


@pytest.mark.parametrize("temp, seed", [(0.5, 5), (0.3, 1)])
def test_sampling_with_a_draft_is_mlx_lms_speculative_sampling(target, temp, seed):
    """The oracle draft samples with its own draws: some drafts kept, some not."""
    folder, reference = target
    model, tokenizer = streamer.load(folder, memory_budget=0)
    ours = tokens(model, tokenizer, draft_model=reference, num_draft_tokens=3, temp=temp, seed=seed)
    mx.random.seed(seed)
    theirs = mlx_lm.stream_generate(
        reference,
        tokenizer,
        PROMPT,
        max_tokens=TOKENS,
        draft_model=reference,
        num_draft_tokens=3,
        sampler=make_sampler(temp),
    )
    assert ours == [r.token for r in theirs]
    drafts = model.streamer.stats.drafts
    assert 0 < drafts.accepted < drafts.drafted


def test_logits_processors_see_the_sequence_as_in_plain_decoding(target):
    model, tokenizer = streamer.load(target[0], memory_budget=0)
    plain = tokens(model, tokenizer, repetition_penalty=1.5, repetition_context_size=8)
    looked_up = tokens(
        model, tokenizer, prompt_lookup=1, repetition_penalty=1.5, repetition_context_size=8
    )
    assert looked_up == plain


@pytest.mark.parametrize("after", [1, 10])
def test_greedy_with_drafts_and_kv_bits_is_plain_greedy(target, after):
    """A quantized_kv_start reached while decoding: a pass crossing it computed the positions
    from it on over the cache not yet quantized (and one trimmed back below it left the cache
    quantized), where plain decoding computes them over the quantized cache: the greedy output
    left plain greedy output (mlx-lm 0.32.2's own speculative decoding does too)."""
    model, tokenizer = streamer.load(target[0], memory_budget=0)
    start = len(tokenizer.encode(PROMPT)) + after
    kv = dict(kv_bits=2, kv_group_size=32, quantized_kv_start=start)
    plain = tokens(model, tokenizer, 30, **kv)
    oracle = tokens(model, tokenizer, 30, draft_model=target[1], num_draft_tokens=4, **kv)
    assert oracle == plain
    assert tokens(model, tokenizer, 30, prompt_lookup=1, num_draft_tokens=6, **kv) == plain


def test_kv_bits_without_a_start_quantizes_where_plain_decoding_does(target):
    """quantized_kv_start left out is mlx-lm's default (5000 tokens) with drafts too: the
    speculative loop's own default was 0, so drafting quantized the cache from the first token,
    where plain decoding with the same keywords kept it unquantized."""
    from mlx_lm.models.cache import QuantizedKVCache

    model, tokenizer = streamer.load(target[0], memory_budget=0)
    kinds = []
    for drafting in ({}, {"prompt_lookup": True}):
        cache = make_prompt_cache(model)
        tokens(model, tokenizer, 8, kv_bits=4, kv_group_size=32, prompt_cache=cache, **drafting)
        kinds.append({isinstance(c, QuantizedKVCache) for c in cache})
    assert kinds == [{False}, {False}]


def test_the_kv_cache_keeps_only_the_kept_tokens(target, random_draft):
    """A run stopped after n tokens leaves the cache holding the prompt and n - 1 of them (the
    last is the next run's prompt): continuing from it gives what one plain run gives."""
    model, tokenizer = streamer.load(target[0], memory_budget=0)
    plain = tokens(model, tokenizer, 2 * TOKENS)
    cache = make_prompt_cache(model)
    first = tokens(model, tokenizer, draft_model=random_draft, prompt_cache=cache)
    assert cache[0].offset == len(tokenizer.encode(PROMPT)) + TOKENS - 1
    rest = streamer.stream_generate(
        model, tokenizer, first[-1:], TOKENS, prompt_lookup=True, prompt_cache=cache
    )
    assert first + [r.token for r in rest] == plain
    # all drafts kept, max_tokens ending a pass part way: the cache ends where the output does
    cache = make_prompt_cache(model)
    tokens(model, tokenizer, 10, draft_model=target[1], num_draft_tokens=3, prompt_cache=cache)
    assert model.streamer.stats.drafts.accepted == 8  # passes of 4 + 4 + 2: all drafts kept
    assert cache[0].offset == len(tokenizer.encode(PROMPT)) + 10 - 1


def test_the_stats_line_reports_drafts(target):
    model, tokenizer = streamer.load(target[0], memory_budget=0)
    *_, last = streamer.stream_generate(model, tokenizer, PROMPT, 16, prompt_lookup=True)
    assert "kept per pass" in last.stats.line() and "wasted" in last.stats.line()
    *_, last = streamer.stream_generate(model, tokenizer, PROMPT, 16, num_draft_tokens=4)
    assert last.stats.drafts is None and "drafts" not in last.stats.line()


def test_one_decode_token_has_no_rate(target):
    """mlx-lm rates decode from the first token's time: over one token it has no interval (it
    reads thousands of tok/s), so the line says n/a there and a rate from two tokens on."""
    model, tokenizer = streamer.load(target[0], memory_budget=0)
    *_, one = streamer.stream_generate(model, tokenizer, PROMPT, 1)
    assert one.stats.generation_tokens == 1 and "decode: 1 token, n/a tok/s" in one.stats.line()
    *_, two = streamer.stream_generate(model, tokenizer, PROMPT, 2)
    rate = f"decode: 2 tokens, {two.stats.generation_tps:.1f} tok/s"
    assert two.stats.generation_tps > 0 and rate in two.stats.line()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(prompt_lookup=2, draft_model="x"), "not both"),
        (dict(prompt_lookup=2, num_draft_tokens=-1), "num_draft_tokens must be at least 0"),
        (dict(prompt_lookup=2, num_draft_tokens=65), "num_draft_tokens must be at most 64"),
        (dict(prompt_lookup="3"), r"prompt_lookup must be an integer \(got '3'\)"),
        (dict(prompt_lookup=-1), r"prompt_lookup must be at least 1 \(got -1\)"),  # as the CLI's
        (dict(prompt_lookup=2, max_kv_size=64), "max_kv_size cannot be combined"),
        (dict(draft_model="no/such-draft"), "neither a folder nor in the Hugging Face cache"),
    ],
)
def test_bad_speculative_arguments_are_refused(target, kwargs, message):
    model, tokenizer = streamer.load(target[0], memory_budget=0)
    with pytest.raises(streamer.StreamerError, match=message):
        tokens(model, tokenizer, 4, **kwargs)


def test_a_draft_with_a_larger_vocabulary_drafts_only_the_models_tokens(target, checkpoints):
    """The same tokenizer, more embedding rows (a padded vocabulary, as published draft/target
    pairs have): its ids past the tokenizer were fed to the target, read out of bounds, and the
    greedy output left plain greedy output. They end the draft now."""
    model, tokenizer = streamer.load(target[0], memory_budget=0)
    config = tiny_config("qwen3_moe")
    folder = checkpoints.made(
        checkpoints.root / "draft-qwen3_moe-vocab-x4",
        lambda path: write_hf_checkpoint(
            path, {**config, "vocab_size": 4 * config["vocab_size"]}, seed=3
        ),
    )
    drafted = tokens(model, tokenizer, 30, draft_model=str(folder), num_draft_tokens=4)
    assert drafted == tokens(model, tokenizer, 30)


def test_a_bounded_prompt_cache_is_refused_with_drafts(target):
    """A prompt_cache made with max_kv_size (the keyword itself is refused with drafts): one
    shorter than the prompt was MLX's broadcast ValueError in the first pass, a longer one
    drafted into a window whose passes see other keys than single steps."""
    model, tokenizer = streamer.load(target[0], memory_budget=0)
    for size in (4, 64):
        cache = make_prompt_cache(model, max_kv_size=size)
        with pytest.raises(streamer.StreamerError, match=f"RotatingKVCache of {size} tokens"):
            tokens(model, tokenizer, 4, prompt_lookup=1, prompt_cache=cache)


def test_a_draft_with_another_tokenizer_is_refused(target):
    from pathlib import Path

    model, tokenizer = streamer.load(target[0], memory_budget=0)
    demo = Path(streamer.__file__).parent / "demo_model"  # its own tokenizer, 2k tokens
    with pytest.raises(streamer.StreamerError, match="must use the model's own tokenizer"):
        load_draft_model(demo, tokenizer, model.streamer.load_dtype)


def test_a_draft_named_by_folder_computes_in_the_loads_dtype(target, checkpoints, monkeypatch):
    """`dtype='bfloat16'` (the CPU computes 4-bit experts in it): the draft loaded for it was in
    float32, the backend's default, whatever the load was given."""
    from streamer.speculative import stream

    drafts, drafter = [], stream.DraftModel

    def recorded(draft, *args, **kwargs):
        drafts.append(draft)
        return drafter(draft, *args, **kwargs)

    monkeypatch.setattr(stream, "DraftModel", recorded)
    model, tokenizer = streamer.load(target[0], memory_budget=0, dtype="bfloat16")
    plain = tokens(model, tokenizer, 8)
    assert tokens(model, tokenizer, 8, draft_model=str(checkpoints.mlx("qwen3_moe"))) == plain
    norm = drafts[0].model.norm.weight
    assert norm.dtype == mx.bfloat16


def test_a_draft_whose_experts_the_backend_cannot_compute_in_the_dtype_is_refused(
    target, checkpoints
):
    """Unquantized experts in bfloat16 on the CPU (its gather_mm is float32-only): refused as
    the streamed model is, before a token; the draft was loaded in float32 whatever the load's
    dtype, and would have failed at its first draft once it followed it."""
    model, tokenizer = streamer.load(target[0], memory_budget=0, dtype="bfloat16")
    draft = checkpoints.hf("qwen3_moe")  # unquantized experts: mlx-lm's SwitchLinear
    with pytest.raises(streamer.StreamerError) as refused:
        tokens(model, tokenizer, 2, draft_model=str(draft))
    assert str(refused.value).startswith(
        f"dtype bfloat16 cannot compute draft model {draft}'s unquantized experts on MLX's cpu "
        "backend ("
    )
    assert refused.value.flags.endswith(
        "pass --dtype float32 (the default there) or a quantized draft model."
    )


def test_a_sliding_window_cache_is_trimmed_past_its_window():
    """mlx-lm's trim_prompt_cache trims nothing from a RotatingKVCache once its window is full;
    streamer/speculative/trim.py drops a pass's rejected tokens there, so the next step sees the
    last window of kept tokens (each key here holds its token's position)."""
    from mlx_lm.models.cache import RotatingKVCache, trim_prompt_cache

    from streamer.speculative.trim import trim

    def keys(positions):
        return mx.array(list(positions), mx.float32).reshape(1, 1, -1, 1)

    def seen_by_next_step(trimmer) -> list[int]:
        cache = RotatingKVCache(max_size=8)
        cache.update_and_fetch(keys(range(20)), keys(range(20)))  # the prompt
        cache.update_and_fetch(keys(range(20, 24)), keys(range(20, 24)))  # a pass: 3 drafts
        trimmer([cache], 3)  # all three rejected
        seen, _ = cache.update_and_fetch(keys([100]), keys([100]))  # the next step
        return sorted(int(v) for v in seen.reshape(-1).tolist())

    assert seen_by_next_step(trim) == [*range(14, 21), 100]
    assert seen_by_next_step(trim_prompt_cache) != [*range(14, 21), 100]  # mlx-lm 0.32.2's


def test_a_draft_whose_tokenizer_has_the_same_size_but_other_ids_is_refused(
    target, checkpoints, tmp_path
):
    """Two tokens' ids swapped: the same vocabulary size, so a size check let it through."""
    import json
    import shutil

    model, tokenizer = streamer.load(target[0], memory_budget=0)
    dtype = model.streamer.load_dtype
    draft = tmp_path / "draft"
    shutil.copytree(checkpoints.mlx("qwen3_moe"), draft)
    data = json.loads((draft / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[300:302]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (draft / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(streamer.StreamerError, match=f"has token {b!r} as id {vocab[b]}, which"):
        load_draft_model(draft, tokenizer, dtype)
    load_draft_model(checkpoints.mlx("qwen3_moe"), tokenizer, dtype)  # its own: accepted


def test_the_draft_model_prefills_in_the_targets_steps(target, random_draft, monkeypatch):
    """prefill_step_size bounds the draft model's prompt chunks too, as mlx-lm's drafting reads
    one step for both: the draft prefilled 512 tokens at a time whatever was asked."""
    from streamer.speculative import drafters

    steps = []

    def recorded(model, cache, tokens, step, *rest):
        steps.append(step)
        return prefill(model, cache, tokens, step, *rest)

    prefill = drafters.prefill
    monkeypatch.setattr(drafters, "prefill", recorded)
    model, tokenizer = streamer.load(target[0], memory_budget=0)
    tokens(model, tokenizer, 4, draft_model=random_draft, prefill_step_size=3)
    assert steps == [3]
