"""Checkpoints for the tests, made once per session: every architecture in both download
conventions.

- "hf": named and laid out as the family publishes it on the hub (per-expert bf16 tensors; fused
  experts for Qwen3.5; MXFP4 blocks for gpt-oss), sharded with an index.
- "mlx": the same model converted by mlx-lm's own `mlx_lm.convert(quantize=True)` (4-bit).
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import shutil
from pathlib import Path

import mlx.core as mx
import mlx_lm
import pytest
from filelock import FileLock
from mlx_lm.utils import load_model

from fixtures import TINY_CONFIGS, tiny_config, write_hf_checkpoint
from fixtures.nvfp4 import write_mlx_nvfp4
from streamer.repack import repack

ARCHS = sorted(TINY_CONFIGS)

# The live server the test_server_*.py files share, started once per session when first asked
# for; the fixture that computes NVFP4 global scales on the CPU.
pytest_plugins = ["serving", "gather_qmm_stand_in"]


class Checkpoints:
    """Each checkpoint made on first use, once per run: pytest-xdist's workers share the folder
    (each made by one of them, under a lock; the others wait and read it)."""

    def __init__(self, root: Path):
        self.root = root
        self._ready: set[Path] = set()

    def made(self, path: Path, make) -> Path:
        """`path`, made by `make(path)` if no worker has made it yet."""
        if path not in self._ready:
            path.parent.mkdir(parents=True, exist_ok=True)
            with FileLock(f"{path}.lock"):
                if not path.exists():
                    make(path)
            self._ready.add(path)
        return path

    def hf(self, arch: str, dtype: str = "bfloat16") -> Path:
        return self.made(
            self.root / f"hf-{arch}-{dtype}",
            lambda path: write_hf_checkpoint(path, tiny_config(arch), dtype=dtype),
        )

    def mlx(
        self,
        arch: str,
        bits: int = 4,
        group_size: int = 64,
        recipe: str | None = None,
        dtype: str | None = None,
        mode: str = "affine",
    ) -> Path:
        """`recipe`: one of mlx-lm's mixed-bit recipes (e.g. "mixed_3_6": some down_proj at 6 bits);
        `dtype`: mlx_lm.convert's --dtype (float32: float32 scales, as the CPU computes); `mode`:
        its --q-mode."""
        path = self.root / (
            f"mlx-{arch}-{recipe or bits}-{group_size}"
            + (f"-{dtype}" if dtype else "")
            + (f"-{mode}" if mode != "affine" else "")
        )
        hf = self.hf(arch)

        def convert(path: Path) -> None:
            with contextlib.redirect_stdout(io.StringIO()):
                mlx_lm.convert(
                    str(hf),
                    str(path),
                    quantize=True,
                    q_bits=bits,
                    q_group_size=group_size,
                    quant_predicate=recipe,
                    dtype=dtype,
                    q_mode=mode,
                )

        return self.made(path, convert)

    def mlx_nvfp4_global_scales(self) -> Path:
        """qwen3_moe in NVFP4 with a global scale per expert (fixtures/nvfp4.py)."""
        hf = self.hf("qwen3_moe")
        return self.made(
            self.root / "mlx-qwen3_moe-nvfp4-global", lambda path: write_mlx_nvfp4(hf, path)
        )

    def repacked(self, src: Path, **kwargs) -> Path:
        name = src.name + "".join(f"-{k}{v}" for k, v in sorted(kwargs.items()))
        return self.made(
            self.root / "repacked" / name,
            lambda dst: repack(src, dst, log=lambda _: None, **kwargs),
        )


@pytest.fixture(scope="session", autouse=True)
def metal_kernels_stood_in():
    """Muse Spark's Metal kernels, where Metal is absent: stand-ins for both sides of every
    comparison (metal_stand_ins.py)."""
    if mx.metal.is_available():
        yield
        return
    from metal_stand_ins import KERNELS
    from mlx_lm.models import muse_spark

    with pytest.MonkeyPatch.context() as patch:
        for name, kernel in KERNELS.items():
            patch.setattr(muse_spark, name, kernel)
        yield


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> Checkpoints:
    if os.environ.get("PYTEST_XDIST_WORKER"):  # one folder for the run: beside each worker's own
        return Checkpoints(tmp_path_factory.getbasetemp().parent / "checkpoints")
    return Checkpoints(tmp_path_factory.mktemp("checkpoints"))


def private_download(src: Path, tmp_path: Path, monkeypatch) -> Path:
    """A private copy of download `src` and a private user cache folder (for its checksum
    sidecar), so a test may damage or record either."""
    monkeypatch.setenv("STREAMER_CACHE_DIR", str(tmp_path / "cache"))
    folder = tmp_path / "download"
    shutil.copytree(src, folder)
    return folder


@functools.cache
def reference_model(path: Path):
    """mlx-lm's own model, fully resident, computing in float32 like streamer does on CPU."""
    model, _ = load_model(Path(path))
    model.set_dtype(mx.float32)
    return model
