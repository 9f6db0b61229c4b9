"""Bad input gets a clear error naming the file and what to do, and nothing is written.

Wrong config.json values are tests/test_bad_config_values.py's; wrong arguments to the Python API
tests/test_api_arguments.py's."""

from __future__ import annotations

import contextlib
import io
import json
import shutil

import mlx_lm
import pytest
from bad_checkpoints import assert_refused, copy_checkpoint
from conftest import private_download
from hostile_files import edited_copy, rewrite_tensor

import streamer
from fixtures import tiny_config, write_hf_checkpoint
from streamer.cli import main
from streamer.errors import StreamerError
from streamer.repack import repack


def test_missing_config(checkpoints, tmp_path):
    src = copy_checkpoint(checkpoints.hf("qwen3_moe"), tmp_path)
    (src / "config.json").unlink()
    assert_refused(src, tmp_path, "config.json is missing")


def test_unknown_and_non_moe_model_types(checkpoints, tmp_path):
    src = copy_checkpoint(checkpoints.hf("qwen3_moe"), tmp_path)
    closest = "The closest model type that streams is"
    dense = "is a dense model, not a MoE model"
    reasons = {  # a dense model is told so, with no other name; a misspelling is named
        "llama": [dense, "mlx_lm.models.llama model has no MoE layers", "mlx_lm.generate"],
        "qwen3": [dense, "mlx_lm.models.qwen3 model has no MoE layers", "mlx-lm runs dense"],
        "qwen3_mo": ["not a model that mlx-lm", f"runs. {closest} 'qwen3_moe'; docs/support.md"],
        "not_a_model": ["not a model that mlx-lm", "runs. docs/support.md lists"],  # none near
    }
    for model_type, reason in reasons.items():
        config = json.loads((src / "config.json").read_text())
        (src / "config.json").write_text(json.dumps({**config, "model_type": model_type}))
        message = assert_refused(src, tmp_path, f"'{model_type}'", *reason)
        assert dense not in message or closest not in message, message


@pytest.mark.parametrize("quantized", [False, True])
def test_a_dense_download_is_told_it_is_dense_not_to_repack(
    checkpoints, tmp_path, capsys, quantized
):
    """A dense bf16 download was told to repack with --quantize 4, which then refused it."""
    src = copy_checkpoint(checkpoints.hf("qwen3_moe"), tmp_path)
    config = json.loads((src / "config.json").read_text())
    if quantized:  # an MLX download of a dense model streams in place no better
        config["quantization"] = {"group_size": 64, "bits": 4}
    (src / "config.json").write_text(json.dumps({**config, "model_type": "qwen3"}))
    with pytest.raises(StreamerError, match="'qwen3' is a dense model, not a MoE model") as e:
        streamer.load(src)
    assert "--quantize" not in str(e.value) and "closest" not in str(e.value)
    assert main(["generate", "--model", str(src), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert "'qwen3' is a dense model" in err and "--quantize" not in err, err


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


def test_index_placing_tensors_in_a_shard_it_does_not_name(checkpoints, tmp_path):
    """An index of another download (its last shard's tensors placed in the first) blamed the
    first shard ("the shard is incomplete; download it again"), whole as it was; it names the
    shard holding the tensor, and the index is the file to replace or delete: without it the
    shards are read as mlx-lm reads them (every model*.safetensors)."""
    src = copy_checkpoint(checkpoints.hf("qwen3_moe"), tmp_path)
    index_file = src / "model.safetensors.index.json"
    index = json.loads(index_file.read_text())
    first, *_, last = sorted(set(index["weight_map"].values()))
    moved = [n for n, shard in index["weight_map"].items() if shard == last]
    index["weight_map"].update(dict.fromkeys(moved, first))
    index_file.write_text(json.dumps(index))
    assert_refused(
        src,
        tmp_path,
        f"index.json places tensor '{moved[0]}' in {first}, but {last} holds it",
        "delete model.safetensors.index.json",
    )
    index_file.unlink()
    repack(src, tmp_path / "out", log=lambda _: None)


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


@pytest.mark.parametrize("rows", [1, 32])
def test_one_expert_of_another_shape(checkpoints, tmp_path, rows):
    """mlx-lm's sanitize stacks the experts: MLX's ValueError reached the user (a traceback)."""
    src = copy_checkpoint(checkpoints.hf("qwen3_moe"), tmp_path)
    name = "model.layers.1.mlp.experts.5.up_proj.weight"
    rewrite_tensor(src, name, lambda t: t[:rows])
    assert_refused(src, tmp_path, f"tensor '{name}' has shape ({rows}, 128)", "(64, 128)")


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


def test_resume_into_a_destination_that_is_not_a_repacked_model(checkpoints, tmp_path):
    """`--resume` into an existing folder or file of the user's, with no partial folder: it said
    "[repack] DST is complete: nothing to resume", then failed to load it as a model."""
    src = checkpoints.hf("qwen3_moe")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    (tmp_path / "file").write_text("a file")
    for dst in (mine, tmp_path / "file"):
        logs = []
        with pytest.raises(StreamerError, match="already exists: choose another destination"):
            repack(src, dst, resume=True, log=logs.append)
        assert not any("complete" in line for line in logs), logs
    assert (mine / "notes.txt").read_text() == "keep me"


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


def test_a_repacked_folder_given_to_repack_is_told_it_streams_as_it_is(checkpoints, tmp_path):
    """It said "DIR holds no model*.safetensors files: nothing to repack"."""
    repacked = checkpoints.repacked(checkpoints.hf("qwen3_moe"))
    assert_refused(repacked, tmp_path, f"{repacked} is repacked already", f"--model {repacked}")


def test_already_quantized_checkpoint_with_quantize(checkpoints, tmp_path):
    from streamer.repack import Quantize

    assert_refused(
        checkpoints.mlx("qwen3_moe"), tmp_path, "already quantized", quantize=Quantize(4)
    )


def test_a_group_size_mlx_does_not_quantize_with(checkpoints, tmp_path, capsys):
    """`--quantize 4 --group-size 16` (affine) was MLX's ValueError traceback mid-repack."""
    src = checkpoints.hf("qwen3_moe")
    assert (
        main(["repack", str(src), str(tmp_path / "out"), "--quantize", "4", "--group-size", "16"])
        == 2
    )
    err = capsys.readouterr().err
    assert "--group-size 16 --q-mode affine: MLX does not quantize so" in err, err
    assert "Traceback" not in err and not list(tmp_path.iterdir())


def test_a_group_size_the_model_s_own_recipe_cannot_quantize(tmp_path, capsys):
    """Width 96 at --group-size 32: qwen3_moe's own recipe quantizes its router in groups of 64,
    which 96 is not made of; mlx_lm.convert fails with MLX's ValueError, and so did repack (a
    traceback)."""
    config = tiny_config("qwen3_moe", hidden_size=96, num_experts=4, num_hidden_layers=1)
    src = write_hf_checkpoint(tmp_path / "src", config)
    with pytest.raises(ValueError, match="divisible by the quantization group size 64"):
        with contextlib.redirect_stdout(io.StringIO()):
            mlx_lm.convert(str(src), str(tmp_path / "mlx"), quantize=True, q_group_size=32)
    out = tmp_path / "out"
    assert main(["repack", str(src), str(out), "--quantize", "4", "--group-size", "32"]) == 2
    err = capsys.readouterr().err
    assert "--group-size 32 --q-mode affine: mlx-lm cannot quantize this model so" in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and not out.exists()


def test_manifest_of_a_newer_format_version(checkpoints, tmp_path):
    folder = edited_copy(
        checkpoints.repacked(checkpoints.hf("qwen3_moe")),
        tmp_path / "model",
        lambda m: m.update(format_version=99),
    )
    with pytest.raises(StreamerError, match="format version 99.*upgrade streamer"):
        streamer.load(folder)


def test_loading_a_download_that_is_not_mlx_quantized(checkpoints):
    src = checkpoints.hf("qwen3_moe")  # bf16: only MLX-quantized downloads stream in place
    with pytest.raises(StreamerError, match="not MLX-quantized.*streamer repack .* --quantize 4"):
        streamer.load(src)


def test_resident_weights_the_model_does_not_take_are_refused_in_one_line(checkpoints, tmp_path):
    """A download whose config.json keeps a layer unquantized (`false`, as mlx-lm's loader reads
    it) while its shards hold that layer quantized: MLX's message, one line per tensor, came
    through as it was."""
    src = tmp_path / "download"
    shutil.copytree(checkpoints.mlx("qwen3_moe"), src)
    config = json.loads((src / "config.json").read_text())
    for key in ("quantization", "quantization_config"):
        config[key]["model.layers.0.mlp.gate"] = False
    (src / "config.json").write_text(json.dumps(config))
    with pytest.raises(StreamerError) as refused:
        streamer.load(src, memory_budget=0)
    assert "not match the model" in str(refused.value) and "model.layers.0.mlp.gate" in str(
        refused.value
    )
    assert "\n" not in str(refused.value)


def test_truncated_expert_file(checkpoints, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(checkpoints.repacked(checkpoints.hf("mixtral")), folder)
    expert_file = folder / "experts" / "001.bin"
    expert_file.write_bytes(expert_file.read_bytes()[:-4096])
    with pytest.raises(StreamerError, match="001.bin.*truncated"):
        streamer.load(folder)


def test_a_source_without_tokenizer_files_is_warned_about(checkpoints, tmp_path):
    src = copy_checkpoint(checkpoints.hf("qwen3_moe"), tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (src / name).unlink()
    messages = []
    repack(src, tmp_path / "out", log=messages.append)
    assert any("has no tokenizer files" in m for m in messages), messages
    with pytest.raises(StreamerError, match="has no tokenizer files .*copy them"):
        streamer.load(tmp_path / "out")  # transformers would make an empty one from config.json


def test_generation_config_that_is_not_an_object(checkpoints, tmp_path, monkeypatch):
    """mlx-lm reads its eos ids with .get: an AttributeError reached the user (a traceback)."""
    folder = private_download(checkpoints.mlx("qwen3_moe"), tmp_path, monkeypatch)
    (folder / "generation_config.json").write_text("[1, 2]")
    with pytest.raises(StreamerError, match="generation_config.json is not a JSON object"):
        streamer.load(folder)


def test_a_gguf_file_or_folder_is_told_streamer_reads_safetensors(tmp_path, capsys):
    """llama.cpp's, Ollama's and LM Studio's users pass a .gguf file or its folder: it was "a file,
    not a model's folder", "a folder without a model", plan's "is not valid JSON" and repack's
    "config.json is missing"."""
    folder = tmp_path / "lmstudio"
    folder.mkdir()
    gguf = folder / "Qwen3-30B-A3B-Q4_K_M.gguf"
    gguf.write_bytes(b"GGUF\x03\x00\x00\x00")
    for model in (gguf, folder):
        for argv in (
            ["generate", "--model", str(model), "--prompt", "hi"],
            ["info", str(model)],
            ["plan", str(model)],
            ["repack", str(model), str(tmp_path / "out")],
        ):
            assert main(argv) == 2, argv
            err = capsys.readouterr().err
            assert "GGUF (llama.cpp's format" in err and "safetensors" in err, (argv, err)
            assert len(err.splitlines()) == 1, err
