"""The mutations tools/fuzz_checkpoints.py applies to a copy of a tiny checkpoint: each takes the
folder and a seeded random.Random, changes the folder (or a file beside it: `outside`), and says
what it did in one line, or returns None where it does not apply (no such file).

A mutation's `kind` says what a run may show: "any" (the model may change: a weight's bytes, a
config value), "same" (nothing the model computes changed: every command must succeed, with the
baseline's output), "checked" (a repacked folder's bytes changed under its checksums: `streamer
verify` must not pass while the output differs).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

HOSTILE_VALUES = [
    "4", "", "x" * 300, 4.5, 1e308, float("nan"), float("-inf"), None, True, False, [], [1, 2],
    {}, {"a": 1}, -1, 0, 1 << 31, 1 << 63, 1 << 64, 10**30, -(1 << 63),
]  # fmt: skip
HOSTILE_NAMES = [
    "missing.safetensors", "tokenizer.json", "../outside.safetensors", "/etc/passwd", "", ".",
    "experts", "sub/../model-00001-of-00002.safetensors", "/dev/zero", "a\x00b", 7, None,
]  # fmt: skip


def outside(folder: Path) -> Path:
    """A file beside the checkpoint's folder, where a link or `../` out of it leads."""
    return folder.parent / "outside.safetensors"


def files(folder: Path, suffix: str) -> list[Path]:
    return sorted(p for p in folder.rglob(f"*{suffix}") if p.is_file() and not p.is_symlink())


def pick_file(folder: Path, rng: random.Random, suffix: str = "") -> Path | None:
    found = files(folder, suffix)
    return rng.choice(found) if found else None


def header_end(path: Path) -> int:
    with open(path, "rb") as f:
        return 8 + struct.unpack("<Q", f.read(8))[0]


# -- bytes -----------------------------------------------------------------------------------------


def truncate(folder: Path, rng: random.Random) -> str | None:
    path = pick_file(folder, rng)
    size = path.stat().st_size
    at = rng.choice([0, 1, 7, 8, rng.randrange(size), max(size - 1, 0)])
    os.truncate(path, at)
    return f"{path.name} truncated to {at} of {size} bytes"


def remove(folder: Path, rng: random.Random) -> str:
    """A file, or a subfolder, gone."""
    path = rng.choice(sorted(folder.rglob("*")))
    shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    return f"{path.relative_to(folder)} removed"


def flip_bytes(folder: Path, rng: random.Random, suffix: str = "", in_header: bool = True):
    path = pick_file(folder, rng, suffix)
    if path is None:
        return None
    size = path.stat().st_size
    start, end = 0, size
    if path.suffix == ".safetensors":
        start, end = (0, header_end(path)) if in_header else (header_end(path), size)
    if end <= start:
        return None
    data = bytearray(path.read_bytes())
    offsets = sorted({rng.randrange(start, end) for _ in range(rng.randint(1, 4))})
    for at in offsets:
        data[at] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))
    return f"{path.name}: bits flipped at {offsets}"


def header_length(folder: Path, rng: random.Random) -> str | None:
    path = pick_file(folder, rng, ".safetensors")
    if path is None:
        return None
    size = path.stat().st_size
    length = rng.choice([0, 1, size, size - 7, (1 << 64) - 1, 1 << 63, header_end(path) - 9])
    with open(path, "r+b") as f:
        f.write(struct.pack("<Q", length % (1 << 64)))
    return f"{path.name}: header length {length}"


# -- safetensors headers ---------------------------------------------------------------------------


def read_st(path: Path) -> tuple[dict, bytes]:
    end = header_end(path)
    raw = path.read_bytes()
    return json.loads(raw[8:end]), raw[end:]


def write_st(path: Path, header: dict | bytes, data: bytes) -> None:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def edit_entry(folder: Path, rng: random.Random) -> str | None:
    """One tensor's dtype, shape or data_offsets made hostile, or a tensor added or dropped."""
    path = pick_file(folder, rng, ".safetensors")
    if path is None:
        return None
    header, data = read_st(path)
    names = [n for n in header if n != "__metadata__"]
    name, other = rng.choice(names), rng.choice(names)
    entry = header[name]
    start, end = entry["data_offsets"]
    choices: dict[str, Callable[[], object]] = {
        "dtype": lambda: rng.choice(["Q9", "F32", "F16", "U8", "I64", "bf16", 3, None, "F64"]),
        "shape": lambda: rng.choice(
            [
                [0],
                [-1, *entry["shape"][1:]],
                [1 << 32, 1 << 32],
                [1 << 62, 4],
                [],
                ["2"],
                [2.0],
                [True],
                entry["shape"][::-1],
                [*entry["shape"], 1],
                [(end - start) // 2],
            ]
        ),  # fmt: skip
        "data_offsets": lambda: rng.choice(
            [
                [end, start],
                [start, end + 8],
                [start - 2, end - 2],
                [0, end - start],
                header[other]["data_offsets"],
                [start, len(data) + 1],
                [-8, end],
                [start, 1 << 62],
                [start],
                [float(start), end],
                [str(start), end],
                None,
            ]
        ),  # fmt: skip
    }
    what = rng.choice([*choices, "drop", "add", "rename"])
    if what == "drop":
        del header[name]
    elif what == "add":
        header["model.extra.weight"] = dict(entry)
    elif what == "rename":
        header[name + ".x"] = header.pop(name)
    else:
        entry[what] = choices[what]()
    write_st(path, header, data)
    return f"{path.name}: {name} {what} -> {header.get(name, {}).get(what, '')}"


def duplicate_name(folder: Path, rng: random.Random) -> str | None:
    path = pick_file(folder, rng, ".safetensors")
    if path is None:
        return None
    header, data = read_st(path)
    name = rng.choice([n for n in header if n != "__metadata__"])
    raw = json.dumps(header)
    entry = json.dumps({name: header[name]})[1:-1]
    write_st(path, (raw[:-1] + ", " + entry + "}").encode(), data)
    return f"{path.name}: {name} named twice"


def respell_header(folder: Path, rng: random.Random) -> str | None:
    """The same header spelled otherwise, as the format allows: keys in another order, spaces
    inside, trailing spaces padding it (writers align the data to 8 bytes so)."""
    path = pick_file(folder, rng, ".safetensors")
    if path is None:
        return None
    header, data = read_st(path)
    items = list(header.items())
    rng.shuffle(items)
    raw = json.dumps(dict(items), indent=rng.choice([None, 1])).encode()
    write_st(path, raw + b" " * rng.choice([1, 7, 8 - len(raw) % 8, 4096]), data)
    return f"{path.name}: header respelled"


def respell_json(folder: Path, rng: random.Random) -> str | None:
    """A JSON file spelled otherwise: keys sorted, indented, ASCII escapes."""
    path = pick_json(folder, rng)
    if path is None:
        return None
    doc = json.loads(path.read_text())
    path.write_text(
        json.dumps(doc, sort_keys=True, indent=rng.choice([None, 4]), ensure_ascii=True)
    )
    return f"{path.name} respelled"


def hostile_json_bytes(rng: random.Random) -> tuple[str, bytes]:
    return rng.choice(
        [
            ("non-UTF-8", b'{"a\xff\xfe": 1}'),
            ("deeply nested", b"[" * 200_000 + b"]" * 200_000),
            ("deeply nested object", b'{"a":' * 50_000 + b"1" + b"}" * 50_000),
            ("huge", b'{"pad": "' + b"x" * (20 << 20) + b'"}'),
            ("a list", b"[1, 2]"),
            ("empty", b""),
            ("NaN", b"NaN"),
            ("a long integer", b'{"a": ' + b"9" * 5000 + b"}"),
            ("BOM", b'\xef\xbb\xbf{"a": 1}'),
            ("UTF-16", '{"a": 1}'.encode("utf-16")),
        ]
    )


def hostile_header(folder: Path, rng: random.Random) -> str | None:
    path = pick_file(folder, rng, ".safetensors")
    if path is None:
        return None
    _, data = read_st(path)
    what, raw = hostile_json_bytes(rng)
    write_st(path, raw, data)
    return f"{path.name}: header {what}"


# -- JSON files ------------------------------------------------------------------------------------

JSON_FILES = [
    "config.json", "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json",
    "generation_config.json", "hf_quant_config.json", "manifest.json",
]  # fmt: skip


def json_paths(value, prefix=()):
    yield prefix
    if isinstance(value, (dict, list)):
        for key, child in value.items() if isinstance(value, dict) else enumerate(value):
            yield from json_paths(child, (*prefix, key))


def pick_json(folder: Path, rng: random.Random) -> Path | None:
    present = [folder / n for n in JSON_FILES if (folder / n).is_file()]
    return rng.choice(present) if present else None


def edit_json_value(folder: Path, rng: random.Random) -> str | None:
    """A value replaced or deleted: a top-level one more often than not (config fields), else
    mostly one named by a field's name (an offset, a shape), not by a tensor's (a checksum)."""
    path = pick_json(folder, rng)
    if path is None:
        return None
    doc = json.loads(path.read_text())
    paths = [p for p in json_paths(doc) if p]
    fields = [p for p in paths if not isinstance(p[-1], str) or "." not in p[-1]]
    top = [p for p in paths if len(p) == 1]
    key = rng.choice(top if rng.random() < 0.5 else fields if rng.random() < 0.8 else paths)
    parent = doc
    for part in key[:-1]:
        parent = parent[part]
    if isinstance(parent, dict) and rng.random() < 0.2:
        del parent[key[-1]]
        value = "deleted"
    else:
        parent[key[-1]] = value = rng.choice(HOSTILE_VALUES)
    path.write_text(json.dumps(doc))
    return f"{path.name}: {'/'.join(map(str, key))} = {str(value)[:40]}"


def hostile_json_file(folder: Path, rng: random.Random) -> str | None:
    path = pick_json(folder, rng)
    if path is None:
        return None
    what, raw = hostile_json_bytes(rng)
    path.write_bytes(raw)
    return f"{path.name} {what}"


def perturb_config(folder: Path, rng: random.Random) -> str | None:
    """A number or flag of the model's config (config.json's, else the manifest's) moved a little:
    off by one, doubled, halved, zero, negated; a flag flipped. Values a type check passes."""
    path = folder / "config.json"
    doc = json.loads(path.read_text())
    if (folder / "manifest.json").is_file() and rng.random() < 0.5:
        path = folder / "manifest.json"
        doc = json.loads(path.read_text())
    config = doc["config"] if path.name == "manifest.json" else doc
    numbers = [
        (parent, key)
        for parent in (config, config.get("text_config"), config.get("quantization"))
        if isinstance(parent, dict)
        for key, value in parent.items()
        if isinstance(value, (int, float))
    ]
    parent, key = rng.choice(numbers)
    value = parent[key]
    parent[key] = (
        not value
        if isinstance(value, bool)
        else rng.choice([value + 1, value - 1, value * 2, value // 2, 0, -value, value * 1000])
    )
    path.write_text(json.dumps(doc))
    return f"{path.name}: {key} {value} -> {parent[key]}"


def add_generation_config(folder: Path, rng: random.Random) -> str:
    key = rng.choice(["eos_token_id", "max_new_tokens", "temperature", "bos_token_id", "top_k"])
    value = rng.choice(HOSTILE_VALUES)
    (folder / "generation_config.json").write_text(json.dumps({key: value}))
    return f"generation_config.json: {key} = {str(value)[:40]}"


def add_quantization(folder: Path, rng: random.Random) -> str:
    """quantization_config in config.json, or hf_quant_config.json, with hostile values."""
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    method = rng.choice(["fp8", "mxfp4", "modelopt", "compressed-tensors", "bitsandbytes", 4])
    key = rng.choice(["weight_block_size", "group_size", "bits", "quantization", "fmt"])
    quant = {"quant_method": method, key: rng.choice([*HOSTILE_VALUES, [0, 128], [128], [-1, -1]])}
    if rng.random() < 0.5:
        (folder / "hf_quant_config.json").write_text(json.dumps(quant))
        return f"hf_quant_config.json: {str(quant)[:80]}"
    config["quantization_config" if rng.random() < 0.7 else "quantization"] = quant
    config_path.write_text(json.dumps(config))
    return f"config.json quantization: {str(quant)[:80]}"


# -- the index, links ------------------------------------------------------------------------------


def index_entry(folder: Path, rng: random.Random) -> str | None:
    path = folder / "model.safetensors.index.json"
    if not path.is_file():
        return None
    index = json.loads(path.read_text())
    name = rng.choice(sorted(index["weight_map"]))
    target = rng.choice(HOSTILE_NAMES)
    if target == "../outside.safetensors":
        shard = folder / index["weight_map"][name]
        outside(folder).write_bytes(shard.read_bytes())
    index["weight_map"][name] = target
    path.write_text(json.dumps(index))
    return f"index: {name} -> {target!r}"


def link_out(folder: Path, rng: random.Random, copy: bool = False) -> str | None:
    """A file replaced by a symbolic link: to a copy outside the folder (`copy`: nothing changes),
    or to a device, to nothing, to itself, to a folder."""
    path = pick_file(folder, rng)
    target = "copy" if copy else rng.choice(["/dev/zero", "/dev/null", "missing", "self", "/"])
    if target == "copy":
        outside(folder).write_bytes(path.read_bytes())
        target = str(outside(folder))
    elif target == "missing":
        target = str(folder / "no-such-file")
    elif target == "self":
        target = str(path)
    path.unlink()
    path.symlink_to(target)
    return f"{path.relative_to(folder)} -> link to {target}"


# -- a repacked folder -----------------------------------------------------------------------------


def swap_expert_files(folder: Path, rng: random.Random) -> str | None:
    """Two layers' expert files swapped (same size), times kept or not."""
    found = files(folder / "experts", ".bin") if (folder / "experts").is_dir() else []
    if len(found) < 2:
        return None
    a, b = rng.sample(found, 2)
    times = a.stat(), b.stat()
    data_a, data_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(data_b)
    b.write_bytes(data_a)
    keep = rng.random() < 0.5
    if keep:
        for path, st in zip((a, b), times):
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    return f"{a.name} and {b.name} swapped" + (", times kept" if keep else "")


def flip_kept_time(folder: Path, rng: random.Random) -> str | None:
    """Bit rot in a repacked data file: its size and time as recorded."""
    path = pick_file(folder, rng, ".bin") or pick_file(folder, rng, ".safetensors")
    st = path.stat()
    data = bytearray(path.read_bytes())
    at = rng.randrange(header_end(path) if path.suffix == ".safetensors" else 0, len(data))
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    return f"{path.relative_to(folder)}: byte {at} flipped, time kept"


# name -> (mutation, kind, the bases it applies to)
MUTATIONS: dict[str, tuple[Callable[[Path, random.Random], str | None], str, str]] = {
    "truncate": (truncate, "any", "all"),
    "remove": (remove, "any", "all"),
    "flip_header": (lambda f, r: flip_bytes(f, r, ".safetensors"), "any", "all"),
    "flip_data": (lambda f, r: flip_bytes(f, r, ".safetensors", False), "any", "download"),
    "flip_json": (lambda f, r: flip_bytes(f, r, ".json"), "any", "all"),
    "header_length": (header_length, "any", "all"),
    "edit_entry": (edit_entry, "any", "all"),
    "duplicate_name": (duplicate_name, "any", "all"),
    "hostile_header": (hostile_header, "any", "all"),
    "respell_header": (respell_header, "same", "download"),
    "respell_json": (respell_json, "same", "all"),
    "edit_json_value": (edit_json_value, "any", "all"),
    "hostile_json_file": (hostile_json_file, "any", "all"),
    "perturb_config": (perturb_config, "any", "all"),
    "generation_config": (add_generation_config, "any", "all"),
    "quantization": (add_quantization, "any", "download"),
    "index_entry": (index_entry, "any", "download"),
    "link_copy": (lambda f, r: link_out(f, r, copy=True), "same", "all"),
    "link_out": (link_out, "any", "all"),
    "swap_expert_files": (swap_expert_files, "checked", "repacked"),
    "flip_kept_time": (flip_kept_time, "checked", "repacked"),
}
