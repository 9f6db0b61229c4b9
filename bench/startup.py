"""Start-up time of the command line: how long each command takes to run from a fresh process.

    python bench/startup.py [--repeats 5] [--model DIR]

`--help`, `--version`, `info` and `plan` of a repacked folder should not import mlx-lm, nor
`plan` of a config.json, a download (with --quantize too) or an MLX-quantized download import
transformers (it builds mlx-lm's model from its model files alone:
streamer/families/mlx_lm_models.py; each saved layer's quantization from its shapes:
streamer/families/saved_quantization.py; --quantize as mlx_lm.convert's rule:
streamer/families/architectures.py), nor `generate` of a
missing model (refused before its tokenizer is built). Prints the median wall time of each
command in seconds.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from demo import add_model_option, model_or_demo

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def seconds(command: list[str], repeats: int, status: int = 0) -> float:
    """The median wall time of `streamer COMMAND`, which must exit with `status`."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "streamer", *command], capture_output=True, text=True, cwd=REPO
        )
        times.append(time.perf_counter() - start)
        if done.returncode != status:
            raise SystemExit(f"streamer {' '.join(command)}: exit {done.returncode}\n{done.stderr}")
    return statistics.median(times)


def mlx_download(tmp: Path) -> str:
    """The demo model as `mlx_lm.convert --quantize` writes it (4 bits): an MLX-quantized
    download."""
    import contextlib
    import io

    from mlx_lm import convert

    from streamer.cli import DEMO_MODEL

    folder = tmp / "demo-mlx"
    with contextlib.redirect_stdout(io.StringIO()):  # its progress lines
        convert(str(DEMO_MODEL), str(folder), quantize=True)
    return str(folder)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    add_model_option(ap)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = model_or_demo(args.model, Path(tmp))
        quantized = mlx_download(Path(tmp))
        from streamer.cli import DEMO_MODEL

        baseline = [sys.executable, "-c", "import mlx_lm"]
        start = time.perf_counter()
        subprocess.run(baseline, check=True)
        print(f"import mlx_lm (for scale)     {time.perf_counter() - start:.2f} s")
        for name, command in (
            ("streamer --help", ["--help"]),
            ("streamer --version", ["--version"]),
            ("streamer info DIR", ["info", model]),
            ("streamer plan DIR", ["plan", model]),
            ("streamer plan config.json", ["plan", str(DEMO_MODEL / "config.json")]),
            ("streamer plan DOWNLOAD", ["plan", str(DEMO_MODEL)]),
            ("streamer plan DOWNLOAD -q 4", ["plan", str(DEMO_MODEL), "--quantize", "4"]),
            ("streamer plan MLX-DOWNLOAD", ["plan", quantized]),
        ):
            print(f"{name:<30}{seconds(command, args.repeats):.2f} s")
        # refused before the tokenizer is built: no transformers import
        missing = ["generate", "--model", str(Path(tmp) / "missing"), "--prompt", "x"]
        print(f"{'streamer generate MISSING':<30}{seconds(missing, args.repeats, status=2):.2f} s")


if __name__ == "__main__":
    main()
