"""A stand-in for the few torch calls gpucheck makes, over the reference data
path's libcudart (refpath/build/plain/libcudart.so.12, named by
$GPUCHECK_FAKE_CUDART): lets test_gpucheck run the whole check under the real
agent on a machine without a GPU. Not PyTorch; only what gpucheck.py uses."""

import ctypes
import os
import time

_rt = ctypes.CDLL(os.environ["GPUCHECK_FAKE_CUDART"])
_H2D, _D2H = 1, 2
uint8 = "uint8"


def _check(rc, what):
    if rc != 0:
        raise RuntimeError(f"{what} returned {rc}")


class Tensor:
    def __init__(self, ptr, n, on_device, owner=None):
        self.ptr, self.n, self.on_device, self.owner = ptr, n, on_device, owner

    def __getitem__(self, sl):
        assert isinstance(sl, slice) and sl.start is None and sl.step is None
        return Tensor(self.ptr, min(sl.stop, self.n), self.on_device, self)

    def fill_(self, v):
        if not self.on_device:
            ctypes.memset(self.ptr, v, self.n)
        return self

    def copy_(self, src, non_blocking=False):
        assert self.n == src.n and self.on_device != src.on_device
        kind = _H2D if self.on_device else _D2H
        _check(_rt.cudaMemcpyAsync(ctypes.c_void_p(self.ptr), ctypes.c_void_p(src.ptr), ctypes.c_size_t(self.n),
                                   kind, ctypes.c_void_p(0)), "cudaMemcpyAsync")
        if not non_blocking:
            cuda.synchronize()
        return self


def empty(n, dtype=None, pin_memory=False, device=None):
    p = ctypes.c_void_p()
    if device is not None:
        _check(_rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(n)), "cudaMalloc")
        return Tensor(p.value, n, True)
    if pin_memory:
        _check(_rt.cudaHostAlloc(ctypes.byref(p), ctypes.c_size_t(n), 0), "cudaHostAlloc")
        return Tensor(p.value, n, False)
    buf = ctypes.create_string_buffer(n)
    return Tensor(ctypes.addressof(buf), n, False, buf)


def zeros(n, device=None):
    return empty(n, device=device)


class _Props:
    name = "refpath"


class _Event:
    def __init__(self, enable_timing=False):
        self.t = None

    def record(self):
        cuda.synchronize()
        self.t = time.monotonic()

    def elapsed_time(self, end):
        return (end.t - self.t) * 1000


class cuda:
    Event = _Event

    @staticmethod
    def is_available():
        return True

    @staticmethod
    def device_count():
        n = ctypes.c_int()
        _check(_rt.cudaGetDeviceCount(ctypes.byref(n)), "cudaGetDeviceCount")
        return n.value

    @staticmethod
    def set_device(i):
        _check(_rt.cudaSetDevice(i), "cudaSetDevice")

    @staticmethod
    def synchronize():
        _check(_rt.cudaDeviceSynchronize(), "cudaDeviceSynchronize")

    @staticmethod
    def get_device_properties(i):
        return _Props()

    @staticmethod
    def get_device_name(i):
        return "refpath"
