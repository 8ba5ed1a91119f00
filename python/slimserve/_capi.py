"""The C ABI (include/slimserve/c/slimserve.h) as ctypes sees it.

The structs (Page, KvCache, PagedAttentionArgs, ...), enum constants, ABI_VERSION and every
function's (restype, argtypes) come from _capi_generated.py, which tools/gen_capi.py writes from
the header (CI fails when the two disagree, or when the library exports a function without a
signature). `load()` finds the shared library, checks its ABI version (the library's must be at
least ABI_VERSION) and declares every function's argument and result types, so a wrong argument
count or struct is a Python TypeError rather than memory corruption. Structs of ABI 2 that begin
with `struct_size` get it set by `versioned()`. tests/test_capi_layout.py compiles the header and
compares every struct's size and fields' offsets with the generated declarations.
"""
from __future__ import annotations

import ctypes
import glob
import os
from ctypes import c_int32

from ._capi_generated import *  # noqa: F401,F403  the structs and enum constants
from ._capi_generated import ABI_VERSION, SIGNATURES, STRUCTS  # noqa: F401

# Status codes (slimserve_status).
OK = 0
STATUS_NAMES = {
    0: "ok", 1: "invalid_argument", 2: "out_of_range", 3: "unsupported", 4: "resource_exhausted",
    5: "stale_handle", 6: "failed_precondition", 7: "data_loss", 8: "io_error", 9: "device_error",
    10: "internal",
}
STATUS_CODES = {name: code for code, name in STATUS_NAMES.items()}


def versioned(struct_type):
    """A zeroed ABI-2 struct with struct_size set (0 is every field's default)."""
    value = struct_type()
    value.struct_size = ctypes.sizeof(struct_type)
    return value


def _candidates():
    explicit = os.environ.get("SLIMSERVE_LIBRARY")
    if explicit:
        return [explicit]
    here = os.path.join(os.path.dirname(__file__), "_lib")
    wanted = os.environ.get("SLIMSERVE_BACKEND", "auto")  # auto | cuda | emulated
    cuda = sorted(glob.glob(os.path.join(here, "libslimserve_c.so*")))
    emulated = sorted(glob.glob(os.path.join(here, "libslimserve_c_emulated.so*")))
    if wanted == "cuda":
        return cuda
    if wanted == "emulated":
        return emulated
    return cuda + emulated


def load():
    errors = []
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError as error:  # e.g. the CUDA build on a machine without the driver
            errors.append(f"{path}: {error}")
            continue
        version = lib.slimserve_c_abi_version
        version.restype, version.argtypes = c_int32, []
        if version() < ABI_VERSION:  # a library of a later ABI serves every earlier one
            errors.append(f"{path}: C ABI version {version()}, need {ABI_VERSION} or later")
            continue
        for name, (restype, argtypes) in SIGNATURES.items():
            function = getattr(lib, name)
            function.restype = restype
            function.argtypes = argtypes
        return lib, path
    raise ImportError("slimserve: no usable C library (set SLIMSERVE_LIBRARY to libslimserve_c*.so); "
                      + "; ".join(errors or ["none found"]))
