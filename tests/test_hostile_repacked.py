"""A repacked folder tampered with: a manifest edited by hand, special files where its files
belong; load and verify refuse each, naming the file."""

from __future__ import annotations

import json
import shutil

import pytest
from hostile_files import edited_copy, make_special, refused_without_hanging

import streamer
from streamer.errors import StreamerError
from streamer.verify import verify


@pytest.fixture(scope="module")
def model_folder(checkpoints):
    return checkpoints.repacked(checkpoints.mlx("qwen3_moe"))


def set_first_offset(value):
    return lambda m: m["moe_layers"][0]["experts"][0].update(offset=value)


def set_tensor(**fields):
    return lambda m: m["moe_layers"][1]["tensors"][0].update(fields)


@pytest.mark.parametrize(
    "change, message",
    [
        (set_first_offset(100), "not stored in expert order"),
        (set_first_offset(1 << 40), "not stored in expert order"),
        (lambda m: m.update(format_version="1"), "format version '1'"),
        (lambda m: m.update(format_version=0), "format version 0"),
        (lambda m: m["moe_layers"][0].update(file="../../etc/passwd"), "points outside the folder"),
        (lambda m: m["moe_layers"][0].update(record_bytes=4096), "not page-aligned"),
        (
            lambda m: m["moe_layers"][0]["quantization"].update(gate_proj={"bits": "4"}),
            "malformed|invalid quantization",
        ),
        (set_tensor(offset=64), "overlap"),
        (set_tensor(nbytes=12), "size does not match its shape"),
        # a consistent edit (shape and size agree) that does not fit the model
        (
            set_tensor(shape=[32, 16], nbytes=2048),
            r"tensor gate_proj.weight is 16 x \[32, 16\] U32 but the model expects",
        ),
        (lambda m: m["moe_layers"][0]["experts"][0].update(crc32=[1, 2]), "valid crc32"),
        (lambda m: m["files"]["experts/000.bin"].update(size="big"), "record of file"),
        (
            lambda m: m["config"].update(num_experts=8),
            "experts a layer, manifest.json.s config 8",
        ),
        (lambda m: m.update(moe_layers=m["moe_layers"][:1]), "lists MoE layers"),
        (lambda m: m.update(moe_layers=[]), "moe_layers lists no MoE layer"),
        # both layers computed with layer 0's experts, without a word (sizes and times match)
        (
            lambda m: m["moe_layers"][1].update(file=m["moe_layers"][0]["file"]),
            "MoE layers 0 and 1 both name experts/000.bin",
        ),
    ],
)
def test_hand_edited_manifest(model_folder, tmp_path, change, message):
    folder = edited_copy(model_folder, tmp_path / "model", change)
    with pytest.raises(StreamerError, match=message) as err:
        streamer.load(folder)
    assert "manifest.json" in str(err.value) and "repack" in str(err.value)


@pytest.mark.parametrize("layers", [[], {}])
def test_a_manifest_without_moe_layers_is_refused_by_plan_and_verify(
    model_folder, tmp_path, capsys, layers
):
    """plan ended in a traceback (max() of no layers), verify said every checksum matches."""
    from streamer.cli import main

    folder = edited_copy(model_folder, tmp_path / "model", lambda m: m.update(moe_layers=layers))
    for command in (
        ["plan", str(folder), "--memory", "16G"],
        ["verify", str(folder)],
        ["info", str(folder)],
    ):
        assert main(command) == 2
        assert "manifest.json: moe_layers lists no MoE layer; repack" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["fifo", "dir"])
@pytest.mark.parametrize(
    "name", ["manifest.json", "resident.safetensors", "experts/001.bin", "tokenizer.json"]
)
def test_special_file_in_a_repacked_folder(model_folder, tmp_path, name, kind):
    folder = tmp_path / "model"
    shutil.copytree(model_folder, folder)
    make_special(folder / name, kind)
    if kind == "dir" and name == "tokenizer.json":
        refused_without_hanging(lambda: streamer.load(folder), "tokenizer")
        return
    refused_without_hanging(lambda: streamer.load(folder), name)
    if name == "manifest.json":
        refused_without_hanging(lambda: verify(folder, log=lambda _: None), name)
    elif name != "tokenizer.json":
        problems = verify(folder, log=lambda _: None)
        assert any(p.file == name for p in problems), problems


def test_a_recorded_file_the_folder_lacks(model_folder, tmp_path):
    """A "files" entry for a file that is not there was a FileNotFoundError traceback at load."""
    record = {"experts/999.bin": {"size": 1, "mtime_ns": 1}}
    folder = edited_copy(model_folder, tmp_path / "model", lambda m: m["files"].update(record))
    with pytest.raises(StreamerError, match=r"999.bin, recorded in manifest.json, cannot be read"):
        streamer.load(folder)


@pytest.mark.parametrize("token_id", [600, 100_000])
def test_a_tokenizer_with_ids_past_the_models_vocabulary(model_folder, tmp_path, token_id):
    """tokenizer.json giving a token an id past the model's 512 (another model's tokenizer, or
    one edited): a prompt holding it read the embedding out of bounds, silently other text at
    600 and a segmentation fault at 100000."""
    folder = tmp_path / "model"
    shutil.copytree(model_folder, folder)
    path = folder / "tokenizer.json"
    tokenizer = json.loads(path.read_text())
    tokenizer["model"]["vocab"]["hi"] = token_id
    path.write_text(json.dumps(tokenizer))
    with pytest.raises(
        StreamerError, match=f"gives 'hi' the id {token_id}, but the model embeds 512 tokens"
    ):
        streamer.load(folder)


@pytest.mark.parametrize(
    "name, missing", [("experts/001.bin", "experts/001.bin"), ("experts", "experts/000.bin")]
)
@pytest.mark.parametrize("link", [False, True])
def test_plan_of_a_repacked_folder_missing_a_file(
    model_folder, tmp_path, capsys, name, missing, link
):
    """An expert file, or the experts/ folder, a broken link or gone: plan's sizes of the files
    were a FileNotFoundError traceback (one file) or 0 B of experts and a plan that runs (the
    folder)."""
    from streamer.cli import main

    folder = tmp_path / "model"
    shutil.copytree(model_folder, folder)
    path = folder / name
    shutil.rmtree(path) if path.is_dir() else path.unlink()
    if link:
        path.symlink_to(folder / "gone")
    assert main(["plan", str(folder), "--memory", "16G"]) == 2
    assert f"{folder / missing} is missing" in capsys.readouterr().err


def test_plan_of_a_repacked_folder_missing_its_resident_file(model_folder, tmp_path, capsys):
    """The resident file gone: plan's size of it was a FileNotFoundError traceback."""
    from streamer.cli import main

    folder = tmp_path / "model"
    shutil.copytree(model_folder, folder)
    (folder / "resident.safetensors").unlink()
    assert main(["plan", str(folder), "--memory", "16G"]) == 2
    assert f"{folder / 'resident.safetensors'} is missing" in capsys.readouterr().err
