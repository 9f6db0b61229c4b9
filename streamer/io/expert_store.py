"""The expert store: experts read from the repacked layer files through mmap.

The OS page cache is the cache: a warm expert is a memcpy out of mapped pages, a cold one is
faulted in from disk. Each read copies the routed experts' tensors into stacked arrays shaped
like mlx-lm's stacked expert tensors, but holding only the experts asked for.
"""

from __future__ import annotations

import mmap
import os
import time
import zlib
from pathlib import Path

import numpy as np

from ..cache.residency import resident_bytes
from ..errors import StreamerError
from ..stats import ExpertTraffic
from .manifest import Manifest, MoeLayer
from .safetensors import DTYPES


class ExpertStore:
    def __init__(self, folder: Path, manifest: Manifest):
        self.folder = Path(folder)
        self.layers = manifest.layers
        self._maps: list[mmap.mmap] = []
        self._views: list[np.ndarray] = []
        for layer in self.layers:
            mm = self._map(layer)
            self._maps.append(mm)
            self._views.append(np.frombuffer(mm, dtype=np.uint8))
        self.verify_reads = False  # load(verify_reads=True): crc32 of each expert on its first read
        self._verified = [np.zeros(layer.num_experts, dtype=bool) for layer in self.layers]
        self._fds = [os.open(self.folder / layer.file, os.O_RDONLY) for layer in self.layers]

    def _map(self, layer: MoeLayer) -> mmap.mmap:
        path = self.folder / layer.file
        try:
            with open(path, "rb") as f:
                size = path.stat().st_size
                if size != layer.file_bytes:
                    raise StreamerError(
                        f"{path} holds {size} bytes but the manifest expects {layer.file_bytes} for "
                        f"{layer.module}: the file is truncated or was changed; repack the model."
                    )
                return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as e:
            raise StreamerError(f"cannot open expert file {path}: {e.strerror or e}; repack the model.") from e

    def read(self, layer_index: int, experts: np.ndarray, traffic: ExpertTraffic) -> list[np.ndarray]:
        """One [len(experts), *shape] array per tensor of the layer, in manifest order."""
        layer = self.layers[layer_index]
        view = self._views[layer_index]
        self._check_experts(layer_index, experts)
        start = time.perf_counter()
        out = [np.empty((len(experts), *t.shape), dtype=DTYPES[t.dtype][0]) for t in layer.tensors]
        payload = 0
        for slot, expert in enumerate(experts.tolist()):
            base = layer.expert_offsets[expert]
            resident = resident_bytes(view.ctypes.data + base, layer.record_bytes)
            if resident is not None:
                traffic.bytes_in_page_cache += resident
                traffic.bytes_measured += layer.record_bytes
            for tensor, dest in zip(layer.tensors, out):
                begin = base + tensor.offset
                dest[slot] = view[begin : begin + tensor.nbytes].view(dest.dtype).reshape(tensor.shape)
            payload += layer.record_bytes
        traffic.experts_read += len(experts)
        traffic.bytes_read += payload
        traffic.read_seconds += time.perf_counter() - start
        return out

    def _check_experts(self, layer_index: int, experts: np.ndarray) -> None:
        """Never compute with partial or corrupt data. Refuse experts that a file truncated since load
        no longer holds (touching them through the map would kill the process with SIGBUS) and, with
        `verify_reads`, check each expert's crc32 the first time it is read."""
        layer = self.layers[layer_index]
        size = os.fstat(self._fds[layer_index]).st_size
        where = f"{self.folder / layer.file} (MoE layer {layer_index}, {layer.module})"
        for expert in experts.tolist():
            base = layer.expert_offsets[expert]
            if base + layer.record_bytes > size:
                raise StreamerError(
                    f"{where} shrank to {size} bytes while the model was loaded: expert {expert} lies past its "
                    "end. The file was truncated or overwritten; repack the model."
                )
            if not self.verify_reads or self._verified[layer_index][expert]:
                continue
            view = self._views[layer_index]
            for tensor, crc in zip(layer.tensors, layer.expert_crc32[expert]):
                begin = base + tensor.offset
                if zlib.crc32(view[begin : begin + tensor.nbytes]) != crc:
                    raise StreamerError(
                        f"{where}: expert {expert} tensor {tensor.name} does not match its checksum: the file is "
                        f"corrupt. Run `streamer verify {self.folder}` to list every bad tensor, then repack."
                    )
            self._verified[layer_index][expert] = True

    def close(self) -> None:
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()
        self._views.clear()
        for mm in self._maps:
            mm.close()
        self._maps.clear()
