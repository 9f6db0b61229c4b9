#!/usr/bin/env python3
"""A seeded mutation fuzzer of the checkpoints streamer reads: `python tools/fuzz_checkpoints.py
--cases 200 --seed 1 --work /tmp/fuzz`.

It makes tiny checkpoints as the tests do (fixtures/: Hugging Face ones, bf16, FP8 with block
scales, gpt-oss's MXFP4; an MLX download; a repacked folder), then for each case copies one,
applies one or two mutations (tools/checkpoint_mutations.py) and runs the commands a user would,
each a process under a time limit: a download is repacked, planned and generated from (the
repacked copy, or an MLX download in place); a repacked folder is planned, verified and generated
from. Each command's outcome is one of: ok, error (exit 1 or 2 with streamer's one line), messy
(exit 1 or 2 without it), traceback, hang, crash (a signal or another status). A case's is its
worst command's, or worse: wrong (where the mutation changed nothing the model computes, a
refusal or another output; where it changed a repacked folder's bytes, another output from a
folder `streamer verify` passed), corrupt (a file of the checkpoint, or beside it, changed by a
command). Each case is one JSON line of --out; the counts are printed at the end. Case N of seed
S is the same mutation on every run (--case N replays one, keeping its folder).
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from tools.checkpoint_mutations import MUTATIONS  # noqa: E402

SEVERITY = ["ok", "error", "messy", "traceback", "hang", "crash", "wrong", "corrupt"]
PROMPT = ["--prompt", "hi", "--max-tokens", "2"]


def make_bases(folder: Path, names: list[str]) -> dict[str, Path]:
    """Each base checkpoint, made once in `folder`."""
    import contextlib
    import io

    import mlx_lm

    from fixtures import tiny_config, write_hf_checkpoint
    from streamer.repack import repack

    def mlx(path: Path) -> None:
        with contextlib.redirect_stdout(io.StringIO()):
            mlx_lm.convert(str(bases["hf"]), str(path), quantize=True)

    makers = {
        "hf": lambda p: write_hf_checkpoint(p, tiny_config("qwen3_moe")),
        "hf-fp8": lambda p: write_hf_checkpoint(p, tiny_config("deepseek_v3"), fp8=True),
        "hf-mxfp4": lambda p: write_hf_checkpoint(p, tiny_config("gpt_oss")),
        "mlx": mlx,
        "repacked": lambda p: repack(bases["hf"], p, log=lambda _: None),
    }
    bases: dict[str, Path] = {}
    for name in ["hf", *names]:
        path = bases[name] = folder / name
        if not path.exists():  # made aside, then renamed: a run stopped midway leaves no base
            shutil.rmtree(partial := path.with_name(name + ".partial"), ignore_errors=True)
            makers[name](partial)
            partial.rename(path)
    return {name: bases[name] for name in names}


def commands(base: str, src: Path, out: Path) -> list[tuple[str, list[str]]]:
    """The commands a user runs on `src`, a copy of base `base` (repack writes `out`)."""
    if base == "repacked":
        return [
            ("plan", ["plan", str(src), "--memory", "1G"]),
            ("verify", ["verify", str(src)]),
            ("generate", ["generate", "--model", str(src), "--memory-budget", "0", *PROMPT]),
        ]
    model = src if base == "mlx" else out
    return [
        ("repack", ["repack", str(src), str(out)]),
        ("plan", ["plan", str(src), "--memory", "1G"]),
        ("generate", ["generate", "--model", str(model), *PROMPT]),
    ]


def run(args: list[str], cache: Path, timeout: float) -> dict:
    """One command in its own process group, killed whole if it outlasts `timeout`."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "STREAMER_CACHE_DIR": str(cache)}
    with subprocess.Popen(
        [sys.executable, "-m", "streamer", *args],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    ) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            return {"outcome": "hang", "stdout": "", "stderr": stderr.decode()[-2000:]}
    text = stderr.decode(errors="replace")
    return {"outcome": outcome(process.returncode, text), "rc": process.returncode,
            "stdout": stdout.decode(errors="replace"), "stderr": text[-2000:]}  # fmt: skip


def outcome(rc: int, stderr: str) -> str:
    if rc == 0:
        return "ok"
    if "Traceback" in stderr:
        return "traceback"
    if rc in (1, 2):
        said = [line for line in stderr.splitlines() if line.startswith("streamer: error: ")]
        verified = stderr.rstrip().endswith("repack the model from its source.")  # verify's report
        return "error" if len(said) == 1 or verified else "messy"
    return "crash"


def snapshot(folder: Path) -> dict[str, str]:
    """Each file's sha256 (a link: where it points), never following a link."""
    found = {}
    for parent, folders, names in os.walk(folder):
        for path in (Path(parent, name) for name in folders + names):
            if path.is_symlink():
                found[str(path)] = "-> " + os.readlink(path)
            elif path.is_file():
                found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def run_case(base: str, src_base: Path, seed: int, case: int, work: Path, timeout: float,
             baseline: dict | None, only: tuple[str, ...] = ()) -> dict:  # fmt: skip
    """Case `case` of `seed`: one mutation of a copy of `src_base`, then the commands."""
    rng = random.Random(f"{seed}/{case}")
    applicable = [n for n, (_, _, on) in MUTATIONS.items() if on in ("all", kind_of(base))]
    shutil.rmtree(work, ignore_errors=True)
    src, out, cache = work / "src", work / "out", work / "cache"
    shutil.copytree(src_base, src, symlinks=True)
    names, done, kinds = [], [], []
    count = 1 if rng.random() < 0.7 else 2  # now and then two at once
    while len(done) < count:
        name = rng.choice(applicable)
        mutation, kind, _ = MUTATIONS[name]
        try:
            said = mutation(src, rng)
        except Exception:  # an earlier one's damage (a file no longer JSON, a config a list)
            said = None  # leaves nothing for this one to change
        if said is not None:
            names.append(name)
            done.append(said)
            kinds.append(kind)
    kind = kinds[0] if len(set(kinds)) == 1 else "any"
    before = snapshot(work)
    record = {"seed": seed, "case": case, "base": base, "mutation": names, "did": "; ".join(done)}
    for label, args in commands(base, src, out):
        if only and label not in only:
            continue
        if label == "generate" and base != "mlx" and not (out / "manifest.json").exists():
            args = [a if a != str(out) else str(src) for a in args]  # the download in place
        result = run(args, cache, timeout)
        changed = sorted(k for k, v in snapshot(work).items() if before.get(k) not in (None, v))
        changed += sorted(k for k in before if not os.path.lexists(k))
        if changed:
            result["outcome"], result["changed"] = "corrupt", changed[:5]
        record[label] = result
    record["outcome"] = worst(record, kind, baseline)
    return record


def kind_of(base: str) -> str:
    return "repacked" if base == "repacked" else "download"


def worst(record: dict, kind: str, baseline: dict | None) -> str:
    results = [v for v in record.values() if isinstance(v, dict)]
    found = max((r["outcome"] for r in results), key=SEVERITY.index)
    generated = record.get("generate", {})
    refused = kind == "same" and found in ("error", "messy")  # a valid checkpoint refused
    if baseline and generated.get("outcome") == "ok":
        differs = generated["stdout"] != baseline["generate"]["stdout"]
        checked = kind == "checked" and record.get("verify", {}).get("outcome") == "ok"
        refused |= differs and (kind == "same" or checked)
    return max(found, "wrong", key=SEVERITY.index) if refused else found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--case", type=int, help="replay this one case (its folder is kept)")
    parser.add_argument("--bases", default="hf,hf-fp8,hf-mxfp4,mlx,repacked")
    parser.add_argument("--work", type=Path, default=Path("/tmp/fuzz-checkpoints"))
    parser.add_argument("--out", type=Path, help="JSON lines, one per case (default: WORK/cases)")
    parser.add_argument("--timeout", type=float, default=90.0, help="seconds a command may take")
    args = parser.parse_args()
    names = args.bases.split(",")
    bases = make_bases(args.work / "bases", names)
    baselines = {
        n: run_case_clean(n, p, args.work / "case", args.timeout) for n, p in bases.items()
    }
    counts: collections.Counter[str] = collections.Counter()
    cases = [args.case] if args.case is not None else range(args.cases)
    with open(args.out or args.work / "cases", "a") as log:
        for case in cases:
            base = names[case % len(names)]
            work = args.work / "case"
            record = run_case(
                base, bases[base], args.seed, case, work, args.timeout, baselines[base]
            )
            counts[record["outcome"]] += 1
            log.write(json.dumps(record) + "\n")
            log.flush()
            print(f"{case} {base} {record['outcome']}: {record['did']}", flush=True)
    print(json.dumps({k: counts[k] for k in SEVERITY if counts[k]}))
    return 0


def run_case_clean(base: str, path: Path, work: Path, timeout: float) -> dict:
    """The commands on the unmutated base: what a run that changed nothing prints."""
    shutil.rmtree(work, ignore_errors=True)
    results = {
        label: run(a, work / "cache", timeout) for label, a in commands(base, path, work / "out")
    }
    bad = {k: v["stderr"][-300:] for k, v in results.items() if v["outcome"] != "ok"}
    if bad:
        raise SystemExit(f"base {base} fails unmutated: {bad}")
    return results


if __name__ == "__main__":
    sys.exit(main())
