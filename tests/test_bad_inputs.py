"""Bad input gets a clear error naming the file and what to do, and nothing is written."""

from __future__ import annotations

import json
import shutil

import pytest

import streamer
from streamer.errors import StreamerError
from streamer.repack import repack


def copy_checkpoint(src, tmp_path):
    dst = tmp_path / "src"
    shutil.copytree(src, dst)
    return dst


def assert_refused(src, tmp_path, *patterns: str, **kwargs) -> None:
    dst = tmp_path / "out"
    with pytest.raises(StreamerError) as err:
        repack(src, dst, log=lambda _: None, **kwargs)
    message = str(err.value)
    for pattern in patterns:
        assert pattern in message, message
    assert not dst.exists()
    assert not list(tmp_path.glob(".out*")), "a partial output was left behind"


def test_missing_config(checkpoints, tmp_path):
    src = copy_checkpoint(checkpoints.hf("qwen3_moe"), tmp_path)
    (src / "config.json").unlink()
    assert_refused(src, tmp_path, "config.json is missing")


def test_unknown_and_non_moe_model_types(checkpoints, tmp_path):
    src = copy_checkpoint(checkpoints.hf("qwen3_moe"), tmp_path)
    reasons = {"llama": "model has no MoE layers", "not_a_model": "not a model that mlx-lm"}
    for model_type, reason in reasons.items():
        config = json.loads((src / "config.json").read_text())
        (src / "config.json").write_text(json.dumps({**config, "model_type": model_type}))
        assert_refused(src, tmp_path, f"'{model_type}' is not supported", reason, "README")


def test_truncated_shard(checkpoints, tmp_path):
    src = copy_checkpoint(checkpoints.hf("mixtral"), tmp_path)
    shard = sorted(src.glob("model-*.safetensors"))[-1]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 1000])
    assert_refused(src, tmp_path, shard.name, "truncated")


def test_missing_expert_tensor(checkpoints, tmp_path):
    from streamer.io.safetensors import read_header, to_mlx, write_safetensors

    src = copy_checkpoint(checkpoints.hf("qwen3_moe"), tmp_path)
    missing = "model.layers.1.mlp.experts.5.up_proj.weight"
    index = json.loads((src / "model.safetensors.index.json").read_text())
    shard = src / index["weight_map"].pop(missing)
    header = read_header(shard)
    data = shard.read_bytes()
    kept = [
        (n, to_mlx(data[i.start : i.end], i.dtype, i.shape))
        for n, i in header.items()
        if n != missing
    ]
    write_safetensors(shard, kept)
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    assert_refused(src, tmp_path, missing, "incomplete")


def test_index_naming_a_missing_shard(checkpoints, tmp_path):
    src = copy_checkpoint(checkpoints.hf("olmoe"), tmp_path)
    shard = sorted(src.glob("model-*.safetensors"))[0]
    shard.unlink()
    assert_refused(src, tmp_path, shard.name, "model.safetensors.index.json", "missing")


def test_git_lfs_pointer_in_place_of_a_shard(checkpoints, tmp_path):
    src = copy_checkpoint(checkpoints.hf("olmoe"), tmp_path)
    shard = sorted(src.glob("model-*.safetensors"))[0]
    shard.write_text("version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 123\n")
    assert_refused(src, tmp_path, shard.name, "git-LFS pointer", "git lfs pull")


def test_shape_mismatch_with_config(checkpoints, tmp_path):
    src = copy_checkpoint(checkpoints.hf("qwen2_moe"), tmp_path)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "moe_intermediate_size": 32}))
    assert_refused(src, tmp_path, "shape", "config.json")


def test_existing_destination_is_refused_unless_forced(checkpoints, tmp_path):
    src = checkpoints.hf("qwen3_moe")
    dst = tmp_path / "out"
    repack(src, dst, log=lambda _: None)
    with pytest.raises(StreamerError, match="already exists.*--force"):
        repack(src, dst, log=lambda _: None)
    repack(src, dst, force=True, log=lambda _: None)  # a streamer output: replaced
    assert (dst / "manifest.json").exists() and not list(tmp_path.glob(".out*"))


def test_force_replaces_nothing_but_a_streamer_output(checkpoints, tmp_path):
    """--force never deletes the source, a folder around it, or a folder that is not ours."""
    src = copy_checkpoint(checkpoints.hf("qwen3_moe"), tmp_path)
    before = sorted(p.name for p in src.iterdir())
    for dst in (src, src / "out", tmp_path, src.parent / "src" / "."):
        with pytest.raises(StreamerError, match="the source folder, inside it or around it"):
            repack(src, dst, force=True, log=lambda _: None)
    assert sorted(p.name for p in src.iterdir()) == before
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "precious.txt").write_text("keep me")
    for folder in (mine, tmp_path / "file"):
        if folder.name == "file":
            folder.write_text("a file")
        with pytest.raises(StreamerError, match="not a folder written by `streamer repack`"):
            repack(src, folder, force=True, log=lambda _: None)
    assert (mine / "precious.txt").read_text() == "keep me"
    with pytest.raises(StreamerError, match="is a file, not a folder"):
        repack(src, tmp_path / "file" / "out", log=lambda _: None)


def test_a_folder_appearing_at_the_destination_is_left_alone(checkpoints, tmp_path):
    src = checkpoints.hf("qwen3_moe")
    dst = tmp_path / "out"

    def user_creates_dst(message):
        if "layer 2/2" in message:
            dst.mkdir()
            (dst / "precious.txt").write_text("keep me")

    with pytest.raises(StreamerError, match="appeared while repacking and was left alone") as e:
        repack(src, dst, log=user_creates_dst)
    assert "--resume" in str(e.value)
    assert sorted(p.name for p in dst.iterdir()) == ["precious.txt"]
    (dst / "precious.txt").rename(tmp_path / "precious.txt")
    dst.rmdir()
    repack(src, dst, resume=True, log=lambda _: None)  # the finished work was kept
    streamer.load(dst)


def test_already_quantized_checkpoint_with_quantize(checkpoints, tmp_path):
    from streamer.repack import Quantize

    assert_refused(
        checkpoints.mlx("qwen3_moe"), tmp_path, "already quantized", quantize=Quantize(4)
    )


def test_manifest_of_a_newer_format_version(checkpoints, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(checkpoints.repacked(checkpoints.hf("qwen3_moe")), folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**manifest, "format_version": 99}))
    with pytest.raises(StreamerError, match="format version 99.*upgrade streamer"):
        streamer.load(folder)


def test_loading_a_download_that_is_not_mlx_quantized(checkpoints):
    src = checkpoints.hf("qwen3_moe")  # bf16: only MLX-quantized downloads stream in place
    with pytest.raises(StreamerError, match="not MLX-quantized.*streamer repack .* --quantize 4"):
        streamer.load(src)


def test_truncated_expert_file(checkpoints, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(checkpoints.repacked(checkpoints.hf("mixtral")), folder)
    expert_file = folder / "experts" / "001.bin"
    expert_file.write_bytes(expert_file.read_bytes()[:-4096])
    with pytest.raises(StreamerError, match="001.bin.*truncated"):
        streamer.load(folder)


def test_bad_generation_arguments(checkpoints):
    model, tokenizer = streamer.load(checkpoints.repacked(checkpoints.hf("qwen3_moe")))
    with pytest.raises(StreamerError, match="max_tokens"):
        streamer.generate(model, tokenizer, "hello", max_tokens=0)
    with pytest.raises(StreamerError, match="empty"):
        streamer.generate(model, tokenizer, "", max_tokens=4)


BAD_CONFIG_VALUES = [
    ("num_experts", 0, "num_experts is 0"),
    ("num_experts_per_tok", 17, "num_experts_per_tok is 17, expected an integer from 1 to the 16"),
    ("num_experts_per_tok", 0, "num_experts_per_tok is 0"),
    ("num_attention_heads", 0, "num_attention_heads is 0"),
    ("moe_intermediate_size", -64, "moe_intermediate_size is -64"),
    ("model_type", 3, "model_type is 3, expected a string"),
    ("num_hidden_layers", 10**9, "num_hidden_layers is 1000000000"),
    ("hidden_size", 1 << 40, "hidden_size is 1099511627776"),
    ("rms_norm_eps", "tiny", "rms_norm_eps is 'tiny', expected a finite number"),
    ("quantization", {"bits": 4, "group_size": "64"}, "quantization.group_size is '64'"),
]


@pytest.mark.parametrize("field,value,message", BAD_CONFIG_VALUES)
def test_config_values_are_checked_at_repack(checkpoints, tmp_path, field, value, message):
    src = copy_checkpoint(checkpoints.hf("qwen3_moe"), tmp_path)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, field: value}))
    assert_refused(src, tmp_path, "config.json", message)


@pytest.mark.parametrize("field,value,message", BAD_CONFIG_VALUES)
def test_manifest_config_values_are_checked_at_load(checkpoints, tmp_path, field, value, message):
    folder = tmp_path / "model"
    shutil.copytree(checkpoints.repacked(checkpoints.hf("qwen3_moe")), folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["config"][field] = value
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(StreamerError, match="manifest.json") as err:
        streamer.load(folder)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_layer_count_beyond_the_tensors_present(checkpoints, tmp_path):
    src = copy_checkpoint(checkpoints.hf("qwen3_moe"), tmp_path)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 900}))
    assert_refused(src, tmp_path, "config.json")


def test_manifest_layer_count_beyond_its_layers(checkpoints, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(checkpoints.repacked(checkpoints.hf("qwen3_moe")), folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["config"]["num_hidden_layers"] = 900
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(StreamerError, match="num_hidden_layers is 900 but the weights hold"):
        streamer.load(folder)


def test_load_takes_what_users_pass(checkpoints):
    import mlx.core as mx

    folder = checkpoints.repacked(checkpoints.mlx("qwen3_moe"))
    for dtype in ("float32", "bfloat16", mx.float32):
        model, _ = streamer.load(folder, dtype=dtype, memory_budget="8G")
        assert "all experts resident" in model.streamer.residency
    model, _ = streamer.load(folder, memory_budget="8 GiB")
    for kwargs, message in [
        ({"memory_budget": "-1G"}, "memory_budget '-1G' is not a size"),
        ({"memory_budget": "lots"}, "memory_budget 'lots' is not a size"),
        ({"memory_budget": -5}, "memory_budget -5 is not a size"),
        ({"memory_budget": True}, "memory_budget must be a number of bytes"),
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
        ({"top_p": 0.0}, "top_p must be above 0 and at most 1"),
        ({"seed": -1}, "seed must be an integer from 0"),
        ({"top_k": -2}, "top_k must be an integer, 0"),
        ({"min_p": 2}, "min_p must be from 0"),
        ({"max_kv_size": 0}, "max_kv_size must be at least 1"),
    ]:
        with pytest.raises(StreamerError, match=message):
            streamer.generate(model, tokenizer, "hello", max_tokens=4, **kwargs)


def test_a_source_without_tokenizer_files_is_warned_about(checkpoints, tmp_path):
    src = copy_checkpoint(checkpoints.hf("qwen3_moe"), tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (src / name).unlink()
    messages = []
    repack(src, tmp_path / "out", log=messages.append)
    assert any("has no tokenizer files" in m for m in messages), messages
    with pytest.raises(StreamerError, match="has no tokenizer files .*copy them"):
        streamer.load(tmp_path / "out")  # transformers would make an empty one from config.json
