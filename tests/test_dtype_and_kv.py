"""--dtype and mlx-lm's quantized KV cache (--kv-bits) on generate, chat, serve and plan, each
checked against mlx-lm computing the same checkpoint with the same settings."""

from __future__ import annotations

import re
import subprocess
import sys

import mlx.core as mx
import mlx_lm
import pytest
from mlx_lm.generate import DEFAULT_QUANTIZED_KV_START
from mlx_lm.models.cache import QuantizedKVCache, make_prompt_cache

import streamer
from streamer.arguments import QUANTIZED_KV_START
from streamer.cli import main
from streamer.cli.chat import templated
from streamer.errors import StreamerError
from streamer.plan import plan
from streamer.plan.model import model_plan
from streamer.plan.repacked import repacked_plan
from streamer.server.api import Completion, Sampling
from streamer.server.engine import MODEL_KEY, Engine
from streamer.server.jobs import Done, Job, Step

PROMPT = "def read_config(path):"
KV = ["--kv-bits", "4", "--kv-group-size", "32", "--quantized-kv-start", "3"]
KV_KEYWORDS = {"kv_bits": 4, "kv_group_size": 32, "quantized_kv_start": 3}


def cli_generate(capsys, folder, *flags: str, prompt: str = PROMPT) -> tuple[str, str]:
    argv = ["generate", "--model", str(folder), "--prompt", prompt, "--max-tokens", "12"]
    assert main([*argv, "--ignore-chat-template", *flags]) == 0
    out = capsys.readouterr()
    return out.out, out.err


@pytest.mark.parametrize("arch", ["qwen3_moe", "glm4_moe"])
def test_dtype_bfloat16_prints_what_mlx_lm_prints(checkpoints, capsys, arch):
    """mlx-lm computes an MLX 4-bit download in bf16 (its scales' dtype); the CPU's default is
    float32, whose greedy text differs from it on these two tiny families."""
    folder = checkpoints.mlx(arch)
    model, tokenizer = mlx_lm.load(str(folder))
    want = mlx_lm.generate(model, tokenizer, "def main():", max_tokens=12)
    text, stats = cli_generate(capsys, folder, "--dtype", "bfloat16", prompt="def main():")
    assert text == want + "\n" and stats.rstrip().endswith("| bfloat16")
    text, stats = cli_generate(capsys, folder, prompt="def main():")
    assert text != want + "\n" and stats.rstrip().endswith("| float32")


def test_kv_bits_is_mlx_lm_quantized_cache(checkpoints, capsys):
    folder = checkpoints.mlx("qwen3_moe")
    model, tokenizer = mlx_lm.load(str(folder))
    want = mlx_lm.generate(model, tokenizer, PROMPT, max_tokens=12, **KV_KEYWORDS)
    assert cli_generate(capsys, folder, "--dtype", "bfloat16", *KV)[0] == want + "\n"
    assert QUANTIZED_KV_START == DEFAULT_QUANTIZED_KV_START  # the flag's default is mlx-lm's


def test_the_server_engine_keeps_a_quantized_cache(checkpoints):
    """serve and chat: every request quantizes its KV cache as generate does, and the cache kept
    for the next turn is the quantized one."""
    model, tokenizer = streamer.load(checkpoints.repacked(checkpoints.hf("qwen3_moe")))
    prompt = tokenizer.encode(PROMPT)
    want = streamer.generate(model, tokenizer, prompt, 8, **KV_KEYWORDS)
    engine = Engine(model, tokenizer, 2, options=KV_KEYWORDS)
    job = engine.submit(Job(Completion(False, "m", 8, Sampling(), text=PROMPT), prompt, 8))
    pieces = []
    while not isinstance(event := job.events.get(timeout=120), Done):
        assert isinstance(event, Step), event
        pieces.append(event.piece.content)
    assert "".join(pieces) == want
    kept = engine.prompt_cache.fetch_nearest_cache(MODEL_KEY, prompt)[0]
    assert kept and all(isinstance(c, QuantizedKVCache) for c in kept)
    engine.close()


def test_chat_computes_in_the_dtype_and_kv_bits_asked_for(checkpoints):
    folder = checkpoints.mlx("qwen3_moe")  # 4-bit: bf16 computes on the CPU
    model, tokenizer = streamer.load(folder, dtype="bfloat16")
    want = streamer.generate(model, tokenizer, templated(tokenizer, "import os"), 6, **KV_KEYWORDS)
    chat = [sys.executable, "-m", "streamer", "chat", "--model", str(folder), "--max-tokens", "6"]
    result = subprocess.run(
        [*chat, "--dtype", "bfloat16", *KV],
        input="import os\n/stats\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0 and result.stdout == want + "\n", result.stderr
    assert "| bfloat16\n" in result.stderr


def test_kv_bits_refusals(checkpoints, capsys):
    folder = checkpoints.repacked(checkpoints.hf("qwen3_moe"))
    model, tokenizer = streamer.load(folder)
    # head_dim 32: mlx-lm's default group of 64 cannot quantize it
    with pytest.raises(StreamerError, match="kv_group_size 64 does not divide"):
        streamer.generate(model, tokenizer, PROMPT, 4, kv_bits=4, quantized_kv_start=0)
    with pytest.raises(StreamerError, match=r"RotatingKVCache \(what max_kv_size makes\)"):
        streamer.generate(model, tokenizer, PROMPT, 4, kv_bits=4, max_kv_size=8)
    bounded = make_prompt_cache(model, max_kv_size=8)  # mlx-lm's NotImplementedError before
    with pytest.raises(StreamerError, match="RotatingKVCache .*drop kv_bits or prompt_cache"):
        streamer.generate(model, tokenizer, PROMPT, 4, prompt_cache=bounded, **KV_KEYWORDS)
    with pytest.raises(StreamerError, match="kv_bits must be one of 2, 3, 4, 5, 6, 8"):
        streamer.generate(model, tokenizer, PROMPT, 4, kv_bits=7)
    gpt_oss = checkpoints.repacked(checkpoints.hf("gpt_oss"))  # sliding-window layers
    assert main(["generate", "--model", str(gpt_oss), "--prompt", "x", "--kv-bits", "4"]) == 2
    assert "the model's sliding windows" in capsys.readouterr().err
    assert main(["generate", "--model", str(folder), "--prompt", "x", "--kv-bits", "7"]) == 2
    assert "argument --kv-bits: invalid choice" in capsys.readouterr().err


@pytest.mark.parametrize(
    "keywords, flags, message",
    [
        ({"quantized_kv_start": -1}, ["--quantized-kv-start", "-1"], "at least 0 (got -1)"),
        ({"kv_group_size": 48}, ["--kv-group-size", "48"], "32, 64, 128"),
    ],
)
def test_kv_values_are_refused_with_or_without_kv_bits(
    checkpoints, capsys, keywords, flags, message
):
    """The CLI refused a bad --quantized-kv-start or --kv-group-size without --kv-bits, while the
    API took them then (mlx-lm ignores them unquantized), refusing them only beside kv_bits."""
    folder = checkpoints.repacked(checkpoints.hf("qwen3_moe"))
    assert main(["generate", "--model", str(folder), "--prompt", "x", *flags]) == 2
    assert message in capsys.readouterr().err
    model, tokenizer = streamer.load(folder)
    with pytest.raises(StreamerError, match=re.escape(message)):
        streamer.generate(model, tokenizer, PROMPT, 2, **keywords)


@pytest.mark.parametrize("arch", ["qwen3_moe", "deepseek_v3"])
def test_plan_counts_the_quantized_cache(checkpoints, capsys, arch):
    folder = checkpoints.repacked(checkpoints.hf(arch))
    kv = (4, 32)
    fast = repacked_plan(folder, 1 << 30, mx.float32, kv)
    assert fast == model_plan(folder, 1 << 30, None, mx.float32, kv)
    # mlx-lm's own cache after its generate_step quantized it, at 256 tokens
    model, _ = streamer.load(folder)
    cache = make_prompt_cache(model)
    model(mx.zeros((1, 256), dtype=mx.int32), cache=cache)
    cache = [c.to_quantized(group_size=32, bits=4) for c in cache]
    assert fast.kv_bytes_per_1k_tokens * 256 == sum(c.nbytes for c in cache) * 1000
    assert fast.kv_bytes_per_1k_tokens < plan(folder, 1 << 30).kv_bytes_per_1k_tokens
    assert main(["plan", str(folder), "--kv-bits", "4", "--kv-group-size", "32"]) == 0
    assert " per 1k tokens at 4 bits" in capsys.readouterr().out
    if arch == "qwen3_moe":  # sliding windows: mlx-lm has no quantized rotating cache
        with pytest.raises(StreamerError, match="cannot quantize this model's sliding-window"):
            plan(checkpoints.repacked(checkpoints.hf("gpt_oss")), 1 << 30, kv=kv)


def test_plan_plans_the_dtype_a_load_is_given(checkpoints, capsys):
    """generate's --dtype bfloat16 computes in bfloat16, and plan planned this backend's default
    alone (float32 on the CPU): its --dtype was an unrecognized argument."""
    import json

    folder = checkpoints.repacked(checkpoints.hf("qwen3_moe"))
    resident = {}
    for dtype in ("float32", "bfloat16"):
        assert main(["plan", str(folder), "--memory", "8G", "--json", "--dtype", dtype]) == 0
        resident[dtype] = json.loads(capsys.readouterr().out)["resident_bytes"]
        assert resident[dtype] == plan(folder, 8 << 30, dtype=getattr(mx, dtype)).resident_bytes
    assert resident["bfloat16"] < resident["float32"]


@pytest.mark.parametrize("command", ["generate", "chat", "serve"])
def test_a_kv_group_size_that_does_not_divide_the_widths_is_refused_at_start(checkpoints, command):
    """head_dim 32 and the default group of 64: refused after loading, before any prompt, in one
    line naming the flag and a group size that works (chat printed the failure on every message,
    serve answered 500 to every request). A process with a bound: a server would serve on."""
    folder = checkpoints.repacked(checkpoints.hf("qwen3_moe"))
    argv = [command, "--model", str(folder), "--kv-bits", "4"]
    argv += {"generate": ["--prompt", "x"], "chat": [], "serve": ["--port", "0"]}[command]
    result = subprocess.run(
        [sys.executable, "-m", "streamer", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    err = result.stderr.strip().splitlines()
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert err[-1].startswith("streamer: error: --kv-group-size 64 does not divide"), err
    assert "use --kv-group-size 32" in err[-1]


def test_the_engine_refuses_a_kv_group_size_at_start(checkpoints):
    model, tokenizer = streamer.load(checkpoints.repacked(checkpoints.hf("qwen3_moe")))
    with pytest.raises(StreamerError, match="kv_group_size 64 does not divide .* kv_group_size=32"):
        Engine(model, tokenizer, options={"kv_bits": 4})  # the API's spelling


@pytest.mark.parametrize("arch", ["qwen3_moe", "deepseek_v3", "gpt_oss"])
def test_the_kv_widths_are_those_of_the_models_own_cache(checkpoints, arch):
    """The widths come from a lazy twin; the oracle: the loaded model's cache after a token."""
    from streamer.kv_quantization import kv_widths

    model, _ = streamer.load(checkpoints.repacked(checkpoints.hf(arch)))
    cache = make_prompt_cache(model)
    model(mx.array([[1]]), cache=cache)
    mx.eval([c.state for c in cache])
    seen = {a.shape[-1] for c in cache for a in (c.keys, c.values)}
    assert kv_widths(model) == seen and seen


def test_the_kv_shapes_are_measured_once_a_model(checkpoints, monkeypatch):
    """A twin per call cost 20-50 ms on published shapes, and the server checks every reused
    prompt cache: a model's shapes are measured once, a new model's afresh."""
    from streamer import kv_quantization

    built = []
    twin = kv_quantization._twin
    monkeypatch.setattr(kv_quantization, "_twin", lambda m: built.append(m) or twin(m))
    folder = checkpoints.repacked(checkpoints.hf("qwen3_moe"))
    model, _ = streamer.load(folder)
    first = kv_quantization.kv_shapes(model)
    assert first and kv_quantization.kv_shapes(model) == first and len(built) == 1
    other, _ = streamer.load(folder)
    assert kv_quantization.kv_shapes(other) == first and len(built) == 2


def test_kv_bits_on_a_model_whose_attention_cannot_read_a_quantized_cache(checkpoints, capsys):
    """mlx-lm 0.32.2's MLA attention (deepseek_v3, kimi_k2, mistral4, ...) takes the quantized
    cache's packed keys as arrays: an AttributeError traceback at the first step after the
    cache was quantized (mid-answer at the default start of 5000 tokens). Refused at start."""
    folder = checkpoints.repacked(checkpoints.hf("deepseek_v3"))
    model, tokenizer = streamer.load(folder)
    with pytest.raises(StreamerError, match=r"kv_bits: this model's attention \(deepseek_v3 in"):
        streamer.generate(model, tokenizer, PROMPT, 4, **KV_KEYWORDS)
    argv = ["generate", "--model", str(folder), "--prompt", "x", *KV]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("streamer: error: --kv-bits: this model's attention"), err
    assert err[-1].endswith("drop --kv-bits."), err


def test_kv_bits_beside_max_kv_size_is_refused_before_the_model_loads(capsys):
    """Every cache --max-kv-size makes is rotating, which mlx-lm cannot quantize: the refusal came
    once the model had loaded (a real one: minutes), here it says so of a model not even there."""
    argv = ["--model", "/nonexistent", "--max-kv-size", "64", "--kv-bits", "4"]
    for command in (["generate", "-p", "x"], ["chat"]):
        assert main([*command, *argv]) == 2
        err = capsys.readouterr().err
        assert "RotatingKVCache (what --max-kv-size makes): drop --kv-bits" in err, err
