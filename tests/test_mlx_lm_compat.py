"""Code written for mlx-lm's load, generate and stream_generate runs on streamer's and gets the
same answers: the same responses, the same arguments taken (numpy's numbers too), and those
streamer cannot honour refused by name."""

from __future__ import annotations

import mlx.core as mx
import mlx_lm
import pytest

import streamer
from streamer.errors import StreamerError


@pytest.fixture(scope="module")
def both(checkpoints):
    """streamer's model and mlx-lm's, resident in float32, of one checkpoint."""
    hf = checkpoints.hf("qwen3_moe")
    model, tokenizer = streamer.load(checkpoints.repacked(hf))
    reference, reference_tokenizer = mlx_lm.load(str(hf))
    reference.set_dtype(mx.float32)
    return (model, tokenizer), (reference, reference_tokenizer)


def test_responses_carry_mlx_lm_generation_response_fields(both):
    """r.prompt_tokens, r.generation_tps, r.peak_memory, r.from_draft, ...: AttributeError before
    (only r.stats held them)."""
    (model, tokenizer), (reference, reference_tokenizer) = both
    ours = list(streamer.stream_generate(model, tokenizer, "hello", 5))
    theirs = list(mlx_lm.stream_generate(reference, reference_tokenizer, "hello", 5))
    for r, expected in zip(ours, theirs, strict=True):
        for name in ("text", "token", "from_draft", "prompt_tokens", "generation_tokens"):
            assert getattr(r, name) == getattr(expected, name), name
        assert r.finish_reason == expected.finish_reason
        assert mx.allclose(r.logprobs, expected.logprobs, atol=1e-4)
        for name in ("prompt_tps", "generation_tps", "peak_memory"):
            assert isinstance(getattr(r, name), float) and getattr(r, name) > 0, name
    assert ours[-1].peak_memory == ours[-1].stats.peak_mlx_bytes / 1e9
    drafted = list(streamer.stream_generate(model, tokenizer, "hello", 5, draft_model=reference))
    assert [r.token for r in drafted] == [r.token for r in theirs]
    assert any(r.from_draft for r in drafted)  # the reference drafts its own tokens


def test_numpy_numbers_are_taken_as_mlx_lm_takes_them(both):
    """Settings read from numpy (np.int64 max_tokens, seed, top_k, kv_group_size; np.float64 or
    float32 temp, top_p; a logit_bias of numpy's numbers) were refused as if out of range
    ("temp must be 0 (greedy) or more (got np.float64(0.7))")."""
    import numpy as np

    (model, tokenizer), _ = both
    plain = dict(temp=0.7, top_p=0.9, seed=3, top_k=5, kv_bits=4, kv_group_size=32)
    numpy = dict(
        temp=np.float32(0.7),
        top_p=np.float64(0.9),
        seed=np.int64(3),
        top_k=np.int32(5),
        kv_bits=np.int8(4),
        kv_group_size=np.int64(32),
    )
    expected = streamer.generate(model, tokenizer, "hello", 6, **plain)
    assert streamer.generate(model, tokenizer, "hello", np.int64(6), **numpy) == expected
    biased = streamer.stream_generate(model, tokenizer, "hi", 2, logit_bias={7: np.float32(100)})
    assert [r.token for r in biased] == [7, 7]
    with pytest.raises(StreamerError, match=r"temp must be 0 \(greedy\) or more \(got nan\)"):
        streamer.generate(model, tokenizer, "hello", 2, temp=np.float64("nan"))
    with pytest.raises(StreamerError, match=r"seed must be an integer .*\(got True\)"):
        streamer.generate(model, tokenizer, "hello", 2, seed=True)  # a bool is no number here


def test_load_takes_mlx_lm_arguments_or_refuses_them_by_name(checkpoints):
    """mlx_lm.load's arguments, positional in its order too, were a TypeError ("unexpected
    keyword argument 'tokenizer_config'", "takes 1 positional argument but 2 were given")."""
    folder = checkpoints.repacked(checkpoints.hf("qwen3_moe"))
    ends = {"eos_token": "<|user|>"}  # a token of its vocabulary (a new one is refused: below)
    _, tokenizer, config = streamer.load(folder, ends, None, None, False, True)
    _, reference_tokenizer, reference_config = mlx_lm.load(
        str(checkpoints.hf("qwen3_moe")), ends, return_config=True
    )
    assert tokenizer.eos_token == reference_tokenizer.eos_token == "<|user|>"
    assert config["model_type"] == reference_config["model_type"] == "qwen3_moe"
    assert config["hidden_size"] == reference_config["hidden_size"]
    assert len(streamer.load(folder, model_config={}, lazy=False, return_config=False)) == 2
    for kwargs, message in [
        ({"tokenizer_config": "x"}, r"tokenizer_config must be a dict .*\(got 'x'\)"),
        ({"tokenizer_config": {"eos_token": "hello"}}, "a token given in tokenizer_config"),
        ({"model_config": {"hidden_size": 64}}, "model_config: streamer builds the model from"),
        ({"adapter_path": "adapters"}, "adapter_path: streamer applies no LoRA adapters"),
        ({"lazy": True}, "lazy=True: streamer reads the resident weights at load"),
        ({"lazy": "no"}, r"lazy must be True or False \(got 'no'\)"),
        # a folder has no revisions to pull: it said `streamer pull FOLDER --revision main`
        ({"revision": "main"}, r"revision: .* is a folder, loaded as it is: leave revision out"),
        ({"return_config": 1}, r"return_config must be True or False \(got 1\)"),
    ]:
        with pytest.raises(StreamerError, match=message):
            streamer.load(folder, **kwargs)
    with pytest.raises(StreamerError, match=r"`streamer pull tiny-org/Absent --revision v2`"):
        streamer.load("tiny-org/Absent", revision="v2")


def test_objects_generate_cannot_use_are_refused_by_name(both):
    """temp or top_p beside a sampler were ignored without a word (mlx-lm refuses temp); a None
    tokenizer was an AttributeError ('NoneType' object has no attribute 'bos_token'); mx.gpu
    without a GPU backend MLX's ValueError from inside the loop."""
    from mlx_lm.sample_utils import make_sampler

    (model, tokenizer), _ = both
    greedy = make_sampler(0.0)
    for kwargs, message in [
        ({"sampler": greedy, "temp": 0.8}, "give either sampler= or temp=, not both"),
        ({"sampler": greedy, "top_p": 0.5}, "give either sampler= or top_p=, not both"),
        ({"sampler": greedy, "min_p": 0.1}, "give either sampler= or min_p=, not both"),
    ]:
        with pytest.raises(StreamerError, match=message):
            streamer.generate(model, tokenizer, "hello", 2, **kwargs)
    assert streamer.generate(model, tokenizer, "hello", 2, sampler=greedy, seed=1)
    assert streamer.generate(model, tokenizer._tokenizer, "hello", 2)  # as mlx-lm wraps it
    for other in (None, "tokenizer", model):
        with pytest.raises(StreamerError, match="tokenizer must be the one streamer.load returned"):
            streamer.generate(model, other, "hello", 2)
    if not mx.is_available(mx.gpu):
        for stream in (mx.gpu, mx.Device(mx.gpu)):
            with pytest.raises(StreamerError, match=r"stream .*gpu.*: this MLX has no such device"):
                streamer.generate(model, tokenizer, "hello", 2, stream=stream)
    assert streamer.generate(model, tokenizer, "hello", 2, stream=mx.cpu)


def test_embeddings_alone_are_a_prompt_as_mlx_lm_takes_them(both):
    """input_embeddings with an empty prompt (mlx-lm's "Either input_embeddings or prompt (or
    both)") was refused: "the prompt is empty"; taken, they count against the context."""
    (model, tokenizer), (reference, reference_tokenizer) = both
    tokens = tokenizer.encode("hello there")
    embedded = model.model.embed_tokens(mx.array(tokens))
    expected = [
        r.token
        for r in mlx_lm.stream_generate(
            reference, reference_tokenizer, [], 4, input_embeddings=embedded
        )
    ]
    for prompt in ([], mx.array([], dtype=mx.int32)):
        ours = streamer.stream_generate(model, tokenizer, prompt, 4, input_embeddings=embedded)
        assert [r.token for r in ours] == expected
    assert expected == [r.token for r in streamer.stream_generate(model, tokenizer, tokens, 4)]
    for embeddings, message in [
        (mx.zeros((0, 128)), r"input_embeddings has shape \(0, 128\), but this model takes \(n,"),
        (mx.zeros((2, 64)), r"takes \(n, 128\): one vector a prompt token \(n\), each as wide"),
    ]:
        with pytest.raises(StreamerError, match=message):
            streamer.generate(model, tokenizer, [], 2, input_embeddings=embeddings)
    with pytest.raises(StreamerError, match="the prompt is empty"):
        streamer.generate(model, tokenizer, [], 2)
    # embeddings alone count against the context as a prompt's tokens do (they went unchecked)
    context = model.streamer.context_length
    long = mx.zeros((context - 1, 128))
    with pytest.raises(StreamerError, match=f"the prompt is {context - 1} tokens and max_tokens"):
        streamer.generate(model, tokenizer, [], 2, input_embeddings=long)


def test_a_folder_under_the_home_folder_is_found_by_its_tilde_path(checkpoints, monkeypatch):
    """ "~/models/x" was read as a folder named "~" in the current folder: "does not exist"."""
    folder = checkpoints.repacked(checkpoints.hf("qwen3_moe"))
    monkeypatch.setenv("HOME", str(folder.parent))
    model, _ = streamer.load(f"~/{folder.name}")
    assert model.streamer.config["model_type"] == "qwen3_moe"
    with pytest.raises(StreamerError, match=rf"{folder.parent}/missing does not exist"):
        streamer.load("~/missing")


def test_max_tokens_minus_one_generates_until_the_context_is_full(both, monkeypatch):
    """mlx-lm's max_tokens=-1 ("no limit") was refused: "max_tokens must be at least 1"; it runs
    until the model's context (2048 here) is full, past which a model computes nonsense."""
    import numpy as np

    (model, tokenizer), _ = both
    context = model.streamer.context_length
    prompt = [7] * (context - 5)
    unlimited = [r.token for r in streamer.stream_generate(model, tokenizer, prompt, -1)]
    assert unlimited == [r.token for r in streamer.stream_generate(model, tokenizer, prompt, 5)]
    assert streamer.generate(model, tokenizer, prompt, np.int64(-1))
    full = "the prompt is 2048 tokens but the model's context is 2048 tokens .*leaves no room"
    with pytest.raises(StreamerError, match=full):
        streamer.generate(model, tokenizer, [7] * context, -1)
    for bad in (0, -2, -1.0):
        with pytest.raises(StreamerError, match="max_tokens must be"):
            streamer.generate(model, tokenizer, "hello", bad)
    monkeypatch.setattr(model.streamer, "context_length", None)  # a config.json without one
    with pytest.raises(StreamerError, match="config.json gives no context"):
        streamer.generate(model, tokenizer, "hello", -1)


def test_penalty_windows_and_xtc_special_tokens_past_what_mlx_slices_or_has(both):
    """A penalty's context size past 2**31 was MLX's std::bad_cast or "Slice indices must be
    32-bit integers" from inside the loop; xtc_special_tokens not a list, or an id past the
    vocabulary, an MLX error at its first evaluation."""
    import numpy as np

    (model, tokenizer), _ = both
    for name in ("repetition", "presence", "frequency"):
        answers = [
            streamer.generate(
                model, tokenizer, "hello", 6, **{f"{name}_penalty": 1.3, f"{name}_context_size": n}
            )
            for n in (100, 10**30)
        ]
        assert answers[0] == answers[1]  # a window past the tokens is all of them
    xtc = dict(temp=1.0, seed=2, xtc_probability=0.5, xtc_threshold=0.1, max_tokens=4)
    expected = streamer.generate(model, tokenizer, "hello", xtc_special_tokens=[0, 1], **xtc)
    assert (
        streamer.generate(
            model, tokenizer, "hello", xtc_special_tokens=[np.int64(0), np.int64(1)], **xtc
        )
        == expected
    )
    for special, message in [
        ("x", r"xtc_special_tokens must be a list of token ids \(integers from 0\) \(got 'x'\)"),
        (5, r"xtc_special_tokens must be a list of token ids \(integers from 0\) \(got 5\)"),
        ([10**9], "xtc_special_tokens: token id 1000000000 is not one of the model's"),
        (["a"], r"xtc_special_tokens must be a list of token ids \(integers from 0\)"),
    ]:
        with pytest.raises(StreamerError, match=message):
            streamer.generate(model, tokenizer, "hello", xtc_special_tokens=special, **xtc)


def test_a_kv_window_no_larger_than_what_mlx_lm_always_keeps_is_refused(both):
    """mlx-lm's rotating cache keeps the first 4 tokens: max_kv_size 4 or less, with a prompt
    longer than a prefill step, was MLX's ValueError ([broadcast_shapes] Shapes (2,4) and
    (1,4,2,6) cannot be broadcast) from inside the first layer."""
    (model, tokenizer), (reference, reference_tokenizer) = both
    prompt = list(range(1, 13))
    bounded = dict(max_kv_size=5, prefill_step_size=2)
    expected = mlx_lm.stream_generate(reference, reference_tokenizer, prompt, 4, **bounded)
    ours = streamer.stream_generate(model, tokenizer, prompt, 4, **bounded)
    assert [r.token for r in ours] == [r.token for r in expected]
    for size in (1, 4):
        with pytest.raises(StreamerError, match=rf"max_kv_size must be at least 5 \(got {size}\)"):
            streamer.generate(model, tokenizer, prompt, 4, max_kv_size=size, prefill_step_size=2)


def test_a_prompt_cache_reused_across_turns_counts_against_the_context(both):
    """Multi-turn with make_prompt_cache gives mlx-lm's tokens; a turn whose prompt fits but not
    after what the cache holds from earlier turns ran past the model's context unrefused."""
    from mlx_lm.models.cache import make_prompt_cache

    (model, tokenizer), (reference, reference_tokenizer) = both
    turns = ("hello there", "and more", "again")
    answers = []
    for generating, m, tok in (
        (streamer.stream_generate, model, tokenizer),
        (mlx_lm.stream_generate, reference, reference_tokenizer),
    ):
        cache = make_prompt_cache(m)
        answers.append(
            [[r.token for r in generating(m, tok, p, 5, prompt_cache=cache)] for p in turns]
        )
    assert answers[0] == answers[1]
    context = model.streamer.context_length
    cache = make_prompt_cache(model)
    streamer.generate(model, tokenizer, [7] * (context - 60), 20, prompt_cache=cache)
    held = "after the 2008 tokens prompt_cache holds"
    with pytest.raises(
        StreamerError, match=rf"the prompt is 40 tokens {held} and max_tokens is 20"
    ):
        streamer.generate(model, tokenizer, [7] * 40, 20, prompt_cache=cache)
    with pytest.raises(StreamerError, match=f"{held} .*leaves no room: .*a new prompt_cache"):
        streamer.generate(model, tokenizer, [7] * 40, -1, prompt_cache=cache)
    assert streamer.generate(model, tokenizer, [7] * 20, 20, prompt_cache=cache)  # just fits
