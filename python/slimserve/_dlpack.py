"""Tensors in, pointers out: any object with `__dlpack__` (NumPy >= 1.22, PyTorch, CuPy, JAX)
gives slimserve its data pointer, device, dtype and shape through the DLPack protocol, without a
copy and without importing the framework.

The C ABI takes raw pointers; `TensorRef` keeps the producer's capsule (and so the tensor) alive
while the call that uses the pointer runs.
"""
from __future__ import annotations

import ctypes
from ctypes import POINTER, Structure, c_int32, c_int64, c_uint8, c_uint16, c_uint64, c_void_p

import numpy as np

from ._errors import type_error, value_error

KDL_CPU, KDL_CUDA, KDL_CUDA_HOST, KDL_CUDA_MANAGED = 1, 2, 3, 13
_INT, _UINT, _FLOAT, _BFLOAT, _BOOL = 0, 1, 2, 4, 6
_FLOAT8_E4M3FN, _FLOAT8_E5M2 = 10, 12  # DLPack 1.0 type codes (PyTorch's FP8 dtypes)


class _DLDevice(Structure):
    _fields_ = [("device_type", c_int32), ("device_id", c_int32)]


class _DLDataType(Structure):
    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class _DLTensor(Structure):
    _fields_ = [("data", c_void_p), ("device", _DLDevice), ("ndim", c_int32),
                ("dtype", _DLDataType), ("shape", POINTER(c_int64)),
                ("strides", POINTER(c_int64)), ("byte_offset", c_uint64)]


class _DLManagedTensor(Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", c_void_p), ("deleter", c_void_p)]


_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]

_DTYPES = {
    (_FLOAT, 16): "float16", (_BFLOAT, 16): "bfloat16", (_FLOAT, 32): "float32",
    (_FLOAT, 64): "float64", (_INT, 32): "int32", (_INT, 64): "int64", (_INT, 8): "int8",
    (_UINT, 8): "uint8", (_UINT, 16): "uint16", (_UINT, 32): "uint32", (_INT, 16): "int16",
    (_UINT, 64): "uint64", (_BOOL, 8): "bool",
    (_FLOAT8_E4M3FN, 8): "float8_e4m3fn", (_FLOAT8_E5M2, 8): "float8_e5m2",
}


# torch dtypes by str(dtype), as the DLPack names above.
_TORCH_DTYPES = {
    "torch.float16": "float16", "torch.bfloat16": "bfloat16", "torch.float32": "float32",
    "torch.float64": "float64", "torch.int32": "int32", "torch.int64": "int64", "torch.int8": "int8",
    "torch.uint8": "uint8", "torch.int16": "int16", "torch.bool": "bool",
    "torch.float8_e4m3fn": "float8_e4m3fn", "torch.float8_e5m2": "float8_e5m2",
}


class TensorRef:
    """A borrowed view of a DLPack tensor: pointer, device, dtype name, shape."""

    __slots__ = ("owner", "capsule", "ptr", "device_type", "device_id", "dtype", "shape", "strides")

    def __init__(self, tensor, strided=False, name="tensor"):
        self.owner = tensor
        self.capsule = None
        self.strides = None  # element strides when the tensor is not compact (strided=True only)
        if isinstance(tensor, np.ndarray) and tensor.flags.c_contiguous and tensor.dtype.name != "bool":
            # Fast path, same answer as DLPack: NumPy describes itself without a capsule.
            self.ptr, self.shape = tensor.__array_interface__["data"][0], tensor.shape
            self.device_type, self.device_id = KDL_CPU, 0
            self.dtype = tensor.dtype.name
            return
        if type(tensor).__name__ in ("Tensor", "Parameter") and type(tensor).__module__.startswith("torch"):
            # Fast path for PyTorch, same answer as DLPack without a capsule per call (the
            # run ops read a handful of tensors each layer).
            dtype = _TORCH_DTYPES.get(str(tensor.dtype))
            device = tensor.device.type
            if dtype is not None and device in ("cpu", "cuda"):
                self.dtype = dtype
                self.shape = tuple(tensor.shape)
                self.ptr = tensor.data_ptr()
                self.device_type = KDL_CPU if device == "cpu" else KDL_CUDA
                self.device_id = tensor.device.index or 0
                if not tensor.is_contiguous():
                    self._set_strides(tuple(tensor.stride()), strided, name)
                return
        if not hasattr(tensor, "__dlpack__"):
            raise type_error(f"slimserve: {name} must be a tensor (an object with __dlpack__), "
                             f"got {type(tensor).__name__}")
        try:
            self.capsule = tensor.__dlpack__()
        except (TypeError, ValueError, BufferError, RuntimeError) as error:
            raise type_error(f"slimserve: {name} cannot be shared through DLPack: {error}") from None
        managed = _DLManagedTensor.from_address(_get_pointer(self.capsule, b"dltensor"))
        dl = managed.dl_tensor
        if dl.dtype.lanes != 1:
            raise type_error(f"slimserve: {name} has a vector dtype ({dl.dtype.lanes} lanes)")
        self.dtype = _DTYPES.get((dl.dtype.code, dl.dtype.bits), f"code{dl.dtype.code}x{dl.dtype.bits}")
        self.shape = tuple(dl.shape[i] for i in range(dl.ndim))
        if dl.strides:  # compact row-major unless strided (NULL strides means compact)
            self._set_strides(tuple(dl.strides[j] for j in range(dl.ndim)), strided, name)
        self.ptr = (dl.data or 0) + dl.byte_offset
        self.device_type = dl.device.device_type
        self.device_id = dl.device.device_id

    def _set_strides(self, strides, strided: bool, name: str) -> None:
        """Keeps `strides` when the tensor is not compact row-major (strided=True only)."""
        expected = 1
        for i in reversed(range(len(strides))):
            if self.shape[i] != 1 and strides[i] != expected:
                if not strided:
                    raise value_error(f"slimserve: {name} of shape {self.shape} is not contiguous "
                                      f"(strides {strides})")
                if any(st <= 0 for st, n in zip(strides, self.shape) if n > 1):
                    raise value_error(f"slimserve: {name} has strides {strides}: zero or negative "
                                      "strides (broadcast or flipped views) are not supported")
                self.strides = strides
                return
            expected *= self.shape[i]

    @property
    def numel(self) -> int:
        count = 1
        for extent in self.shape:
            count *= extent
        return count


def ref(tensor, *, dtypes=None, shape=None, name="tensor", emulated=True, strided=False, ndim=None) -> TensorRef:
    """Checks what the C call will assume: the device the library runs on, dtype, shape.
    strided=True also takes views whose strides are not compact (`strides` gives them)."""
    if tensor is None:
        raise type_error(f"slimserve: {name} is required")
    if isinstance(tensor, np.ndarray) and not tensor.flags.writeable:
        tensor = tensor.copy()  # NumPy exports only writable arrays through DLPack
    r = TensorRef(tensor, strided, name)
    if emulated and r.device_type not in (KDL_CPU, KDL_CUDA_HOST):
        raise type_error(f"slimserve: {name} must be host memory for the CPU-emulated library "
                         f"(DLPack device type {r.device_type})")
    if not emulated and r.device_type not in (KDL_CUDA, KDL_CUDA_MANAGED):
        raise type_error(f"slimserve: {name} must be CUDA memory for the GPU library "
                         f"(DLPack device type {r.device_type})")
    if dtypes is not None and r.dtype not in dtypes:
        raise type_error(f"slimserve: {name} has dtype {r.dtype}, expected one of {sorted(dtypes)}")
    if ndim is not None and len(r.shape) != ndim:
        raise value_error(f"slimserve: {name} must be {ndim}-D, got shape {r.shape}")
    if shape is not None and tuple(shape) != r.shape:
        raise value_error(f"slimserve: {name} has shape {r.shape}, expected {tuple(shape)}")
    return r
