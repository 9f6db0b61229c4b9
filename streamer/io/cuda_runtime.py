"""The few CUDA runtime calls the CUDA miss paths make, from the libcudart mlx-cuda loaded.

Loaded only when MLX computes on a CUDA GPU (cache/landing.py); io/cuda_copy.py and
io/cuda_gather.py's callers use it. Every failure is one line with the call and CUDA's name for it.
"""

from __future__ import annotations

import ctypes

from ..errors import StreamerError

_MEMCPY_DEFAULT = 4  # cudaMemcpyDefault: the direction from the unified addresses
_STREAM_NON_BLOCKING = 1  # cudaStreamNonBlocking: no implicit sync with MLX's streams
_REGISTER_MAPPED = 2  # cudaHostRegisterMapped: kernels may read the range (io/cuda_gather.py)
_REGISTER_READ_ONLY = 8  # cudaHostRegisterReadOnly: the mapping is PROT_READ
_LOCATION_DEVICE = 1  # cudaMemLocationTypeDevice


class _Location(ctypes.Structure):  # cudaMemLocation (CUDA 13: prefetch takes it by value)
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class CudaRuntime:
    """The few CUDA runtime calls the staging needs, from the libcudart that mlx-cuda loaded."""

    def __init__(self, lib: ctypes.CDLL | None = None):
        self._lib = lib if lib is not None else ctypes.CDLL(_loaded_cudart())
        self._lib.cudaGetErrorString.restype = ctypes.c_char_p
        void, size = ctypes.c_void_p, ctypes.c_size_t
        self._lib.cudaMemcpyAsync.argtypes = [void, void, size, ctypes.c_int, void]
        self._lib.cudaStreamCreateWithFlags.argtypes = [ctypes.POINTER(void), ctypes.c_uint]
        self._lib.cudaHostAlloc.argtypes = [ctypes.POINTER(void), size, ctypes.c_uint]
        self._lib.cudaFreeHost.argtypes = [void]
        self._lib.cudaStreamSynchronize.argtypes = [void]
        self._lib.cudaStreamDestroy.argtypes = [void]
        self._lib.cudaHostRegister.argtypes = [void, size, ctypes.c_uint]
        self._lib.cudaHostUnregister.argtypes = [void]
        self._lib.cudaHostGetDevicePointer.argtypes = [ctypes.POINTER(void), void, ctypes.c_uint]
        self._lib.cudaMemPrefetchAsync.argtypes = [void, size, _Location, ctypes.c_uint, void]
        self._lib.cudaGetDevice.argtypes = [ctypes.POINTER(ctypes.c_int)]

    def host_alloc(self, nbytes: int) -> int:
        """Pinned host memory CUDA owns (so no other allocation can reuse its addresses while the
        driver still counts them pinned, as a freed registered numpy buffer's could)."""
        address = ctypes.c_void_p()
        self._check(self._lib.cudaHostAlloc(ctypes.byref(address), nbytes, 0), "cudaHostAlloc")
        return address.value or 0

    def free_host(self, address: int) -> None:
        self._check(self._lib.cudaFreeHost(address), "cudaFreeHost")

    def register(self, address: int, nbytes: int, mapped: bool = False) -> None:
        """Page-lock a read-only host range (a file's mapping) so the copy engine reads it, and
        (`mapped`) map it for kernels to read."""
        flags = _REGISTER_READ_ONLY | (_REGISTER_MAPPED if mapped else 0)
        self._check(self._lib.cudaHostRegister(address, nbytes, flags), "cudaHostRegister")

    def device_address(self, address: int) -> int:
        """Where kernels reach a host range registered `mapped`."""
        pointer = ctypes.c_void_p()
        err = self._lib.cudaHostGetDevicePointer(ctypes.byref(pointer), address, 0)
        self._check(err, "cudaHostGetDevicePointer")
        return pointer.value or 0

    def unregister(self, address: int) -> None:
        self._check(self._lib.cudaHostUnregister(address), "cudaHostUnregister")

    def new_stream(self) -> int:
        stream = ctypes.c_void_p()
        self._check(
            self._lib.cudaStreamCreateWithFlags(ctypes.byref(stream), _STREAM_NON_BLOCKING),
            "cudaStreamCreateWithFlags",
        )
        return stream.value or 0

    def destroy_stream(self, stream: int) -> None:
        self._check(self._lib.cudaStreamDestroy(stream), "cudaStreamDestroy")

    def copy(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        err = self._lib.cudaMemcpyAsync(dst, src, nbytes, _MEMCPY_DEFAULT, stream)
        self._check(err, "cudaMemcpyAsync")

    def to_device(self, address: int, nbytes: int) -> None:
        """Move a managed range's pages to the current GPU now, and wait: the host then holds
        none of them (they leave the process's RSS) and no kernel faults them over later."""
        device = ctypes.c_int()
        self._check(self._lib.cudaGetDevice(ctypes.byref(device)), "cudaGetDevice")
        stream = self.new_stream()
        try:
            where = _Location(_LOCATION_DEVICE, device.value)
            err = self._lib.cudaMemPrefetchAsync(address, nbytes, where, 0, stream)
            self._check(err, "cudaMemPrefetchAsync")
            self.wait(stream)
        finally:
            self.destroy_stream(stream)

    def wait(self, stream: int) -> None:
        self._check(self._lib.cudaStreamSynchronize(stream), "cudaStreamSynchronize")

    def _check(self, err: int, call: str) -> None:
        if err:
            name = self._lib.cudaGetErrorString(err).decode(errors="replace")
            raise StreamerError(f"CUDA {call} failed: {name} (error {err})")


def _loaded_cudart() -> str:
    """The path of the libcudart this process has mapped (mlx-cuda's), else its usual name."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rsplit(" ", 1)[-1].strip()
                if "/libcudart.so" in path:
                    return path
    except OSError:
        pass
    return "libcudart.so.13"
