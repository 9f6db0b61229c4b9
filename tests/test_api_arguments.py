"""The Python API takes what users pass (dtype and size strings, mlx-lm's sampling keywords) and
refuses the rest naming the argument; a compute dtype the backend cannot run is refused at load."""

from __future__ import annotations

import pytest

import streamer
from streamer.errors import StreamerError


def test_bad_generation_arguments(checkpoints):
    model, tokenizer = streamer.load(checkpoints.repacked(checkpoints.hf("qwen3_moe")))
    with pytest.raises(StreamerError, match="max_tokens"):
        streamer.generate(model, tokenizer, "hello", max_tokens=0)
    with pytest.raises(StreamerError, match="empty"):
        streamer.generate(model, tokenizer, "", max_tokens=4)


def test_load_takes_what_users_pass(checkpoints):
    import mlx.core as mx
    import numpy as np

    folder = checkpoints.repacked(checkpoints.mlx("qwen3_moe"))
    for dtype in ("float32", "bfloat16", mx.float32):
        model, _ = streamer.load(folder, dtype=dtype, memory_budget="8G")
        assert "all experts resident" in model.streamer.residency
    model, _ = streamer.load(folder, memory_budget="8 GiB")
    # numpy's integer: refused as not 'a number of bytes' before
    model, _ = streamer.load(folder, memory_budget=np.int64(8 << 30))
    assert "all experts resident" in model.streamer.residency
    for kwargs, message in [
        ({"memory_budget": "-1G"}, "memory_budget '-1G' is not a size"),
        ({"memory_budget": "lots"}, "memory_budget 'lots' is not a size"),
        ({"memory_budget": -5}, "memory_budget -5 is not a size"),
        ({"memory_budget": True}, "memory_budget must be a number of bytes"),
        ({"memory_budget": np.bool_(True)}, "memory_budget must be a number of bytes"),
        ({"memory_budget": 1.5e9}, "memory_budget must be a number of bytes"),
        ({"dtype": "float64"}, "dtype must be one of float32, float16, bfloat16"),
        ({"dtype": mx.int8}, "dtype must be one of"),
        ({"verify_reads": "yes"}, "verify_reads must be True or False"),
        ({"trust_remote_code": 1}, "trust_remote_code must be True or False"),
    ]:
        with pytest.raises(StreamerError, match=message):
            streamer.load(folder, **kwargs)
    with pytest.raises(StreamerError, match="path must be a folder name"):
        streamer.load(3)
    with pytest.raises(StreamerError, match=r"missing does not exist: a model is a folder with"):
        streamer.load(folder.parent / "missing")  # it said "is a file"


def test_a_path_too_long_to_look_up_is_refused_in_one_line(tmp_path, capsys):
    """A part over 255 bytes: Path.exists raised OSError (File name too long), a traceback from
    streamer.load and from --model."""
    from streamer.cli import main

    long = tmp_path / ("a" * 300)
    for path in (long, long / "x", "a" * 300):
        with pytest.raises(StreamerError, match="Pass the model's folder, or its org/name"):
            streamer.load(path)
        assert main(["generate", "--model", str(path), "--prompt", "hi"]) == 2
        err = capsys.readouterr().err
        assert "is not a folder, nor a Hugging Face name" in err and len(err.splitlines()) == 1


def test_a_dtype_the_backend_cannot_compute_is_refused_at_load(checkpoints, tmp_path):
    import contextlib
    import io

    import mlx.core as mx
    import mlx_lm

    repacked = checkpoints.repacked(checkpoints.hf("qwen3_moe"))  # unquantized experts
    in_place = tmp_path / "download"  # MLX-quantized but its experts: streamed in place
    with contextlib.redirect_stdout(io.StringIO()):
        mlx_lm.convert(
            str(checkpoints.hf("qwen3_moe")),
            str(in_place),
            quantize=True,
            quant_predicate=lambda path, _: "switch_mlp" not in path,
        )
    for folder in (repacked, in_place):
        if mx.default_device() != mx.cpu:  # a GPU's gather_mm computes in bf16
            streamer.load(folder, dtype="bfloat16")
            continue
        with pytest.raises(StreamerError, match="dtype bfloat16 cannot compute .*dtype='float32'"):
            streamer.load(folder, dtype="bfloat16")
        model, tokenizer = streamer.load(folder)  # float32, the CPU default, computes
        assert streamer.generate(model, tokenizer, "hello", max_tokens=2)
    # quantized experts (gather_qmm) compute in bf16 on every backend: not refused
    model, tokenizer = streamer.load(checkpoints.mlx("qwen3_moe"), dtype="bfloat16")
    assert streamer.generate(model, tokenizer, "hello", max_tokens=2)


def test_generate_takes_mlx_lm_sampling_keywords(checkpoints):
    model, tokenizer = streamer.load(checkpoints.repacked(checkpoints.hf("qwen3_moe")))
    greedy = streamer.generate(model, tokenizer, "hello", max_tokens=8)
    top_1 = streamer.generate(model, tokenizer, "hello", max_tokens=8, temp=0.9, top_k=1, seed=3)
    assert top_1 == greedy  # top_k reached mlx-lm's sampler: one candidate is greedy
    penalised = streamer.generate(
        model, tokenizer, "hello", max_tokens=8, repetition_penalty=1.5, min_p=0.1
    )
    assert isinstance(penalised, str)
    # a top_k past the vocabulary keeps every token (mlx-lm's own sampler refuses it)
    sampled = dict(max_tokens=8, temp=1.0, seed=5)
    every = streamer.generate(model, tokenizer, "hello", top_k=10**6, **sampled)
    assert every == streamer.generate(model, tokenizer, "hello", **sampled)
    for kwargs, message in [
        ({"top_kk": 3}, "unknown keyword argument 'top_kk'; known: temp, top_p, seed, "),
        ({"temp": -1.0}, "temp must be 0"),
        ({"temp": 1e-300}, "temp must be 0 .greedy. or at least 1e-05"),  # random tokens before
        ({"top_p": 0.0}, "top_p must be above 0 and at most 1"),
        ({"seed": -1}, "seed must be an integer from 0"),
        ({"top_k": -2}, "top_k must be an integer, 0"),
        ({"min_p": 2}, "min_p must be from 0"),
        ({"max_kv_size": 0}, "max_kv_size must be at least 5"),
        ({"prefill_step_size": 0}, "prefill_step_size must be at least 1"),  # MLX's reshape
    ]:
        with pytest.raises(StreamerError, match=message):
            streamer.generate(model, tokenizer, "hello", max_tokens=4, **kwargs)


def test_numpy_and_mlx_scalars_are_taken_as_numbers(checkpoints):
    """np.float32(0.9) for temp (a number mlx-lm computes with) was refused as 'temp must be 0
    (greedy) or more', np.int64 for top_k or max_tokens as not an integer, a numpy bias as MLX's
    ValueError; a bool (numpy's too) is still not a number."""
    import mlx.core as mx
    import numpy as np

    model, tokenizer = streamer.load(checkpoints.repacked(checkpoints.hf("qwen3_moe")))
    greedy = streamer.generate(model, tokenizer, "hello", max_tokens=6)
    scalars = dict(temp=np.float32(0.9), top_p=np.float64(1.0), top_k=np.int64(1), seed=mx.array(3))
    penalties = dict(
        min_p=mx.array(0.0), repetition_penalty=np.float32(1.0), max_kv_size=np.int32(64)
    )
    assert (
        streamer.generate(model, tokenizer, "hello", np.int64(6), **scalars, **penalties) == greedy
    )
    biased = streamer.stream_generate(model, tokenizer, "hi", 2, logit_bias={7: np.float32(100)})
    assert [r.token for r in biased] == [7, 7]
    xtc = dict(temp=1.0, seed=1, xtc_probability=1.0, xtc_threshold=0.01)  # MLX's ValueError
    ids = [np.int64(t) for t in range(20)]
    assert streamer.generate(model, tokenizer, "hi", 3, xtc_special_tokens=ids, **xtc) == (
        streamer.generate(model, tokenizer, "hi", 3, xtc_special_tokens=list(range(20)), **xtc)
    )
    for kwargs, message in [
        ({"temp": np.bool_(True)}, r"temp must be 0 \(greedy\) or more \(got True\)"),
        ({"top_k": np.float32(2.0)}, r"top_k must be an integer, 0 \(off\) or more \(got 2.0\)"),
        ({"max_tokens": mx.array(True)}, r"max_tokens must be an integer \(got True\)"),
        ({"top_p": np.float32(np.nan)}, "top_p must be above 0 and at most 1"),
    ]:
        with pytest.raises(StreamerError, match=message):
            streamer.generate(model, tokenizer, "hello", **{"max_tokens": 2, **kwargs})


def test_generate_refuses_what_would_crash_hang_or_compute_nonsense(checkpoints):
    """Each of these ran before: ids past the vocabulary or negative returned text (or ended the
    process with SIGSEGV), a NaN penalty an empty answer, max_tokens=2.5 never stopped."""
    folder = checkpoints.repacked(checkpoints.hf("qwen3_moe"))
    model, tokenizer = streamer.load(folder)
    vocab = len(tokenizer.get_vocab())
    assert streamer.generate(model, tokenizer, [1, vocab - 1], max_tokens=2)  # the last id runs
    for prompt, kwargs, message in [
        ([1, vocab], {}, rf"prompt: token id {vocab} is not one of the model's \({vocab} tokens"),
        ([10**9], {}, "prompt: token id 1000000000 is not one of the model's"),
        ([2**40], {}, "prompt: token id 1099511627776 is not one of the model's"),
        ([-1], {}, "a prompt of token ids holds -1: each must be an integer from 0"),
        (["a"], {}, "a prompt of token ids holds 'a'"),
        ([True], {}, "a prompt of token ids holds True"),
        ("a\ud800b", {}, r"the prompt holds a lone surrogate \('\\ud800' at character 1\)"),
        (5, {}, r"the prompt must be text \(a str\) or a list of token ids \(got int\)"),
        ("hi", {"max_tokens": 2.5}, r"max_tokens must be an integer \(got 2.5\)"),
        ("hi", {"max_tokens": "5"}, r"max_tokens must be an integer \(got '5'\)"),
        ("hi", {"max_tokens": None}, r"max_tokens must be an integer \(got None\)"),
        ("hi", {"repetition_penalty": float("nan")}, r"repetition_penalty must be 0 or more"),
        ("hi", {"repetition_penalty": -1.0}, r"repetition_penalty must be 0 or more"),
        ("hi", {"presence_penalty": float("inf")}, "presence_penalty must be a finite number"),
        ("hi", {"repetition_context_size": 0}, "repetition_context_size must be at least 1"),
        ("hi", {"logit_bias": {10**9: 1.0}}, "logit_bias: token id 1000000000 is not one of"),
        ("hi", {"logit_bias": {-1: 1.0}}, "logit_bias must map token ids"),
        ("hi", {"logit_bias": {"1": 1.0}}, "logit_bias must map token ids"),
        ("hi", {"logit_bias": {1: float("nan")}}, "logit_bias must map token ids"),
        ("hi", {"logit_bias": [1]}, "logit_bias must map token ids"),
        ("hi", {"xtc_probability": 2.0}, "xtc_probability must be from 0 to 1.0"),
        # MLX's ValueError; past the vocabulary a SIGSEGV (the mask indexed out of bounds)
        ("hi", {"xtc_special_tokens": ["a"]}, r"xtc_special_tokens must be a list of token ids"),
        ("hi", {"xtc_special_tokens": 7}, r"xtc_special_tokens must be a list .*\(got 7\)"),
        ("hi", {"xtc_special_tokens": [-1]}, r"xtc_special_tokens must be a list of token ids"),
        ("hi", {"xtc_special_tokens": [10**9]}, "xtc_special_tokens: token id 1000000000 is not"),
        ("hi", {"min_tokens_to_keep": 0}, "min_tokens_to_keep must be at least 1"),
        # mlx-lm's TypeError or AttributeError deep in its loop before
        ("hi", {"sampler": 5}, r"sampler must be a function or None \(got 5\)"),
        ("hi", {"prompt_progress_callback": 3}, "prompt_progress_callback must be a function"),
        ("hi", {"logits_processors": 3}, r"logits_processors must be a list of functions .*got 3"),
        ("hi", {"logits_processors": [3]}, r"logits_processors must be a list of functions"),
        ("hi", {"draft_model": 5}, r"draft_model must be a model .* \(got 5\)"),
        ("hi", {"prompt_cache": 5}, r"prompt_cache must be a list of 2 caches, one a layer"),
        ("hi", {"prompt_cache": []}, r"prompt_cache must be a list of 2 caches.*got \[\]"),
        ("hi", {"prompt_cache": [5, 5]}, r"prompt_cache must be a list of 2 caches"),
        ("hi", {"stream": 5}, r"stream must be an MLX stream or device, such as mx.cpu \(got 5\)"),
    ]:
        kwargs = {"max_tokens": 2, **kwargs}
        with pytest.raises(StreamerError, match=message):
            streamer.generate(model, tokenizer, prompt, **kwargs)
    # sampler=None is mlx-lm's "no sampler": temp and top_p hold (it sampled greedily before)
    sampled = dict(max_tokens=6, temp=1.0, seed=1)
    assert streamer.generate(model, tokenizer, "hi", sampler=None, **sampled) == streamer.generate(
        model, tokenizer, "hi", **sampled
    )
    assert streamer.generate(model, tokenizer, "hi", 2, sampler=None, logits_processors=None)
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)  # what mlx-lm takes is taken
    assert streamer.generate(model, tokenizer, "hi", 2, prompt_cache=cache, stream=mx.cpu)
    biased = streamer.stream_generate(model, tokenizer, "hi", 2, logit_bias={vocab - 1: 100.0})
    assert [r.token for r in biased] == [vocab - 1] * 2  # the bias reached mlx-lm's processor
    for kwargs, message in [
        ({"group": "x"}, "group must be an mx.distributed group"),
        ({"checksums": 5}, r"checksums must be a file name \(str or Path\), got 5"),
        ({"read_path": ["slots"]}, "read_path must be one of slots, mapped"),
    ]:
        with pytest.raises(StreamerError, match=message):
            streamer.load(folder, **kwargs)


def test_a_prompt_of_token_ids_in_an_array_is_taken(checkpoints):
    """Token ids in an mx.array or numpy array, as mlx-lm's stream_generate takes them: refused
    before ("got array"), and a list of numpy's integers (as a prompt or logit_bias's keys) was
    MLX's ValueError (Invalid type int64)."""
    import mlx.core as mx
    import numpy as np

    model, tokenizer = streamer.load(checkpoints.repacked(checkpoints.hf("qwen3_moe")))
    ids = tokenizer.encode("hello there")
    expected = streamer.generate(model, tokenizer, ids, max_tokens=3)
    for prompt in (mx.array(ids), np.array(ids), list(np.array(ids)), tuple(ids)):
        assert streamer.generate(model, tokenizer, prompt, max_tokens=3) == expected
    # logit_bias's ids as numpy's integers: MLX's ValueError (Invalid type int64) before
    biased = streamer.stream_generate(model, tokenizer, ids, 2, logit_bias={np.int64(7): 100.0})
    assert [r.token for r in biased] == [7, 7]
    for prompt, message in [
        (mx.array([1.5, 2.0]), "a prompt of token ids holds 1.5"),
        (np.array([[1, 2]]), r"a prompt of token ids holds \[1, 2\]"),
        (np.array([], dtype=np.int32), "the prompt is empty"),
        (mx.array([10**9]), "prompt: token id 1000000000 is not one of the model's"),
    ]:
        with pytest.raises(StreamerError, match=message):
            streamer.generate(model, tokenizer, prompt, max_tokens=2)


def test_a_model_streamer_did_not_load_is_refused(checkpoints):
    """mlx_lm.load's model (or None) given to streamer.generate: an AttributeError ('Model' object
    has no attribute 'streamer') before."""
    import mlx_lm

    hf = checkpoints.hf("qwen3_moe")
    _, tokenizer = streamer.load(checkpoints.repacked(hf))
    plain, _ = mlx_lm.load(str(hf))
    for model, name in ((plain, "Model"), (None, "NoneType")):
        with pytest.raises(
            StreamerError, match=rf"model must be one streamer.load returned \(got a {name}\)"
        ):
            streamer.generate(model, tokenizer, "hello", max_tokens=2, kv_bits=4)


def test_input_embeddings_and_prompt_cache_tokens_of_the_wrong_kind_are_refused(checkpoints):
    """input_embeddings=3 was mlx-lm's TypeError (len), an array of another width MLX's rms_norm
    ValueError in the first layer; prompt_cache_tokens=5 beside prompt_lookup a TypeError in the
    speculative loop. The width is the model's embedding's (its hidden size, 128 here)."""
    import mlx.core as mx

    model, tokenizer = streamer.load(checkpoints.repacked(checkpoints.hf("qwen3_moe")))
    tokens = tokenizer.encode("hello there")
    n = len(tokens)
    for kwargs, message in [
        ({"input_embeddings": 3}, rf"input_embeddings must be an mx.array of shape \({n}, 128\)"),
        ({"input_embeddings": mx.zeros((n,))}, r"\(got an array of shape \(\d+,\)\)"),
        ({"input_embeddings": mx.zeros((n, 64))}, rf"input_embeddings has shape \({n}, 64\), bu"),
        ({"input_embeddings": mx.zeros((n + 1, 128))}, rf"this model takes \({n}, 128\): one"),
        ({"prompt_lookup": True, "prompt_cache_tokens": 5}, r"prompt_cache_tokens must be a list"),
        ({"prompt_cache_tokens": "ab"}, r"prompt_cache_tokens must be a list .*\(got 'ab'\)"),
        ({"prompt_lookup": True, "prompt_cache_tokens": [10**9]}, "prompt_cache_tokens: token id"),
    ]:
        with pytest.raises(StreamerError, match=message):
            streamer.generate(model, tokenizer, tokens, max_tokens=2, **kwargs)
    embedded = model.model.embed_tokens(mx.array(tokens))  # the tokens' own: the same answer
    assert streamer.generate(model, tokenizer, tokens, 4, input_embeddings=embedded) == (
        streamer.generate(model, tokenizer, tokens, 4)
    )
    assert streamer.generate(
        model, tokenizer, tokens, 4, prompt_lookup=True, prompt_cache_tokens=[]
    )
    model, tokenizer = streamer.load(checkpoints.repacked(checkpoints.hf("deepseek_v3")))
    with pytest.raises(StreamerError, match=r"input_embeddings: this model \(deepseek_v3 in mlx"):
        streamer.generate(model, tokenizer, [1, 2], 2, input_embeddings=mx.zeros((2, 128)))


def test_a_prompt_cache_of_another_model_is_refused(checkpoints, tmp_path):
    """Keys of other heads or widths (another model's cache, or the file mlx-lm's cache_prompt
    wrote for it) were MLX's broadcast ValueError inside the first layer; the model's own cache,
    quantized too and through mlx-lm's cache files, is taken."""
    import mlx.core as mx
    from mlx_lm.models.cache import load_prompt_cache, make_prompt_cache, save_prompt_cache

    model, tokenizer = streamer.load(checkpoints.repacked(checkpoints.hf("qwen3_moe")))
    foreign = make_prompt_cache(model)  # 2 heads 32 wide here; 1 head 64 wide there
    for c in foreign:
        c.update_and_fetch(mx.zeros((1, 1, 3, 64)), mx.zeros((1, 1, 3, 64)))
    path = str(tmp_path / "foreign.safetensors")
    save_prompt_cache(path, foreign)
    for cache in (foreign, load_prompt_cache(path)):
        with pytest.raises(
            StreamerError, match=r"prompt_cache layer 0 holds keys of .* \(1, 64, 64"
        ):
            streamer.generate(model, tokenizer, "hi", 2, prompt_cache=cache)
    for bits in (None, 3):  # 3-bit keys pack 32 values in 3 words
        own = make_prompt_cache(model)
        kv = {"kv_bits": bits, "kv_group_size": 32, "quantized_kv_start": 0} if bits else {}
        streamer.generate(model, tokenizer, "hello", 2, prompt_cache=own, **kv)
        save_prompt_cache(path, own)
        assert streamer.generate(model, tokenizer, "x", 2, prompt_cache=load_prompt_cache(path))


def test_logit_bias_is_checked_against_the_vocabulary_at_the_first_step_only():
    """The width is the same at every step: walking a 150,000-key map at each one cost 5 ms a
    token. A key past the width is refused at the first step, as before."""
    import mlx.core as mx

    from streamer.arguments import logit_bias_in_vocabulary

    [check] = logit_bias_in_vocabulary({5: 1.0})
    check(None, mx.zeros((1, 10)))
    check(None, mx.zeros((1, 3)))  # checked no more: a narrower width lets it through
    [check] = logit_bias_in_vocabulary({5: 1.0})
    with pytest.raises(StreamerError, match="logit_bias: token id 5 is not one of"):
        check(None, mx.zeros((1, 3)))


def test_the_public_signatures_admit_what_is_taken():
    """The annotations say what the functions take: load's memory_budget said int (the README
    passes "8G"), its dtype mx.Dtype (names are taken), generate's prompt a list (a tuple and
    numpy's arrays are taken)."""
    import typing
    from pathlib import Path

    import mlx.core as mx
    import numpy as np

    from streamer.generate import generate, stream_generate
    from streamer.loading.load import load

    def admits(function, name: str, value: object) -> bool:
        hint = typing.get_type_hints(function, localns={"TokenizerWrapper": object})[name]
        return any(isinstance(value, typing.get_origin(t) or t) for t in typing.get_args(hint))

    for name, value in [
        ("memory_budget", "8G"),
        ("memory_budget", 8 << 30),
        ("dtype", "bfloat16"),
        ("dtype", mx.bfloat16),
        ("checksums", Path("sums")),
    ]:
        assert admits(load, name, value), (name, value)
    for function in (generate, stream_generate):
        for prompt in ("hi", [1, 2], (1, 2), mx.array([1, 2]), np.array([1, 2])):
            assert admits(function, "prompt", prompt), (function.__name__, prompt)


def test_load_takes_numpy_s_bools_as_flags(checkpoints):
    """np.True_ for a flag was refused ("must be True or False (got np.True_)"), which mlx-lm
    takes; it is taken as Python's bool, and what is no bool is still refused."""
    import numpy as np

    from streamer.loading.options import load_options

    folder = checkpoints.repacked(checkpoints.mlx("qwen3_moe"))
    model, _, config = streamer.load(
        folder, lazy=np.False_, return_config=np.True_, trust_remote_code=np.bool_(False)
    )
    assert config is model.streamer.config
    options = load_options(verify_reads=np.True_, bypass_page_cache=np.False_)
    assert options.verify_reads is True and options.bypass_page_cache is False
    for value in (np.int64(1), np.float32(1.0), np.array([True]), "yes"):
        with pytest.raises(StreamerError, match="verify_reads must be True or False"):
            streamer.load(folder, verify_reads=value)


def test_load_takes_mlx_lm_load_s_keyword_names():
    """mlx_lm.load's first argument is `path_or_hf_repo`: `streamer.load(path_or_hf_repo=...)`,
    which runs under mlx-lm, was a TypeError (streamer named it `path`)."""
    import inspect

    import mlx_lm

    ours = list(inspect.signature(streamer.load).parameters)
    theirs = list(inspect.signature(mlx_lm.load).parameters)
    assert ours[: len(theirs)] == theirs
    with pytest.raises(StreamerError, match="does not exist"):
        streamer.load(path_or_hf_repo="/nonexistent/model")


def test_mlx_lm_s_positional_verbose_is_told_apart_from_max_tokens(checkpoints):
    """`generate(model, tokenizer, prompt, True)`, mlx-lm's verbose, said only "max_tokens must be
    an integer (got True)"."""
    model, tokenizer = streamer.load(checkpoints.repacked(checkpoints.hf("qwen3_moe")))
    for flag in (True, False):
        with pytest.raises(StreamerError, match=r"fourth argument is max_tokens .*verbose="):
            streamer.generate(model, tokenizer, "hello", flag)


def test_bad_arguments_are_value_errors_as_mlx_lm_s_are(checkpoints, capsys):
    """Code written for mlx-lm catches its bad-argument errors as ValueError; streamer's were
    StreamerError alone, which such code missed. The CLI still says them in one line."""
    from streamer.cli import main

    folder = checkpoints.repacked(checkpoints.hf("qwen3_moe"))
    model, tokenizer = streamer.load(folder)
    for kwargs in ({"max_tokens": 0}, {"prompt": ""}, {"temp": -1.0}, {"kv_bits": 7}):
        call = {"prompt": "hello", "max_tokens": 4, **kwargs}
        with pytest.raises(ValueError) as caught:
            streamer.generate(model, tokenizer, **call)
        assert isinstance(caught.value, StreamerError)
    with pytest.raises(ValueError):
        streamer.load(folder, memory_budget="lots")
    assert main(["generate", "--model", str(folder), "--prompt", "hi", "--max-tokens", "0"]) == 2
    err = capsys.readouterr().err
    assert "--max-tokens must be at least 1" in err and len(err.strip().splitlines()) == 1, err
