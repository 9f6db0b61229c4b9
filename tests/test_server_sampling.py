"""The request's sampling fields reach the sampler: each one changes what is generated as the
library's own sampling does, through the live server (tests/serving.py)."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.sample_utils import make_logits_processors
from serving import HELLO, NO_CALL, NO_EOS, expected

import streamer
from streamer.server.api import Sampling, parse_completion
from streamer.server.fields import ApiError
from streamer.server.sampling import sampler_and_processors


def test_fields_that_leave_only_the_likeliest_token_answer_greedily(client, served_folder, local):
    greedy = expected(local, HELLO, 8)
    hot = dict(model=str(served_folder), messages=HELLO, max_tokens=8, temperature=5.0, seed=3)
    # top_k 1, min_p 1 (as likely as the likeliest) and a tiny top_p each keep one candidate
    for narrow in ({"top_k": 1}, {"min_p": 1.0}, {"top_p": 1e-9}):
        answer = client.chat.completions.create(**hot, logit_bias=NO_CALL, extra_body=narrow)
        assert answer.choices[0].message.content == greedy, narrow
    wide = client.chat.completions.create(**hot, logit_bias=NO_CALL)
    assert wide.choices[0].message.content != greedy  # at temperature 5 the sampler is used


def test_a_seed_samples_what_the_library_samples_with_it(client, served_folder, local):
    """OpenAI's seed is any 64-bit signed integer: a negative one (other than -1) seeds with its
    64 bits read unsigned. It was refused (400)."""
    model, tokenizer = local
    prompt = tokenizer.apply_chat_template(HELLO, add_generation_prompt=True)
    no_call = make_logits_processors({512: -100})
    for seed, library_seed in ((7, 7), (8, 8), (-2, 2**64 - 2), (-(2**63), 2**63)):
        want = streamer.generate(
            model, tokenizer, prompt, 8, temp=1.0, seed=library_seed, logits_processors=no_call
        )
        answer = client.chat.completions.create(
            model=str(served_folder),
            messages=HELLO,
            max_tokens=8,
            temperature=1.0,
            seed=seed,
            logit_bias=NO_CALL,
        )
        assert answer.choices[0].message.content == want, seed


def test_a_seed_of_minus_1_is_random_as_llama_cpp_reads_it():
    """llama.cpp's clients send seed -1 for a random one: it was refused (400). It overrides the
    server's --seed, as a request's field does."""
    body = {"messages": HELLO, "seed": -1}
    request = parse_completion(body, chat=True, model="m", defaults=Sampling(seed=5))
    assert request.sampling.seed is None
    del body["seed"]
    request = parse_completion(body, chat=True, model="m", defaults=Sampling(seed=5))
    assert request.sampling.seed == 5


def test_a_request_takes_the_temperatures_serve_takes():
    """A temperature's range is check_sampling's for serve's --temp and a request's field alike:
    `serve --temp 150` was every request's default, yet a request asking 150 was refused (400)."""
    from streamer.arguments import check_sampling

    check_sampling(150.0, 1.0, None)  # serve's --temp 150, and the API's temp=150
    body = {"messages": HELLO, "temperature": 150}
    assert parse_completion(body, chat=True, model="m", defaults=Sampling()).sampling.temperature
    with pytest.raises(ApiError, match="temperature must be 0 .greedy. or at least 1e-05"):
        parse_completion({**body, "temperature": 1e-9}, chat=True, model="m", defaults=Sampling())


def test_max_completion_tokens_bounds_the_answer(client, served_folder):
    answer = client.chat.completions.create(
        model=str(served_folder),
        messages=HELLO,
        max_completion_tokens=3,
        max_tokens=9,  # the newer field wins, as OpenAI defines it
        logit_bias=NO_EOS,
    )
    assert answer.usage.completion_tokens == 3 and answer.choices[0].finish_reason == "length"
    stats = answer.model_extra["streamer"]
    assert {"expert_mb_per_token", "page_cache_hit_rate", "generation_tokens_per_second"} <= set(
        stats
    )


def test_a_repetition_penalty_of_0_is_off(client, served_folder, local):
    """0 is mlx-lm's server's default and means no penalty there: it was refused (400)."""
    answer = client.chat.completions.create(
        model=str(served_folder),
        messages=HELLO,
        max_tokens=8,
        logit_bias=NO_CALL,
        extra_body={"repetition_penalty": 0},
    )
    assert answer.choices[0].message.content == expected(local, HELLO, 8)


def test_logit_bias_is_checked_against_the_vocabulary_at_the_first_step_only():
    """The width is the same at every step: walking a 150,000-key map at each one cost 5 ms a
    token. A key past the width is refused at the first step, as before."""
    _, (check_width, *_) = sampler_and_processors(Sampling(logit_bias={5: 1.0}))
    check_width(None, mx.zeros((1, 10)))
    check_width(None, mx.zeros((1, 3)))  # checked no more: a narrower width lets it through
    _, (check_width, *_) = sampler_and_processors(Sampling(logit_bias={5: 1.0}))
    with pytest.raises(ApiError, match="past the model's vocabulary"):
        check_width(None, mx.zeros((1, 3)))
