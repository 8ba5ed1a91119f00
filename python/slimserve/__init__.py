"""slimserve for Python engines: tagged KV pages, FP8/BF16 KV cache append and decode
attention, INT4 weights.

ctypes bindings over slimserve's C ABI (`slimserve/c/slimserve.h`). Tensors cross through DLPack
(NumPy, PyTorch, CuPy alike) without copies. The package ships the CPU-emulated library, so
everything here runs on a machine without a GPU on host arrays; a GPU build
(`SLIMSERVE_PYTHON_CUDA=ON`) runs the same calls on CUDA tensors. When PyTorch is importable,
`slimserve.torch_ops` registers the kernels as `torch.library` custom ops with fake
implementations (torch.compile), among them capturable ones (a plan filling persistent buffers,
runs that only launch: CUDA graphs).

Every entry checks its tensors (dtype, shape, strides, device, agreement with the plan and the
cache) before anything launches. Failures raise SlimserveError (`.code`: the C status name);
SlimserveValueError and SlimserveTypeError are also ValueError and TypeError.
"""
from __future__ import annotations

import ctypes
import sys
import math
import weakref
from ctypes import byref, c_int32, c_size_t, c_void_p
from typing import Iterable, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from . import _capi
from . import _kv_formats_generated as _kv_formats
from ._capi import Page
from ._dlpack import ref as _ref
from ._errors import SlimserveError, SlimserveTypeError, SlimserveValueError, type_error, value_error
from ._errors import from_status as _from_status

_lib, library_path = _capi.load()
EMULATED: bool = bool(_lib.slimserve_is_emulated())
_v = _lib.slimserve_version()
__version__ = f"{_v // 10000}.{_v // 100 % 100}.{_v % 100}"

# Names of the KV cache's element type, vLLM's and FlashInfer's included ("fp8" is vLLM's
# name for e4m3), from the library's one list of KV formats (_kv_formats_generated). "auto"
# means the cache tensor's own dtype (kv_dtype_name resolves it).
KV_DTYPES = dict(_kv_formats.KV_DTYPES)
ACTIVATION_DTYPES = {"bfloat16": 0, "bf16": 0, "float16": 1, "fp16": 1, "half": 1}
_KV_CODE_NAMES = dict(_kv_formats.KV_CODE_NAMES)
# Tensor dtypes (DLPack names) that may hold pages of each KV element type.
_KV_TENSOR_DTYPES = dict(_kv_formats.KV_TENSOR_DTYPES)
LAYOUTS = {"NHD": 0, "HND": 1}
# Which head vectors the append stores Walsh-Hadamard rotated (docs/attention.md, "Rotated keys"):
# queries then go through rotate_heads first, and with "keys_and_values" the attention output
# after. head_dim 64, 128 or 256.
ROTATIONS = {"none": 0, "keys": 1, "keys_and_values": 2}
ROTATION_HEAD_DIMS = (64, 128, 256)
SUPPORTED_PAGE_SIZES = (16, 32, 64, 128)  # tokens per page the kernels take (see PagedKVCache)
REQUEST_STATES = {0: "ok", 1: "stale_tag", 2: "page_out_of_range", 3: "bad_page_table",
                  4: "guard_page", 5: "write_denied", 6: "read_denied", 7: "unwritten_slots",
                  8: "append_not_next", 9: "record_mismatch", 10: "tags_not_synced"}

PageHandle = Tuple[int, int]  # (page id, tag)


def _check(status: int) -> None:
    if status != _capi.OK:
        raise _from_status(status, (_lib.slimserve_last_error() or b"").decode())


def _dtype_name(dtype) -> Optional[str]:
    """A dtype given as a string, a torch dtype or a NumPy dtype, as the package names it."""
    if dtype is None or isinstance(dtype, str):
        return dtype
    text = str(dtype)
    return text[len("torch."):] if text.startswith("torch.") else np.dtype(dtype).name


def kv_dtype_name(dtype, tensor_dtype: Optional[str] = None, name: str = "kv_cache_dtype") -> str:
    """The canonical KV element type ("bfloat16", "float16", "fp8_e4m3", "fp8_e5m2", "nvfp4") of a
    name engines use ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bf16", torch.float8_e4m3fn, ...);
    "auto"/None take it from the cache tensor's dtype."""
    dtype = _dtype_name(dtype)
    if dtype in (None, "auto"):
        dtype = tensor_dtype
        if dtype in ("uint8", "int8", None):
            raise type_error(f"slimserve: {name} 'auto' cannot tell the format of {dtype} pages: "
                             "pass 'fp8_e4m3' (vLLM's 'fp8'), 'fp8_e5m2' or 'nvfp4'")
    if dtype not in KV_DTYPES:
        raise value_error(f"slimserve: {name} {dtype!r} is not a KV cache dtype "
                          f"(one of 'auto', {', '.join(repr(k) for k in KV_DTYPES)})")
    return _KV_CODE_NAMES[KV_DTYPES[dtype]]


# E2M1's largest magnitude: an NVFP4 value is code * E4M3 block scale * tensor scale, so its
# largest is 6 * 448 * tensor scale.
_NVFP4_E2M1_MAX = 6.0
# formats/nvfp4.hpp's nvfp4_max_tensor_scale: FLT_MAX / 2^14, the largest tensor scale whose
# product with a reader's widened unit (2^14) stays finite; the append and every reader treat a
# larger one as invalid (NaN blocks, NaN rows), so it is refused here.
_NVFP4_MAX_TENSOR_SCALE = float(np.finfo(np.float32).max) / 16384.0


def nvfp4_head_vector_bytes(head_dim: int) -> int:
    """Bytes of one NVFP4 head vector: head_dim / 2 bytes of E2M1 codes, then one E4M3 block
    scale per 16 elements (9 * head_dim / 16). The vLLM plugin sizes vLLM's per-head content (a
    K and a V head vector per token) with it."""
    head_dim = int(head_dim)
    if head_dim <= 0 or head_dim % 16:
        raise value_error(f"slimserve: nvfp4 head_dim {head_dim} must be a positive multiple of 16 "
                          "(16-element blocks)")
    return head_dim // 2 + head_dim // 16


def nvfp4_tensor_scale(fp8_scale: float) -> float:
    """NVFP4's per-tensor scale from an FP8-meaning scale (vLLM's k_scale / v_scale: the largest
    value stored is 448 * scale): scale / 6, so that 6 * 448 * tensor scale is that same largest
    value. A non-finite or non-positive scale is refused."""
    tensor_scale = _check_scale_value(fp8_scale, "fp8_scale") / _NVFP4_E2M1_MAX
    if not 0.0 < ctypes.c_float(tensor_scale).value <= _NVFP4_MAX_TENSOR_SCALE:  # as the kernels read it
        raise value_error(f"slimserve: fp8_scale {fp8_scale} gives an nvfp4 tensor scale {tensor_scale} outside "
                          f"(0, {_NVFP4_MAX_TENSOR_SCALE:.6g}]")
    return tensor_scale


def _head_dim_of(dtype: str, extent: int) -> int:
    """head_dim of pages whose last extent is `extent`: the head vector's bytes for NVFP4 (D/2
    bytes of E2M1 codes, then D/16 E4M3 block scales: 9 D / 16), else head_dim itself."""
    if dtype != "nvfp4":
        return extent
    if extent % 9:
        raise value_error(f"slimserve: nvfp4 pages' last extent {extent} must be a head vector's bytes "
                          "(9 * head_dim / 16: 36, 72 or 144 for head_dim 64, 128, 256)")
    return extent * 16 // 9


def _check_scale_value(value: float, name: str, kv_dtype: Optional[str] = None) -> float:
    """A scale as the kernels will read it (an FP32 device float), refused unless finite and > 0
    there (1e39 is finite as a double but infinite as FP32) and, for nvfp4, at most
    _NVFP4_MAX_TENSOR_SCALE."""
    value = float(value)
    as_fp32 = ctypes.c_float(value).value
    if not math.isfinite(as_fp32) or not as_fp32 > 0.0:
        raise value_error(f"slimserve: {name} must be finite and > 0 as a float32 (stored = quantize(real / scale)), "
                          f"got {value}")
    if kv_dtype == "nvfp4" and as_fp32 > _NVFP4_MAX_TENSOR_SCALE:
        raise value_error(f"slimserve: {name} {value} is above the nvfp4 tensor scale's largest, "
                          f"{_NVFP4_MAX_TENSOR_SCALE:.6g} (FLT_MAX / 2^14)")
    return value


def runtime_counters() -> dict:
    """Calls the library made into the (emulated or CUDA) runtime since the process started:
    synchronizations, allocations, frees, copies. Read it around a run to see that the run
    neither synchronized nor allocated."""
    counters = _capi.versioned(_capi.RuntimeCounters)
    _check(_lib.slimserve_get_runtime_counters(byref(counters)))
    return {"synchronizations": counters.synchronizations, "allocations": counters.allocations,
            "frees": counters.frees, "copies": counters.copies}


def _tensor(x, **kwargs):
    return _ref(x, emulated=EMULATED, **kwargs)


def _stream(stream) -> Optional[int]:
    if stream is None:
        return None
    return int(getattr(stream, "cuda_stream", stream))  # a torch.cuda.Stream or a raw handle


def _pages_array(pages: Sequence[PageHandle]):
    array = (Page * max(len(pages), 1))()
    for i, (page_id, tag) in enumerate(pages):
        array[i] = Page(int(page_id), int(tag))
    return array


def _empty_like(x, shape=None, dtype=None):
    """A new tensor of x's framework and device (NumPy, PyTorch or CuPy)."""
    shape = tuple(x.shape) if shape is None else tuple(shape)
    if isinstance(x, np.ndarray):
        return np.empty(shape, dtype=x.dtype if dtype is None else dtype)
    if hasattr(x, "new_empty"):  # torch
        return x.new_empty(shape) if dtype is None else x.new_empty(shape, dtype=dtype)
    module = __import__(type(x).__module__.split(".")[0])
    return module.empty(shape, dtype=x.dtype if dtype is None else dtype)


class _TensorShape:
    """Pointer, shape and dtype of a part of a tensor (the K or V half of a combined cache)."""

    def __init__(self, ptr: int, shape, dtype: str):
        self.ptr, self.shape, self.dtype = ptr, tuple(shape), dtype


class DeviceArray:
    """Memory the library allocated (emulator memory, or GPU memory in the CUDA build), for the
    small index arrays the wrappers upload."""

    def __init__(self, host: np.ndarray, stream=None, *, capacity: int = 0):
        host = np.ascontiguousarray(host)
        self.nbytes = max(host.nbytes, int(capacity), 1)
        self.ptr = c_void_p()
        _check(_lib.slimserve_device_alloc(self.nbytes, byref(self.ptr)))
        if host.nbytes:
            _check(_lib.slimserve_memcpy_async(self.ptr, host.ctypes.data, host.nbytes, 0, _stream(stream)))

    @classmethod
    def empty(cls, nbytes: int) -> "DeviceArray":
        if not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
            raise value_error(f"slimserve: DeviceArray of {nbytes} bytes")
        return cls(np.zeros(0, np.uint8)) if nbytes == 0 else cls(np.empty(nbytes, np.uint8))

    def upload(self, host: np.ndarray, stream=None) -> None:
        """Copies `host` into the array in place (the pointer stays: persistent buffers)."""
        host = np.ascontiguousarray(host)
        if host.nbytes > self.nbytes:
            raise value_error(f"slimserve: {host.nbytes} bytes do not fit a buffer of {self.nbytes}")
        if host.nbytes:
            _check(_lib.slimserve_memcpy_async(self.ptr, host.ctypes.data, host.nbytes, 0, _stream(stream)))

    def download(self, out: np.ndarray, stream=None) -> np.ndarray:
        _check(_lib.slimserve_memcpy_async(out.ctypes.data, self.ptr, out.nbytes, 1, _stream(stream)))
        _check(_lib.slimserve_stream_synchronize(_stream(stream)))
        return out

    def __del__(self, _free=_lib.slimserve_device_free):  # bound now: module globals go first at exit
        if getattr(self, "ptr", None) is not None and self.ptr.value:
            _free(self.ptr)
            self.ptr = None


# ---- KV pages ----------------------------------------------------------------------------------

class PagePool:
    """Pages with generation tags; page 0 is the guard page (num_pages - 1 usable)."""

    def __init__(self, num_pages: int):
        self._handle = c_void_p()
        if not isinstance(num_pages, (int, np.integer)) or not 0 < num_pages < 2**31:
            raise value_error(f"slimserve: PagePool of {num_pages!r} pages")
        self._dependents = []  # weak references to caches / page sets built on this pool
        self._open_dependents = 0  # of those, not yet destroyed (see _close_or_defer)
        self._close_pending = False
        _check(_lib.slimserve_page_pool_create(num_pages, byref(self._handle)))
        self.num_pages = num_pages

    def table_age(self) -> Tuple[int, int]:
        """The pool's age now, (epoch, pool id): record it when building a step's table and pass
        it to check_page_tags(built_at=...), which refuses the table (SlimserveError,
        failed_precondition, nothing launched) when the device tags were last synced before
        changes the table saw, or from another pool."""
        epoch, pool_id = ctypes.c_uint64(), ctypes.c_uint32()
        _check(_lib.slimserve_page_pool_table_age(self._handle, byref(epoch), byref(pool_id)))
        return int(epoch.value), int(pool_id.value)

    def allocate(self, count: int) -> List[PageHandle]:
        """`count` pages, all or nothing (SlimserveError resource_exhausted takes none)."""
        if not isinstance(count, (int, np.integer)) or isinstance(count, bool) or count < 0:
            raise value_error(f"slimserve: allocate takes a page count >= 0, got {count!r}")
        if count > max(self.available, 0):
            raise SlimserveError(f"allocate of {count} pages; {self.available} are available "
                                 "(nothing was taken)", "resource_exhausted")
        out = (Page * max(count, 1))()
        _check(_lib.slimserve_page_pool_allocate(self._handle, out, count))
        return [(out[i].id, out[i].tag) for i in range(count)]

    def release(self, pages: Sequence[PageHandle]) -> None:
        """Drops one reference of each page, all or nothing."""
        _check(_lib.slimserve_page_pool_release(self._handle, _pages_array(pages), len(pages)))

    def share(self, page: PageHandle) -> None:
        _check(_lib.slimserve_page_pool_share(self._handle, Page(*page)))

    def new_writer(self) -> int:
        """A new request identity (never 0, not reused within 2^32 - 1): what the tag check
        takes in `writers` and grant_write grants."""
        out = ctypes.c_uint32(0)
        _check(_lib.slimserve_page_pool_new_writer(self._handle, byref(out)))
        return out.value

    def grant_write(self, page: PageHandle, writer: int) -> None:
        """Makes `writer` the only request that may write `page` (a sole holder's page the
        prefix cache does not index; else SlimserveError failed_precondition, nothing changed)."""
        _check(_lib.slimserve_page_pool_grant_write(self._handle, Page(*page), int(writer)))

    def revoke_write(self, page: PageHandle) -> None:
        """Makes `page` read-only (shared, or its writer is gone)."""
        _check(_lib.slimserve_page_pool_revoke_write(self._handle, Page(*page)))

    def validate(self, page: PageHandle) -> None:
        """Raises SlimserveError (stale_handle, ...) unless `page` is live under its tag."""
        _check(_lib.slimserve_page_pool_validate(self._handle, Page(*page)))

    def is_live(self, page: PageHandle) -> bool:
        return _lib.slimserve_page_pool_validate(self._handle, Page(*page)) == _capi.OK

    @property
    def available(self) -> int:
        return _lib.slimserve_page_pool_available(self._handle)

    def prepare_append(self, last_page: PageHandle):
        """(page to write, page to copy from, needs_copy) before appending into `last_page`."""
        target = _capi.AppendTarget()
        _check(_lib.slimserve_page_pool_prepare_append(self._handle, Page(*last_page), byref(target)))
        return ((target.page.id, target.page.tag), (target.copy_from.id, target.copy_from.tag),
                bool(target.needs_copy))

    def close(self) -> None:
        """Frees the pool, after whatever was built on it: at interpreter exit the garbage
        collector may finalize a pool before its cache, so the order is enforced here."""
        if _close_or_defer(self):
            _lib.slimserve_page_pool_destroy(self._handle)
            self._handle = None

    def __del__(self, _exiting=sys.is_finalizing):
        # At interpreter exit the module's globals may already be gone (None): the process
        # frees everything then, so nothing is destroyed.
        if not _exiting():
            self.close()


def _close_or_defer(owner) -> bool:
    """Whether `owner` (a pool or prefix cache with a live handle) may be destroyed now. Its
    dependents (caches, page sets) are closed first; the C ABI needs them destroyed before it.
    The garbage collector clears weak references before it runs finalizers and finalizes a
    cycle in any order, so a dependent it has not finalized yet may be out of reach here: then
    the destroy is deferred to that dependent's close (_dependent_closed)."""
    for dependent in getattr(owner, "_dependents", []):
        alive = dependent()
        if alive is not None:
            alive.close()
    if not getattr(owner, "_handle", None):
        return False
    if getattr(owner, "_open_dependents", 0) > 0:
        owner._close_pending = True
        return False
    return True


def _dependent_closed(owner) -> None:
    owner._open_dependents -= 1
    if owner._open_dependents == 0 and owner._close_pending:
        owner.close()


def _depend_on(owner, dependent) -> None:
    owner._dependents.append(weakref.ref(dependent))
    owner._open_dependents += 1


class PrefixCache:
    """Full pages indexed by token content; hits come back referenced, like allocations."""

    def __init__(self, pool: PagePool, page_size: int, hash_seed: int = 0):
        self._pool = pool  # the cache must not outlive its pool
        self._handle = c_void_p()
        self._dependents = []
        self._open_dependents = 0
        self._close_pending = False
        self.page_size = page_size
        _check(_lib.slimserve_prefix_cache_create(pool._handle, page_size, hash_seed, byref(self._handle)))
        _depend_on(pool, self)

    def match(self, tokens: Sequence[int], salt: int = 0, adapter_id: int = 0) -> List[PageHandle]:
        tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        capacity = len(tokens) // self.page_size
        out = (Page * max(capacity, 1))()
        hits = c_int32(0)
        _check(_lib.slimserve_prefix_cache_match(
            self._handle, tokens.ctypes.data_as(ctypes.POINTER(c_int32)), len(tokens), salt,
            adapter_id, out, capacity, byref(hits)))
        return [(out[i].id, out[i].tag) for i in range(hits.value)]

    def insert(self, tokens: Sequence[int], pages: Sequence[PageHandle], salt: int = 0,
               adapter_id: int = 0) -> int:
        tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        inserted = c_int32(0)
        _check(_lib.slimserve_prefix_cache_insert(
            self._handle, tokens.ctypes.data_as(ctypes.POINTER(c_int32)), len(tokens), salt,
            adapter_id, _pages_array(pages), len(pages), byref(inserted)))
        return inserted.value

    def close(self) -> None:
        if _close_or_defer(self):
            _lib.slimserve_prefix_cache_destroy(self._handle)
            self._handle = None
            _dependent_closed(self._pool)

    def __del__(self, _exiting=sys.is_finalizing):
        # At interpreter exit the module's globals may already be gone (None): the process
        # frees everything then, so nothing is destroyed.
        if not _exiting():
            self.close()


class RequestSets:
    """Per-request page sets with write ownership: the library owns each request's pages, so
    admit / append / fork / preempt / resume / finish release exactly once. A request is a
    (slot, writer) pair; its writer is what the owned tag check takes."""

    def __init__(self, pool: PagePool, cache: Optional[PrefixCache], max_requests: int, page_size: int):
        self._pool, self._cache = pool, cache  # both must outlive the sets
        self._handle = c_void_p()
        _check(_lib.slimserve_request_sets_create(pool._handle, cache._handle if cache else None,
                                                  max_requests, page_size, byref(self._handle)))
        _depend_on(pool, self)
        if cache is not None:
            _depend_on(cache, self)

    @staticmethod
    def _plan(plan: _capi.PagePlan) -> dict:
        return {"needs_copy": bool(plan.needs_copy),
                "copy_from": (plan.copy_from.id, plan.copy_from.tag),
                "copy_to": (plan.copy_to.id, plan.copy_to.tag),
                "copy_tokens": plan.copy_tokens, "cached_tokens": plan.cached_tokens}

    def admit(self, tokens: Sequence[int], salt: int = 0, adapter_id: int = 0):
        """(request, plan) for a new request's prompt; all or nothing."""
        tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        ref, plan = _capi.RequestRef(), _capi.PagePlan()
        _check(_lib.slimserve_request_sets_admit(self._handle, tokens.ctypes.data_as(ctypes.POINTER(c_int32)),
                                                 len(tokens), salt, adapter_id, byref(ref), byref(plan)))
        return (ref.slot, ref.writer), self._plan(plan)

    def append(self, request, new_tokens: int) -> dict:
        plan = _capi.PagePlan()
        _check(_lib.slimserve_request_sets_append(self._handle, _capi.RequestRef(*request), new_tokens, byref(plan)))
        return self._plan(plan)

    def release_copy_sources(self) -> None:
        _lib.slimserve_request_sets_release_copy_sources(self._handle)

    def fork(self, parent):
        child = _capi.RequestRef()
        _check(_lib.slimserve_request_sets_fork(self._handle, _capi.RequestRef(*parent), byref(child)))
        return (child.slot, child.writer)

    def preempt(self, request) -> None:
        _check(_lib.slimserve_request_sets_preempt(self._handle, _capi.RequestRef(*request)))

    def resume(self, request, tokens: Sequence[int], salt: int = 0, adapter_id: int = 0):
        tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        ref, plan = _capi.RequestRef(), _capi.PagePlan()
        _check(_lib.slimserve_request_sets_resume(self._handle, _capi.RequestRef(*request),
                                                  tokens.ctypes.data_as(ctypes.POINTER(c_int32)),
                                                  len(tokens), salt, adapter_id, byref(ref), byref(plan)))
        return (ref.slot, ref.writer), self._plan(plan)

    def finish(self, request, tokens: Sequence[int] = (), salt: int = 0, adapter_id: int = 0) -> None:
        tokens = np.ascontiguousarray(tokens, dtype=np.int32)
        _check(_lib.slimserve_request_sets_finish(self._handle, _capi.RequestRef(*request),
                                                  tokens.ctypes.data_as(ctypes.POINTER(c_int32)),
                                                  len(tokens), salt, adapter_id))

    def is_active(self, request) -> bool:
        return bool(_lib.slimserve_request_sets_is_active(self._handle, _capi.RequestRef(*request)))

    def pages(self, request) -> List[PageHandle]:
        count = c_size_t(0)
        _check(_lib.slimserve_request_sets_pages(self._handle, _capi.RequestRef(*request), None, 0, byref(count)))
        out = (Page * max(count.value, 1))()
        _check(_lib.slimserve_request_sets_pages(self._handle, _capi.RequestRef(*request), out,
                                                 count.value, byref(count)))
        return [(out[i].id, out[i].tag) for i in range(count.value)]

    def tokens(self, request) -> int:
        return _lib.slimserve_request_sets_tokens(self._handle, _capi.RequestRef(*request))

    def adopt(self, pages: Sequence[PageHandle], num_tokens: int):
        """A request for pages filled elsewhere (a transfer engine moved another engine's KV
        into them): takes over the caller's reference to each (id, tag) handle (sequence order;
        each live, held by the caller alone, not cached, read-only) for num_tokens tokens;
        returns the request, whose identity may write them. All or nothing: refused (the
        caller keeps its pages) for a wrong page count, a stale, shared, cached or writable
        page, a page listed twice or no free slot. Device fills: DeviceTags.record_fills."""
        pages = [(int(p), int(t)) for p, t in pages]
        ref = _capi.RequestRef()
        _check(_lib.slimserve_request_sets_adopt(self._handle, _pages_array(pages), len(pages), int(num_tokens),
                                                 byref(ref)))
        return (ref.slot, ref.writer)

    def close(self) -> None:
        if getattr(self, "_handle", None):
            _lib.slimserve_request_sets_destroy(self._handle)
            self._handle = None
            if self._cache is not None:
                _dependent_closed(self._cache)
            _dependent_closed(self._pool)

    def __del__(self, _exiting=sys.is_finalizing):
        # At interpreter exit the module's globals may already be gone (None): the process
        # frees everything then, so nothing is destroyed.
        if not _exiting():
            self.close()


class DeviceTags:
    """The device copy of every page's tag; `sync` once per step, before the tag check."""

    def __init__(self, num_pages: int):
        self._handle = c_void_p()
        _check(_lib.slimserve_device_tags_create(num_pages, byref(self._handle)))
        self.num_pages = int(num_pages)

    def sync(self, pool: PagePool, stream=None) -> None:
        _check(_lib.slimserve_device_tags_sync(self._handle, pool._handle, _stream(stream)))

    def _fills_ptr(self) -> int:
        ptr = c_void_p()
        _check(_lib.slimserve_device_tags_fills(self._handle, byref(ptr)))
        return int(ptr.value or 0)

    def record_fills(self, pages: Sequence[PageHandle], num_tokens: int, page_size: int, stream=None) -> None:
        """Records on the device that `pages` (a request's (id, tag) handles in sequence order)
        hold its first num_tokens tokens: page i has min(page_size, num_tokens - i * page_size)
        slots written under its tag. For pages written outside the library's kernels (a
        transfer engine's READ), so a check with check_fill sees their lengths; every other
        page's fill is left as it is. Synchronizes `stream` (the staged words are freed on
        return)."""
        pages = [(int(p), int(t)) for p, t in pages]
        count = len(pages)
        page_size, num_tokens = int(page_size), int(num_tokens)
        if page_size < 1 or not (count - 1) * page_size < num_tokens <= count * page_size:
            raise value_error(f"slimserve: {num_tokens} tokens do not fill {count} pages of {page_size} tokens "
                              "(every page but the last full, the last holding at least one)", "invalid_argument")
        ids = np.array([p for p, _ in pages], np.int64)
        tags = np.array([t for _, t in pages], np.uint64)
        if ids.size and (ids.min() < 1 or ids.max() >= self.num_pages):
            bad = int(ids.min() if ids.min() < 1 else ids.max())
            raise value_error(f"slimserve: pages holds page {bad}; the tags cover pages 1..{self.num_pages - 1}",
                              "out_of_range")
        if np.unique(ids).size != ids.size:
            raise value_error("slimserve: pages lists a page twice")
        filled = np.minimum(page_size, num_tokens - page_size * np.arange(count)).astype(np.uint64)
        words = np.empty(count, np.uint64)
        order = np.argsort(ids, kind="stable")
        words[:] = (filled[order] << np.uint64(32)) | tags[order]
        ids = ids[order]
        base = self._fills_ptr()
        breaks = np.flatnonzero(np.diff(ids) != 1) + 1
        for start, end in zip(np.concatenate(([0], breaks)).tolist(), np.concatenate((breaks, [count])).tolist()):
            _check(_lib.slimserve_memcpy_async(base + 8 * int(ids[start]), words.ctypes.data + 8 * start,
                                               8 * (end - start), 0, _stream(stream)))  # one copy per run of ids
        _check(_lib.slimserve_stream_synchronize(_stream(stream)))

    def read_fills(self, num_pages: int, stream=None) -> np.ndarray:
        """The device-held fill words of pages 0..num_pages - 1 (uint64: written slots << 32 |
        the tag of the generation that wrote them), copied to the host."""
        if not 0 <= int(num_pages) <= self.num_pages:
            raise value_error(f"slimserve: num_pages {num_pages}: the tags cover {self.num_pages} pages", "out_of_range")
        out = np.empty(int(num_pages), np.uint64)
        _check(_lib.slimserve_memcpy_async(out.ctypes.data, self._fills_ptr(), out.nbytes, 1, _stream(stream)))
        _check(_lib.slimserve_stream_synchronize(_stream(stream)))
        return out

    def __del__(self, _destroy=_lib.slimserve_device_tags_destroy):  # bound now: globals go first at exit
        if getattr(self, "_handle", None):
            _destroy(self._handle)
            self._handle = None


class BuiltTable:
    """A batch's page table: `device` for kernels, host copies of indptr/last_page_len/indices
    for planning. It keeps its PageTable (whose arrays it points into) alive, and is valid
    until that PageTable's next build: using a stale one raises SlimserveError
    (failed_precondition) instead of running on the newer table's contents."""

    def __init__(self, host: _capi.PageTableView, device: _capi.PageTableView, owner=None,
                 generation: int = 0):
        self._device = device
        self._owner, self._generation = owner, generation  # the owner's arrays hold `device`
        b = host.batch_size

        def copy(ptr, count, ctype=c_int32, dtype=np.int32):
            if count == 0:
                return np.zeros(0, dtype)
            return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctype)), shape=(count,)).copy()

        self.indptr = copy(host.indptr, b + 1)
        self.last_page_len = copy(host.last_page_len, b)
        self.indices = copy(host.indices, int(self.indptr[-1]))
        self.batch_size = b
        self.page_size = host.page_size

    @property
    def stale(self) -> bool:
        """True once its PageTable was built again: the device arrays hold the newer table."""
        return self._owner is not None and self._owner._generation != self._generation

    @property
    def device(self) -> _capi.PageTableView:
        """The C page-table view over the device arrays; raises SlimserveError
        (failed_precondition) when the table is stale."""
        if self.stale:
            raise SlimserveError("this BuiltTable is stale: its PageTable was built again since, and "
                                 "the device arrays now hold the newer table", "failed_precondition")
        return self._device


class PageTable:
    """Pinned host staging plus device arrays for tables of up to max_batch requests. Each
    build reuses the same arrays, so it invalidates the BuiltTable of the previous build."""

    def __init__(self, max_batch: int, max_entries: int, page_size: int, num_pages: int):
        self._handle = c_void_p()
        self._generation = 0
        self.page_size, self.num_pages = page_size, num_pages
        _check(_lib.slimserve_page_table_create(max_batch, max_entries, page_size, num_pages,
                                                byref(self._handle)))

    def build(self, requests: Iterable[Tuple[Sequence[PageHandle], int]], stream=None) -> BuiltTable:
        """requests: (pages in order, tokens stored in them) per request."""
        requests = list(requests)
        keep = [_pages_array(pages) for pages, _ in requests]
        array = (_capi.RequestPages * max(len(requests), 1))()
        for i, (pages, num_tokens) in enumerate(requests):
            array[i] = _capi.RequestPages(keep[i], len(pages), int(num_tokens))
        host, device = _capi.PageTableView(), _capi.PageTableView()
        _check(_lib.slimserve_page_table_build(self._handle, array, len(requests), _stream(stream),
                                               byref(host), byref(device)))
        self._generation += 1
        return BuiltTable(host, device, self, self._generation)

    def _destroy(self) -> None:
        if getattr(self, "_handle", None):
            _lib.slimserve_page_table_destroy(self._handle)
            self._handle = None

    def __del__(self, _exiting=sys.is_finalizing):
        # At interpreter exit the module's globals may already be gone (None): the process
        # frees everything then, so nothing is destroyed.
        if not _exiting():
            self._destroy()


class RequestStatuses:
    """Device array of per-request verdicts written by the tag check, read by the kernels."""

    def __init__(self, capacity: int):
        if not isinstance(capacity, (int, np.integer)) or capacity < 1:
            raise value_error(f"slimserve: RequestStatuses capacity {capacity!r} (>= 1)")
        self.capacity = capacity
        self.buffer = DeviceArray(np.zeros(2 * capacity, np.int32))

    @property
    def ptr(self):
        return self.buffer.ptr

    def require(self, batch_size: int, what: str) -> None:
        """Raises SlimserveValueError unless these statuses hold a verdict per request of `what`."""
        if batch_size > self.capacity:
            raise value_error(f"slimserve: statuses hold {self.capacity} verdicts, {what} has "
                              f"{batch_size} requests")

    def to_host(self, count: int, stream=None) -> List[Tuple[str, int]]:
        """[(state name, failed slot)] of the first `count` requests (synchronizes)."""
        if not 0 <= count <= self.capacity:
            raise value_error(f"slimserve: to_host({count}) of statuses holding {self.capacity}")
        host = self.buffer.download(np.empty(2 * count, np.int32), stream).reshape(count, 2)
        return [(REQUEST_STATES.get(int(s), str(int(s))), int(slot)) for s, slot in host]


def _statuses_ptr(statuses, batch_size: int, what: str):
    if statuses is None:
        return None
    if not isinstance(statuses, RequestStatuses):
        # A caller-owned int32 [capacity, 2] tensor on the library's device ((state, failed
        # slot) per request, as slimserve_request_status).
        r = _tensor(statuses, name="statuses", dtypes={"int32"}, ndim=2)
        if r.shape[1] != 2 or r.shape[0] < batch_size:
            raise value_error(f"slimserve: statuses has shape {r.shape}; {what} needs [>= {batch_size}, 2]")
        return r.ptr
    statuses.require(batch_size, what)
    return statuses.ptr


def _host_ints(values, name: str, dtype=np.int32, length: Optional[int] = None) -> np.ndarray:
    """A host copy of a 1-D integer array given as a list, NumPy array or CPU tensor."""
    if hasattr(values, "detach"):  # torch: host copies only of CPU tensors (no hidden sync)
        if values.device.type != "cpu":
            raise type_error(f"slimserve: {name} must be a host array here (a CPU tensor or NumPy "
                             f"array), got a {values.device.type} tensor")
        values = values.detach().numpy()
    array = np.asarray(values)
    if array.dtype.kind not in "iu" and array.size:
        raise type_error(f"slimserve: {name} must hold integers, got {array.dtype}")
    if array.ndim != 1:
        raise value_error(f"slimserve: {name} must be 1-D, got shape {array.shape}")
    if length is not None and array.shape[0] != length:
        raise value_error(f"slimserve: {name} has {array.shape[0]} entries, expected {length}")
    info = np.iinfo(dtype)
    if array.size and (array.min() < info.min or array.max() > info.max):
        raise value_error(f"slimserve: {name} has values outside {np.dtype(dtype).name}")
    return np.ascontiguousarray(array, dtype)


def _is_table_age(value) -> bool:
    return (isinstance(value, (tuple, list)) and len(value) == 2 and
            all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) and x >= 0 for x in value))


def table_age_word(age: Tuple[int, int]) -> np.ndarray:
    """The 16 bytes of a table's age as the device compares them (uint64 epoch, uint32 pool
    id, uint32 0): upload it into a persistent DeviceArray each step and pass that array as
    check_page_tags(device_built_at=...)."""
    if not _is_table_age(age):
        raise type_error(f"slimserve: a table age is PagePool.table_age()'s (epoch, pool id), got {age!r}")
    word = np.zeros(2, np.uint64)
    word[0] = int(age[0])
    word[1] = int(age[1])  # the pool id in the low half, then the reserved zero
    return word.view(np.uint8)


def check_page_tags(table: BuiltTable, tags: DeviceTags, statuses: RequestStatuses, *,
                    writers: Optional[Sequence[int]] = None, append_indptr=None, stream=None,
                    check_fill: bool = False, built_at: Optional[Tuple[int, int]] = None,
                    num_entries=None, entry_capacity: int = 0, device_built_at=None) -> None:
    """Compares every page-table entry with the device tags; one verdict per request. With
    `writers` (the requests' identities from RequestSets) and the step's `append_indptr`, also
    checks write ownership: pages a step writes must be the request's own. `check_fill=True`
    also compares each row with the device-held fills (unwritten_slots, append_not_next; only
    when every kernel that writes pages records them). `built_at` (PagePool.table_age() when
    the table was built) refuses a table newer than the last sync (SlimserveError,
    failed_precondition, nothing launched).

    Bounded rows: `num_entries` (the entries built for this table: an int, uploaded for this
    call, or a DeviceArray holding one int32 that the engine rewrites each step) and
    `entry_capacity` (the length of the indices buffer; 0: not bounded by it) refuse a request
    whose indptr range leaves them (bad_page_table), so a corrupted indptr cannot reach
    entries an earlier, larger table left in the buffer.

    `device_built_at`: the table's age compared on the device with the age of the last sync
    (every request tags_not_synced when the table is newer, or of another pool), for replays
    of captured steps: PagePool.table_age()'s (epoch, pool id), uploaded for this call, or a
    DeviceArray of at least 16 bytes holding table_age_word(...)."""
    _statuses_ptr(statuses, table.batch_size, "the table")
    device = table.device
    if built_at is not None and not _is_table_age(built_at):
        raise type_error(f"slimserve: built_at must be PagePool.table_age()'s (epoch, pool id), got {built_at!r}")
    if num_entries is not None and not isinstance(num_entries, DeviceArray) and (
            not isinstance(num_entries, (int, np.integer)) or isinstance(num_entries, bool) or num_entries < 0):
        raise type_error(f"slimserve: num_entries must be an entry count >= 0 or a DeviceArray of one "
                         f"int32, got {num_entries!r}")
    if isinstance(num_entries, DeviceArray) and num_entries.nbytes < 4:
        raise value_error(f"slimserve: num_entries: a DeviceArray of {num_entries.nbytes} bytes, need 4")
    if not isinstance(entry_capacity, (int, np.integer)) or isinstance(entry_capacity, bool) or entry_capacity < 0:
        raise type_error(f"slimserve: entry_capacity must be an int >= 0 (0: unbounded), got {entry_capacity!r}")
    if device_built_at is not None and not isinstance(device_built_at, DeviceArray) and not _is_table_age(device_built_at):
        raise type_error(f"slimserve: device_built_at must be PagePool.table_age()'s (epoch, pool id) or a "
                         f"DeviceArray holding table_age_word(...), got {device_built_at!r}")
    if isinstance(device_built_at, DeviceArray) and device_built_at.nbytes < 16:
        raise value_error(f"slimserve: device_built_at: a DeviceArray of {device_built_at.nbytes} bytes, need 16")
    bounded = num_entries is not None or entry_capacity != 0 or device_built_at is not None
    if check_fill or built_at is not None or bounded:
        keep = [DeviceArray(_host_ints(writers, "writers", np.uint32, table.batch_size), stream)
                if writers is not None else None,
                DeviceArray(_host_ints(append_indptr, "append_indptr", np.int32, table.batch_size + 1), stream)
                if append_indptr is not None else None]
        if num_entries is not None and not isinstance(num_entries, DeviceArray):
            num_entries = DeviceArray(np.array([num_entries], np.int32), stream)
        if device_built_at is not None and not isinstance(device_built_at, DeviceArray):
            device_built_at = DeviceArray(table_age_word(device_built_at), stream)
        args = _capi.versioned(_capi.TagCheckArgs)
        args.table = ctypes.pointer(device)
        args.tags = tags._handle
        args.writers = keep[0].ptr if keep[0] else None
        args.append_indptr = keep[1].ptr if keep[1] else None
        args.statuses = statuses.ptr
        args.check_fill = 1 if check_fill else 0
        if built_at is not None:
            args.built_at_epoch, args.built_at_pool = int(built_at[0]), int(built_at[1])
        args.num_entries = num_entries.ptr if num_entries is not None else None
        args.entry_capacity = int(entry_capacity)
        args.device_built_at = device_built_at.ptr if device_built_at is not None else None
        _check(_lib.slimserve_check_page_tags_with(byref(args), _stream(stream)))
        _check(_lib.slimserve_stream_synchronize(_stream(stream)))  # the uploads are freed on return
        return
    if writers is None and append_indptr is None:
        _check(_lib.slimserve_check_page_tags(byref(device), tags._handle, statuses.ptr, None,
                                              _stream(stream)))
        return
    keep = [DeviceArray(_host_ints(writers, "writers", np.uint32, table.batch_size), stream)
            if writers is not None else None,
            DeviceArray(_host_ints(append_indptr, "append_indptr", np.int32, table.batch_size + 1), stream)
            if append_indptr is not None else None]
    _check(_lib.slimserve_check_page_tags_owned(byref(device), tags._handle,
                                                keep[0].ptr if keep[0] else None,
                                                keep[1].ptr if keep[1] else None,
                                                statuses.ptr, None, _stream(stream)))
    _check(_lib.slimserve_stream_synchronize(_stream(stream)))  # the uploads are freed on return


# ---- KV cache, append, decode ------------------------------------------------------------------

def _activation(x, name: str, dtype: Optional[str]) -> int:
    r = x if isinstance(x, _TensorRefTypes) else _tensor(x, name=name)
    name_of = _dtype_name(dtype) or r.dtype
    if name_of not in ACTIVATION_DTYPES:
        raise type_error(f"slimserve: {name} has dtype {r.dtype}; activations are bfloat16 or float16 "
                         "(pass dtype='bfloat16' for BF16 bits in uint16 arrays)")
    code = ACTIVATION_DTYPES[name_of]
    if r.dtype not in ({"bfloat16", "uint16"} if code == 0 else {"float16"}):
        raise type_error(f"slimserve: {name} has dtype {r.dtype}, which cannot hold {name_of} values")
    return code


from ._dlpack import TensorRef as _DLTensorRef  # noqa: E402
_TensorRefTypes = (_DLTensorRef,)


_constant_scales: dict = {}  # float value -> DeviceArray holding it (per-tensor scales given as floats)


class PagedKVCache:
    """K and V page arrays, [num_pages, page_size, H, D] (NHD) or [num_pages, H, page_size, D]
    (HND), with their element type and scales.

    dtype: None/"auto" (the tensors' own dtype), or any name of KV_DTYPES ("fp8" is e4m3, as in
    vLLM); FP8 pages are uint8 tensors plus dtype, or torch.float8_e4m3fn / float8_e5m2
    tensors. A tensor whose element size contradicts the dtype is refused. NVFP4 pages are
    uint8 tensors whose last extent is a head vector's bytes (9 * D / 16: D/2 bytes of E2M1
    codes, then D/16 E4M3 block scales), packed, with a per-tensor k_scale / v_scale.
    Scales (FP8, NVFP4): k_scale / v_scale, a positive finite float (uploaded once) or a one-element
    float32 tensor on the library's device (read by the kernels at run time, so a captured
    graph sees the current value; on host memory its value is checked here); or per-token
    scale arrays k_token_scales / v_token_scales shaped like the pages without head_dim.
    One combined allocation [num_pages, 2, ...] (K page, then V page) is passed as k_pages
    with v_pages=None; K and V views of a larger allocation whose pages are further apart
    (vLLM's kv_cache[:, 0] and kv_cache[:, 1]) are accepted too. `page_stride` is then the
    distance between pages in elements of the tensors (bytes for nvfp4): paged attention and
    append read it; DecodeWrapper and copy_pages (packed pages only) refuse such a cache."""

    def __init__(self, k_pages, v_pages, *, layout: str = "NHD", dtype=None,
                 k_scale=None, v_scale=None, k_token_scales=None, v_token_scales=None):
        if layout not in LAYOUTS:
            raise value_error(f"slimserve: layout {layout!r} (NHD or HND)")
        self.page_stride = 0  # elements between pages; 0: packed
        if v_pages is None:
            kv = _tensor(k_pages, name="kv_pages")
            if len(kv.shape) != 5 or kv.shape[1] != 2:
                raise value_error(f"slimserve: combined kv_pages {kv.shape} must be [num_pages, 2, ...] (5-D)")
            dtype = kv_dtype_name(dtype, kv.dtype, "dtype")
            self._check_tensor_dtype(kv, dtype, "kv_pages")
            page = kv.shape[2] * kv.shape[3] * kv.shape[4]  # storage elements (bytes for nvfp4)
            element = 2 if _kv_formats.KV_BITS[KV_DTYPES[dtype]] == 16 else 1
            k = _TensorShape(kv.ptr, (kv.shape[0],) + kv.shape[2:], kv.dtype)
            v = _TensorShape(kv.ptr + page * element, k.shape, kv.dtype)
            self.page_stride = 2 * page
        else:
            k, v = self._pages(k_pages, "k_pages"), self._pages(v_pages, "v_pages")
            if k.shape != v.shape or len(k.shape) != 4:
                raise value_error(f"slimserve: k_pages {k.shape} and v_pages {v.shape} must be equal 4-D shapes")
            if k.dtype != v.dtype:
                raise type_error(f"slimserve: k_pages ({k.dtype}) and v_pages ({v.dtype}) differ in dtype")
            k_stride, v_stride = self._page_stride(k, "k_pages"), self._page_stride(v, "v_pages")
            if k_stride != v_stride:
                raise value_error(f"slimserve: k_pages and v_pages have different page strides "
                                  f"({k_stride} and {v_stride} elements)")
            dtype = kv_dtype_name(dtype, k.dtype, "dtype")
            self._check_tensor_dtype(k, dtype, "k_pages")
            page = k.shape[1] * k.shape[2] * k.shape[3]
            self.page_stride = 0 if k_stride == page else k_stride
            # As the C view requires: every page starts as aligned as the first (whole 16-byte
            # steps; storage elements are bytes for NVFP4).
            element = 2 if _kv_formats.KV_BITS[KV_DTYPES[dtype]] == 16 else 1
            if self.page_stride * element % 16:
                raise value_error(f"slimserve: k_pages page stride {k_stride} elements ({k_stride * element} "
                                  f"bytes) must be a multiple of 16 bytes")
        num_pages, a, b, head_dim = k.shape
        if min(k.shape) <= 0:
            raise value_error(f"slimserve: KV pages of shape {k.shape} (every extent must be > 0)")
        head_dim = _head_dim_of(dtype, head_dim)
        page_size, heads = (a, b) if layout == "NHD" else (b, a)
        if page_size not in SUPPORTED_PAGE_SIZES:
            nearest = min(SUPPORTED_PAGE_SIZES, key=lambda size: abs(size - page_size))
            raise SlimserveValueError(
                f"slimserve: page_size {page_size} is not supported: the kernels take 16, 32, 64 or 128 (a page "
                f"is a power-of-two tile of at least one 16-token MMA tile); nearest supported: {nearest}. A "
                "token-granular pool (page_size 1) maps slot s to page s // 16, offset s % 16", "unsupported")
        self._keep = [k_pages, v_pages]
        self.view = _capi.KvCache()
        self.view.k_pages, self.view.v_pages = k.ptr, v.ptr
        self.view.num_pages, self.view.page_size = num_pages, page_size
        self.view.num_kv_heads, self.view.head_dim = heads, head_dim
        self.view.dtype, self.view.layout = KV_DTYPES[dtype], LAYOUTS[layout]
        fp8 = dtype.startswith("fp8")
        scaled = _kv_formats.KV_BITS[KV_DTYPES[dtype]] < 16  # FP8 and NVFP4 must say where their scales are
        if k_token_scales is not None or v_token_scales is not None:
            if not fp8:
                raise value_error(f"slimserve: per-token scales are for FP8 caches, this one is {dtype}")
            if k_scale is not None or v_scale is not None:
                raise value_error("slimserve: give per-tensor scales (k_scale, v_scale) or per-token "
                                  "scales (k_token_scales, v_token_scales), not both")
            shape = (num_pages, page_size, heads) if layout == "NHD" else (num_pages, heads, page_size)
            self.view.scale_mode = 2
            self.view.k_token_scales = self._pointer(k_token_scales, "k_token_scales", shape)
            self.view.v_token_scales = self._pointer(v_token_scales, "v_token_scales", shape)
        elif k_scale is not None or v_scale is not None:
            self.view.scale_mode = 1
            self.view.k_scale = self._scale(k_scale, "k_scale", dtype)
            self.view.v_scale = self._scale(v_scale, "v_scale", dtype)
        elif scaled:
            raise type_error(f"slimserve: an {dtype} cache needs its scales: k_scale and v_scale "
                             "(per tensor)" + (" or k_token_scales and v_token_scales" if fp8 else ""))
        self.dtype, self.layout = dtype, layout

    @staticmethod
    def _pages(tensor, name):
        return _tensor(tensor, name=name, strided=True)

    @staticmethod
    def _page_stride(r, name) -> int:
        """Elements between pages of a [num_pages, a, b, head_dim] tensor whose pages are
        compact (any distance of at least a page between them)."""
        if len(r.shape) != 4:
            raise value_error(f"slimserve: {name} must be 4-D [num_pages, ...], got shape {r.shape}")
        page = r.shape[1] * r.shape[2] * r.shape[3]
        if r.strides is None or r.shape[0] == 1:
            return page
        inner = (r.shape[2] * r.shape[3], r.shape[3], 1)
        if any(st != want for st, want, n in zip(r.strides[1:], inner, r.shape[1:]) if n > 1):
            raise value_error(f"slimserve: {name} has strides {r.strides}: each page must be compact "
                              f"(inner strides {inner}); only the page stride may differ")
        if r.strides[0] < page:
            raise value_error(f"slimserve: {name} page stride {r.strides[0]} must be at least one page "
                              f"({page} elements)")
        return r.strides[0]

    @staticmethod
    def _check_tensor_dtype(r, dtype: str, name: str) -> None:
        allowed = _KV_TENSOR_DTYPES[KV_DTYPES[dtype]]
        if r.dtype not in allowed:
            raise type_error(f"slimserve: {name} has dtype {r.dtype}, which cannot hold {dtype} pages "
                             f"(expected one of {sorted(allowed)})")

    def _pointer(self, tensor, name, shape=None):
        r = _tensor(tensor, name=name, dtypes={"float32"}, shape=shape)
        self._keep.append(tensor)
        return r.ptr

    def _scale(self, value, name, kv_dtype):
        if value is None:
            raise type_error(f"slimserve: {name} is required with per-tensor scales")
        if isinstance(value, (int, float, np.floating, np.integer)) and not isinstance(value, bool):
            # A calibrated constant: one device float, uploaded once per value and kept (so a
            # cache made per call allocates nothing after the first).
            value = _check_scale_value(value, name, kv_dtype)
            device = _constant_scales.get(value)
            if device is None:
                device = _constant_scales[value] = DeviceArray(np.array([value], np.float32))
            self._keep.append(device)
            return device.ptr.value
        r = _tensor(value, name=name, dtypes={"float32"})
        if r.numel != 1:
            raise value_error(f"slimserve: {name} must hold one float, got shape {r.shape}")
        if EMULATED or r.device_type in (1, 3):  # host memory: the value can be read without a sync
            _check_scale_value(ctypes.c_float.from_address(r.ptr).value, name, kv_dtype)
        self._keep.append(value)
        return r.ptr

    @property
    def num_pages(self) -> int:
        """Pages in the cache (K and V each)."""
        return self.view.num_pages

    def require_packed(self, what: str) -> None:
        """Raises SlimserveValueError (unsupported) when `what` cannot read this cache's pages
        because they are further apart than their size (a combined K/V allocation)."""
        if self.page_stride != 0:
            raise SlimserveValueError(
                f"slimserve: {what} takes packed K and V page arrays; this cache's pages are "
                f"{self.page_stride} elements apart (a combined or strided allocation): use "
                "PagedAttentionWrapper, which reads it in place", "unsupported")

    def check_rows(self, k, v, name_k: str = "k", name_v: str = "v", *, strided: bool = False):
        """Refs of new K/V rows [num_tokens, num_kv_heads, head_dim] for this cache. strided:
        the rows may also be views whose tokens are further apart than a row (the K and V
        slices of a fused QKV output, heads contiguous inside a row): see _row_stride."""
        heads, head_dim = self.view.num_kv_heads, self.view.head_dim
        kr = _tensor(k, name=name_k, ndim=3, strided=strided)
        if kr.shape[1:] != (heads, head_dim):
            raise value_error(f"slimserve: {name_k} has shape {kr.shape}; this cache needs "
                              f"[num_tokens, {heads}, {head_dim}]")
        vr = _tensor(v, name=name_v, shape=kr.shape, strided=strided)
        if vr.dtype != kr.dtype:
            raise type_error(f"slimserve: {name_k} ({kr.dtype}) and {name_v} ({vr.dtype}) differ in dtype")
        return kr, vr


def _row_stride(r, name: str) -> int:
    """Elements between consecutive tokens' rows of a [num_tokens, heads, head_dim] ref, 0 when
    packed. Heads must be contiguous inside a row (strides (s, head_dim, 1)), and s a multiple
    of 8 elements (the append's 16-byte loads) of at least one row (rows never overlap)."""
    if r.strides is None:
        return 0
    tokens, heads, head_dim = r.shape
    row = heads * head_dim
    s0, s1, s2 = r.strides
    if (head_dim > 1 and s2 != 1) or (heads > 1 and s1 != head_dim):
        raise value_error(f"slimserve: {name} has strides {r.strides}: the heads of a token's row must be "
                          f"contiguous (strides (row_stride, {head_dim}, 1))")
    if tokens <= 1:
        return 0  # one row: its stride is never used
    if s0 < row or s0 % 8:
        raise value_error(f"slimserve: {name} has row stride {s0} elements; it must be a multiple of 8 "
                          f"(16-byte loads) of at least one row ({heads} x {head_dim} = {row})")
    return s0


def _rotation(rotation, head_dim: int) -> int:
    """The C value of an append's `rotation` ("none", "keys", "keys_and_values"), refused by
    name when unknown or when the cache's head_dim has no rotation."""
    if not isinstance(rotation, str) or rotation not in ROTATIONS:
        raise value_error(f"slimserve: rotation must be one of {', '.join(map(repr, ROTATIONS))}, got {rotation!r}")
    if rotation != "none" and head_dim not in ROTATION_HEAD_DIMS:
        raise SlimserveValueError(f"slimserve: rotation {rotation!r} needs head_dim 64, 128 or 256; this cache has "
                                  f"{head_dim}", "unsupported")
    return ROTATIONS[rotation]


def _kv_append(cache: PagedKVCache, kr, vr, input_dtype: int, *, table=None, statuses=None,
               token_request=None, token_position=None, append_indptr=None, slot_mapping=None,
               stream=None, names=("k", "v"), rotation: str = "none") -> None:
    rotation_value = _rotation(rotation, cache.view.head_dim)
    args = _capi.versioned(_capi.KvAppendArgs)
    args.cache = cache.view
    args.kv_page_stride = cache.page_stride
    if table is not None:
        args.table = ctypes.pointer(table)
    args.statuses = statuses
    args.k_new, args.v_new = kr.ptr, vr.ptr
    args.k_row_stride = _row_stride(kr, names[0])
    args.v_row_stride = _row_stride(vr, names[1])
    args.input_dtype = input_dtype
    args.num_tokens = kr.shape[0]
    args.token_request, args.token_position = token_request, token_position
    args.append_indptr, args.slot_mapping = append_indptr, slot_mapping
    args.rotation = rotation_value
    _check(_lib.slimserve_kv_append(byref(args), _stream(stream)))


def rotate_heads(x, out=None, *, dtype: Optional[str] = None, stream=None):
    """Rotates each head vector of x [num_tokens, num_heads, head_dim] (bfloat16 or float16,
    head_dim 64, 128 or 256) by the normalized Walsh-Hadamard transform H / sqrt(head_dim),
    its own inverse: queries before they attend to a cache appended with rotation="keys" or
    "keys_and_values", and, for "keys_and_values", the attention output afterwards. out: a
    tensor of x's shape and dtype that does not overlap x, or None (in place: x is
    overwritten). x and out may be row-strided views (a Q slice of a fused QKV output: heads
    contiguous inside a token's row, rows a multiple of 8 elements apart). Launches on
    `stream`; allocates and synchronizes nothing. Returns out (x when in place)."""
    xr = _tensor(x, name="x", ndim=3, strided=True)
    tokens, heads, head_dim = xr.shape
    if head_dim not in ROTATION_HEAD_DIMS:
        raise SlimserveValueError(f"slimserve: x has head_dim {head_dim}; rotate_heads takes 64, 128 or 256 "
                                  f"(shape {xr.shape})", "unsupported")
    code = _activation(xr, "x", dtype)
    if out is None:
        if isinstance(x, np.ndarray) and not x.flags.writeable:
            raise value_error("slimserve: x is read-only; pass out= to rotate into another array")
        out, orr = x, xr
    else:
        orr = _tensor(out, name="out", shape=xr.shape, strided=True)
        if orr.dtype != xr.dtype:
            raise type_error(f"slimserve: out has dtype {orr.dtype}; x has {xr.dtype}")
    args = _capi.versioned(_capi.RotateHeadsArgs)
    args.input, args.output = xr.ptr, orr.ptr
    args.dtype = code
    args.num_tokens, args.num_heads, args.head_dim = tokens, heads, head_dim
    args.input_row_stride = _row_stride(xr, "x")
    args.output_row_stride = _row_stride(orr, "out")
    _check(_lib.slimserve_rotate_heads(byref(args), _stream(stream)))
    return out


def _device_ints(value, name: str, length: int, dtype, keep: list, stream):
    """A device int array: a tensor on the library's device is used in place (no copy, no
    sync); a host list / array is uploaded (into `keep`)."""
    dtype_name = np.dtype(dtype).name
    if hasattr(value, "__dlpack__") and not isinstance(value, (list, tuple)):
        r = _tensor(value, name=name, dtypes={dtype_name}, shape=(length,))
        return r.ptr
    host = _host_ints(value, name, dtype, length)
    device = DeviceArray(host, stream)
    keep.append(device)
    return device.ptr.value


def append_kv(cache: PagedKVCache, table: BuiltTable, k, v, *, token_request=None,
              token_position=None, append_indptr=None, statuses: Optional[RequestStatuses] = None,
              dtype: Optional[str] = None, rotation: str = "none", stream=None) -> None:
    """Quantize-and-append new K/V rows [num_tokens, H, D] into the pages the table gives them:
    token_request + token_position ([num_tokens] each), or append_indptr ([batch + 1]: request
    b's rows fill its last slots). Index arrays: int32 tensors on the library's device (used
    in place) or host arrays (uploaded, then the call synchronizes before freeing them).
    rotation: "none", "keys" or "keys_and_values" (head_dim 64, 128, 256): those head vectors
    are stored Walsh-Hadamard rotated (see rotate_heads)."""
    if not isinstance(cache, PagedKVCache):
        raise type_error(f"slimserve: cache must be a PagedKVCache, got {type(cache).__name__}")
    if not isinstance(table, BuiltTable):
        raise type_error(f"slimserve: table must be a BuiltTable, got {type(table).__name__}")
    device = table.device
    if table.page_size != cache.view.page_size:
        raise value_error(f"slimserve: the table's page_size {table.page_size} is not the cache's "
                          f"{cache.view.page_size}")
    if table.indices.size and (table.indices.min() < 0 or table.indices.max() >= cache.num_pages):
        raise value_error(f"slimserve: the table holds page ids up to {int(table.indices.max())}; the "
                          f"cache has {cache.num_pages} pages", "out_of_range")
    kr, vr = cache.check_rows(k, v)
    input_dtype = _activation(kr, "k", dtype)
    _rotation(rotation, cache.view.head_dim)
    n, batch = kr.shape[0], table.batch_size
    if (token_request is None) != (token_position is None) or \
            (token_request is None) == (append_indptr is None):
        raise value_error("slimserve: give token_request and token_position, or append_indptr")
    keep: list = []
    pointers = {}
    if append_indptr is not None:
        pointers["append_indptr"] = _device_ints(append_indptr, "append_indptr", batch + 1, np.int32, keep, stream)
    else:
        pointers["token_request"] = _device_ints(token_request, "token_request", n, np.int32, keep, stream)
        pointers["token_position"] = _device_ints(token_position, "token_position", n, np.int32, keep, stream)
    _kv_append(cache, kr, vr, input_dtype, table=device, statuses=_statuses_ptr(statuses, batch, "the table"),
               stream=stream, rotation=rotation, **pointers)
    if keep:
        _check(_lib.slimserve_stream_synchronize(_stream(stream)))  # the uploads above are freed next


def reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype="auto",
                      k_scale=None, v_scale=None, *, layout: str = "NHD", dtype: Optional[str] = None,
                      rotation: str = "none", stream=None) -> None:
    """vLLM-style append: token t goes to flat slot slot_mapping[t] = page * page_size + offset
    of the caches ([num_pages, page_size, H, D] NHD or [num_pages, H, page_size, D] HND, or the
    K/V views of one combined allocation); slot -1 skips the token. slot_mapping: an int64
    tensor on the library's device, read there (no copy, no synchronization: capturable).
    kv_cache_dtype: "auto" (the caches' dtype), "fp8" / "fp8_e4m3" / "fp8_e5m2" or a torch
    dtype; k_scale / v_scale: floats or one-element float32 tensors. value_cache None: key_cache
    is the combined [num_pages, 2, ...] allocation. key / value may be strided views (the K
    and V slices of a fused QKV output: tokens' rows a multiple of 8 elements apart, heads
    contiguous inside a row), read in place. rotation: as append_kv's."""
    cache = PagedKVCache(key_cache, value_cache, layout=layout, dtype=kv_cache_dtype,
                         k_scale=k_scale, v_scale=v_scale)
    kr, vr = cache.check_rows(key, value, "key", "value", strided=True)
    slots = _tensor(slot_mapping, name="slot_mapping", dtypes={"int64"}, shape=(kr.shape[0],))
    _kv_append(cache, kr, vr, _activation(kr, "key", dtype), slot_mapping=slots.ptr, stream=stream,
               names=("key", "value"), rotation=rotation)


def copy_pages(cache: PagedKVCache, tags: DeviceTags, copies: Sequence[dict], stream=None) -> List[Tuple[str, int]]:
    """Copy-on-write / defragmentation copies inside one cache, each checked on the device:
    copies are dicts {src, dst (page handles), writer, tokens}. Returns each copy's verdict."""
    cache.require_packed("copy_pages")
    array = (_capi.PageCopy * max(len(copies), 1))()
    for i, c in enumerate(copies):
        array[i] = _capi.PageCopy(c["src"][0], c["src"][1], c["dst"][0], c["dst"][1], c["writer"], c["tokens"])
    _check(_lib.slimserve_check_page_copies(byref(cache.view), array, len(copies)))
    device = DeviceArray(np.frombuffer(bytes(array), np.uint8)[: len(copies) * ctypes.sizeof(_capi.PageCopy)], stream)
    statuses = RequestStatuses(max(len(copies), 1))
    _check(_lib.slimserve_copy_pages(byref(cache.view), tags._handle, device.ptr, len(copies),
                                     statuses.ptr, _stream(stream)))
    return statuses.to_host(len(copies), stream)



# ---- Records that leave the cache: swap slots and export buffers, with their identity ----------

class RecordIdentity(NamedTuple):
    """Whose a record is, in every swap slot's and export record's header: the pool it left
    (PagePool.table_age()'s pool id), the request identity that wrote it (the swap-out or
    export mover) and the engine's number for this record set (e.g. the request's preemption
    count, so that a stale record of the same request is refused too)."""
    pool: int
    writer: int
    sequence: int = 0


def _identity(value, name: str) -> "_capi.RecordIdentity":
    if not isinstance(value, tuple) or len(value) != 3 or not all(
            isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in value):
        raise type_error(f"slimserve: {name} must be a RecordIdentity(pool, writer, sequence), got {value!r}")
    if not all(0 <= int(x) <= 0xFFFFFFFF for x in value):
        raise value_error(f"slimserve: {name} {tuple(value)} has a field outside uint32")
    return _capi.RecordIdentity(int(value[0]), int(value[1]), int(value[2]))


def swap_slot_bytes(cache: PagedKVCache) -> int:
    """Bytes of one swap slot (and of one export record): a 32-byte identity header and the
    page's K, V and per-token scale bytes."""
    return int(_lib.slimserve_page_record_bytes(byref(cache.view)))


def export_buffer_bytes(cache: PagedKVCache, num_pages: int) -> int:
    """Bytes an export of `num_pages` pages needs (a 64-byte header, then the records)."""
    return int(_lib.slimserve_export_buffer_bytes(byref(cache.view), int(num_pages)))


class HostSlots:
    """Pinned host memory of `slots` swap slots of `cache`'s size, for swap_pages. `array` is
    a NumPy view [slots, slot_bytes] of it (valid while this object lives)."""

    def __init__(self, cache: PagedKVCache, slots: int):
        if not isinstance(slots, (int, np.integer)) or slots < 1:
            raise value_error(f"slimserve: HostSlots slots {slots!r} (>= 1)")
        self.slots, self.slot_bytes = int(slots), swap_slot_bytes(cache)
        self.ptr = c_void_p()
        _check(_lib.slimserve_host_alloc(self.slots * self.slot_bytes, byref(self.ptr)))
        self.array = np.ctypeslib.as_array(ctypes.cast(self.ptr, ctypes.POINTER(ctypes.c_uint8)),
                                           shape=(self.slots, self.slot_bytes))

    def __del__(self, _free=_lib.slimserve_host_free):  # bound now: module globals go first at exit
        if getattr(self, "ptr", None) is not None and self.ptr.value:
            self.array = None
            _free(self.ptr)
            self.ptr = None


SWAP_DIRECTIONS = {"out": 0, "in": 1}


def swap_pages(cache: PagedKVCache, tags: DeviceTags, slots: HostSlots, swaps: Sequence[dict],
               direction: str, *, identities=None, stream=None) -> List[Tuple[str, int]]:
    """Moves pages between the cache and pinned host slots (preemption, offload), each checked
    on the device: swaps are dicts {page (handle), writer (the mover), slot}; direction "out"
    (cache to slots) or "in". Returns each swap's verdict.

    identities: one RecordIdentity for every swap, or a list of one per swap. Swap-out writes
    it into the slot's header; swap-in refuses a slot whose header says otherwise
    (record_mismatch: another request's slot, a stale one or a corrupted one; the page keeps
    every byte). None: RecordIdentity(the synced pool, the swap's writer, 0), so only the
    identity that swapped a record out can swap it back in (a request resumed under a new
    identity passes the one it swapped out with)."""
    if direction not in SWAP_DIRECTIONS:
        raise value_error(f"slimserve: swap direction {direction!r} (\"out\" or \"in\")")
    if not isinstance(slots, HostSlots):
        raise type_error(f"slimserve: slots must be HostSlots, got {type(slots).__name__}")
    code = SWAP_DIRECTIONS[direction]
    array = (_capi.PageSwap * max(len(swaps), 1))()
    for i, w in enumerate(swaps):
        array[i] = _capi.PageSwap(int(w["page"][0]), int(w["page"][1]), int(w["writer"]), int(w["slot"]))
    _check(_lib.slimserve_check_page_swaps(byref(cache.view), array, len(swaps), code, slots.slots))
    count = len(swaps)
    device = DeviceArray(np.frombuffer(bytes(array), np.uint8)[: count * ctypes.sizeof(_capi.PageSwap)], stream)
    keep = None
    if identities is not None:
        if isinstance(identities, tuple) and len(identities) == 3 and not isinstance(identities[0], tuple):
            identities = [identities] * count
        identities = list(identities)
        if len(identities) != count:
            raise value_error(f"slimserve: identities has {len(identities)} entries for {count} swaps")
        ids = (_capi.RecordIdentity * max(count, 1))(*[_identity(x, f"identities[{i}]")
                                                       for i, x in enumerate(identities)])
        keep = DeviceArray(np.frombuffer(bytes(ids), np.uint8)[: count * ctypes.sizeof(_capi.RecordIdentity)], stream)
    statuses = RequestStatuses(max(count, 1))
    args = _capi.versioned(_capi.SwapArgs)
    args.cache = cache.view
    args.tags = tags._handle
    args.host_records = slots.ptr
    args.host_slots = slots.slots
    args.swaps = device.ptr
    args.num_swaps = count
    args.direction = code
    args.statuses = statuses.ptr
    args.identities = keep.ptr if keep is not None else None
    _check(_lib.slimserve_swap_pages_with(byref(args), _stream(stream)))
    return statuses.to_host(count, stream)


def _request_view(pages: Sequence[PageHandle], num_tokens: int, writer: int, stream):
    ids = DeviceArray(_host_ints([p[0] for p in pages], "pages", np.int32), stream)
    page_tags = DeviceArray(_host_ints([p[1] for p in pages], "pages", np.uint32), stream)
    view = _capi.RequestPagesView(ids.ptr, page_tags.ptr, len(pages), int(num_tokens), int(writer))
    return view, (ids, page_tags)


def _buffer(buffer, name: str):
    if isinstance(buffer, DeviceArray):
        return buffer.ptr.value, buffer.nbytes
    r = _tensor(buffer, name=name, dtypes={"uint8"}, ndim=1)
    return r.ptr, r.shape[0]


def export_request(cache: PagedKVCache, tags: DeviceTags, pages: Sequence[PageHandle], num_tokens: int,
                   writer: int, buffer, *, identity: Optional[RecordIdentity] = None,
                   stream=None) -> Tuple[str, int]:
    """Writes one request's pages (page handles in order, [num_pages] (id, tag); read by
    `writer`, each checked on the device) into `buffer` (a DeviceArray or a uint8 tensor
    [>= export_buffer_bytes]): a self-describing header, then one record per page. Returns the
    verdict.

    identity: the RecordIdentity written into the header and every record (what the
    transfer's metadata should carry to the importer). None: RecordIdentity(the synced pool,
    writer, 0)."""
    view, keep = _request_view(pages, num_tokens, writer, stream)
    ptr, nbytes = _buffer(buffer, "buffer")
    statuses = RequestStatuses(1)
    args = _capi.versioned(_capi.ExportArgs)
    args.cache = cache.view
    args.tags = tags._handle
    args.request = view
    args.buffer, args.buffer_bytes = ptr, nbytes
    args.status = statuses.ptr
    if identity is not None:
        args.identity = _identity(identity, "identity")
    _check(_lib.slimserve_export_request_with(byref(args), _stream(stream)))
    return statuses.to_host(1, stream)[0]


def buffer_header(buffer, stream=None) -> bytes:
    """A host copy of an export buffer's first 64 bytes (what import_request and
    read_buffer_identity read; synchronizes)."""
    ptr, nbytes = _buffer(buffer, "buffer")
    if nbytes < 64:
        raise value_error(f"slimserve: buffer has {nbytes} bytes, an export header 64")
    out = np.empty(64, np.uint8)
    _check(_lib.slimserve_memcpy_async(out.ctypes.data, ptr, 64, 1, _stream(stream)))
    _check(_lib.slimserve_stream_synchronize(_stream(stream)))
    return out.tobytes()


def read_buffer_identity(header: bytes) -> RecordIdentity:
    """The exporter's RecordIdentity an export buffer's header (buffer_header) claims: for
    the sending side's transfer metadata and for messages. An importer expects what its own
    metadata says, not this claim."""
    if not isinstance(header, (bytes, bytearray)):
        raise type_error(f"slimserve: header must be bytes (buffer_header), got {type(header).__name__}")
    out = _capi.RecordIdentity()
    copy = ctypes.create_string_buffer(bytes(header), len(header))
    _check(_lib.slimserve_read_buffer_identity(copy, len(header), byref(out)))
    return RecordIdentity(out.pool, out.writer, out.sequence)


def import_request(cache: PagedKVCache, tags: DeviceTags, pages: Sequence[PageHandle], num_tokens: int,
                   writer: int, buffer, *, expected: RecordIdentity, header: Optional[bytes] = None,
                   stream=None) -> Tuple[str, int]:
    """Imports an export buffer into a request's pages (page handles in order, [num_pages]
    (id, tag), writable by `writer`). Returns the verdict.

    expected: the exporter's RecordIdentity as the transfer's own metadata says (not the
    buffer's claim): every record must carry it, its page index, its token count and a
    matching checksum, else the request is refused (record_mismatch) and no page is written.
    header: the buffer's first 64 bytes if the caller has them (else they are copied here);
    an incompatible shape raises SlimserveError before any launch."""
    ptr, nbytes = _buffer(buffer, "buffer")
    if header is None:
        header = buffer_header(buffer, stream)
    if not isinstance(header, (bytes, bytearray)):
        raise type_error(f"slimserve: header must be bytes (buffer_header), got {type(header).__name__}")
    expected_c = _identity(expected, "expected")
    if expected_c.writer == 0:
        raise value_error("slimserve: expected.writer is 0: expected names whose export this must be")
    view, keep = _request_view(pages, num_tokens, writer, stream)
    header_copy = ctypes.create_string_buffer(bytes(header), len(header))
    statuses = RequestStatuses(1)
    args = _capi.versioned(_capi.ImportArgs)
    args.cache = cache.view
    args.tags = tags._handle
    args.request = view
    args.buffer, args.buffer_bytes = ptr, nbytes
    args.header, args.header_bytes = ctypes.addressof(header_copy), len(header)
    args.status = statuses.ptr
    args.expected = expected_c
    _check(_lib.slimserve_import_request_with(byref(args), _stream(stream)))
    return statuses.to_host(1, stream)[0]

def _check_csr(indptr: np.ndarray, indices: np.ndarray, last: np.ndarray, page_size: int) -> None:
    batch = last.shape[0]
    if indptr.shape[0] != batch + 1:
        raise value_error(f"slimserve: indptr has {indptr.shape[0]} entries, last_page_len {batch}: "
                          "indptr needs batch_size + 1")
    if indptr[0] != 0 or np.any(np.diff(indptr) < 0):
        raise value_error("slimserve: indptr must start at 0 and never decrease")
    if indices.shape[0] != indptr[-1]:
        raise value_error(f"slimserve: indices has {indices.shape[0]} entries, indptr ends at {int(indptr[-1])}")
    if indices.size and indices.min() < 0:
        raise value_error(f"slimserve: indices holds page id {int(indices.min())}", "out_of_range")
    pages = np.diff(indptr)
    bad = np.nonzero(((pages > 0) & ((last < 1) | (last > page_size))) | ((pages == 0) & (last != 0)))[0]
    if bad.size:
        b = int(bad[0])
        raise value_error(f"slimserve: last_page_len[{b}] = {int(last[b])} with {int(pages[b])} pages "
                          f"(1..{page_size} with pages, 0 without)")


def _check_cache_matches_plan(kv_cache, problem) -> None:
    """Raises unless kv_cache is a PagedKVCache of the plan's heads, head_dim, page size and dtype
    (a run reads the cache with the plan's geometry)."""
    if not isinstance(kv_cache, PagedKVCache):
        raise type_error(f"slimserve: kv_cache must be a PagedKVCache, got {type(kv_cache).__name__}")
    c, p = kv_cache.view, problem
    if (c.num_kv_heads, c.head_dim, c.page_size, c.dtype) != (p.num_kv_heads, p.head_dim, p.page_size, p.kv_dtype):
        raise value_error(f"slimserve: kv_cache (heads {c.num_kv_heads}, head_dim {c.head_dim}, page_size "
                          f"{c.page_size}, {_KV_CODE_NAMES[c.dtype]}) does not match the plan (heads "
                          f"{p.num_kv_heads}, head_dim {p.head_dim}, page_size {p.page_size}, "
                          f"{_KV_CODE_NAMES[p.kv_dtype]})")


class DecodeWrapper:
    """Paged decode attention (the CUDA-core kernel), FlashInfer-style: `plan` once per batch
    (host: checks the table, schedules, uploads into buffers it keeps: a later plan that fits
    reuses them, so their pointers stay), `run` per layer (launches only)."""

    def __init__(self):
        self._workspace: Optional[DeviceArray] = None
        self._plan = c_void_p()
        self._table = None
        self._buffers = [None, None, None]

    def plan(self, indptr, indices, last_page_len, num_qo_heads: int, num_kv_heads: int,
             head_dim: int, page_size: int, kv_data_type="bfloat16", *,
             query_tokens: int = 1, stream=None) -> None:
        indptr = _host_ints(indptr, "indptr")
        last = _host_ints(last_page_len, "last_page_len")
        indices = _host_ints(indices, "indices")
        _check_csr(indptr, indices, last, page_size)
        problem = _capi.DecodeProblem(len(last), num_qo_heads, num_kv_heads, head_dim, page_size,
                                      query_tokens, KV_DTYPES[kv_dtype_name(kv_data_type, None, "kv_data_type")])
        size = c_size_t(0)
        _check(_lib.slimserve_decode_workspace_size(byref(problem), indptr.ctypes.data,
                                                    last.ctypes.data, byref(size)))
        if self._workspace is None or self._workspace.nbytes < max(size.value, 1):
            self._workspace = DeviceArray.empty(size.value)
        self._destroy_plan()
        _check(_lib.slimserve_decode_plan_create(byref(problem), indptr.ctypes.data, last.ctypes.data,
                                                 self._workspace.ptr, self._workspace.nbytes,
                                                 _stream(stream), byref(self._plan)))
        for i, host in enumerate((indptr, indices, last)):
            if self._buffers[i] is None or self._buffers[i].nbytes < host.nbytes:
                self._buffers[i] = DeviceArray(host, stream)
            else:
                self._buffers[i].upload(host, stream)
        self._table = _capi.PageTableView(self._buffers[0].ptr, self._buffers[1].ptr, self._buffers[2].ptr,
                                          None, len(last), page_size)
        self._host = (indptr, indices, last)
        self.problem = problem

    def run(self, q, kv_cache: PagedKVCache, *, out=None, lse=None, sm_scale: Optional[float] = None,
            statuses: Optional[RequestStatuses] = None, table: Optional[BuiltTable] = None,
            dtype: Optional[str] = None, stream=None, synchronize: Optional[bool] = None):
        """q [batch * query_tokens, num_qo_heads, head_dim] -> out (same shape and dtype).
        synchronize (default: when stream is None) waits for the launch before returning.
        `table` (from PageTable.build, with the planned lengths) replaces the plan's own copy
        of the page table, so its expected tags and the tag check's `statuses` guard the pages."""
        if not self._plan:
            raise SlimserveError("DecodeWrapper.run before plan", "failed_precondition")
        p = self.problem
        _check_cache_matches_plan(kv_cache, p)
        kv_cache.require_packed("DecodeWrapper")
        c = kv_cache.view
        rows = p.batch_size * p.query_tokens
        qr = _tensor(q, name="q", shape=(rows, p.num_qo_heads, p.head_dim))
        q_dtype = _activation(qr, "q", dtype)
        if table is not None:
            if not isinstance(table, BuiltTable):
                raise type_error(f"slimserve: table must be a BuiltTable, got {type(table).__name__}")
            view = table.device
            if (table.batch_size != p.batch_size or not np.array_equal(table.indptr, self._host[0])
                    or not np.array_equal(table.last_page_len, self._host[2])):
                raise value_error("slimserve: the table's lengths (indptr, last_page_len) are not the planned ones")
            ids = table.indices
        else:
            view, ids = self._table, self._host[1]
        if ids.size and ids.max() >= c.num_pages:
            raise value_error(f"slimserve: page id {int(ids.max())} outside the cache's {c.num_pages} pages",
                              "out_of_range")
        if out is None:
            out = _empty_like(q)
        orr = _tensor(out, name="out", shape=qr.shape, dtypes={qr.dtype})
        args = _capi.DecodeArgs()
        args.q, args.o = qr.ptr, orr.ptr
        args.lse = _tensor(lse, name="lse", dtypes={"float32"}, shape=qr.shape[:2]).ptr if lse is not None else None
        args.q_dtype = q_dtype
        if sm_scale is not None and (not math.isfinite(sm_scale) or sm_scale <= 0):
            raise value_error(f"slimserve: sm_scale must be finite and > 0, got {sm_scale}")
        args.sm_scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(p.head_dim)
        _check(_lib.slimserve_decode_run(self._plan, byref(c), byref(view),
                                         _statuses_ptr(statuses, p.batch_size, "the plan"),
                                         byref(args), self._workspace.ptr, self._workspace.nbytes,
                                         _stream(stream)))
        if synchronize if synchronize is not None else stream is None:
            _check(_lib.slimserve_stream_synchronize(_stream(stream)))
        return out

    def _destroy_plan(self):
        if self._plan:
            _lib.slimserve_decode_plan_destroy(self._plan)
            self._plan = c_void_p()

    def __del__(self, _exiting=sys.is_finalizing):
        # At interpreter exit the module's globals may already be gone (None): the process
        # frees everything then, so nothing is destroyed.
        if not _exiting():
            self._destroy_plan()


# ---- INT4 weights ------------------------------------------------------------------------------

class Int4Weights:
    """INT4 weights packed for the W4A16 GEMM: host arrays to upload as they are."""

    def __init__(self, handle: c_void_p, activation: str):
        self._handle = handle
        info = _capi.Int4WeightsInfo()
        _check(_lib.slimserve_int4_weights_get_info(handle, byref(info)))
        self.k, self.n, self.group_size, self.activation = info.k, info.n, info.group_size, activation
        self.packed = np.ctypeslib.as_array(info.packed, shape=(info.packed_bytes // 4,)).copy()
        self.scales = np.ctypeslib.as_array(info.scales, shape=(info.scales_bytes // 2,)).copy()
        self.zeros = (np.ctypeslib.as_array(info.zeros, shape=(info.zeros_bytes // 2,)).copy()
                      if info.zeros else None)
        if activation == "float16":  # NumPy has float16 (not bfloat16): give the values
            self.scales = self.scales.view(np.float16)
            self.zeros = self.zeros.view(np.float16) if self.zeros is not None else None

    def dequantize(self) -> np.ndarray:
        """The weight [k, n] as the GEMM computes it (float32)."""
        out = np.empty((self.k, self.n), np.float32)
        _check(_lib.slimserve_int4_weights_dequantize(
            self._handle, out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), out.size))
        return out

    def _destroy(self) -> None:
        if getattr(self, "_handle", None):
            _lib.slimserve_int4_weights_destroy(self._handle)
            self._handle = None

    def __del__(self, _exiting=sys.is_finalizing):
        # At interpreter exit the module's globals may already be gone (None): the process
        # frees everything then, so nothing is destroyed.
        if not _exiting():
            self._destroy()


def quantize_int4(weight: np.ndarray, *, group_size: int = 128, symmetric: bool = True,
                  activation: str = "bfloat16", layout: str = "k_by_n") -> Int4Weights:
    """Quantizes a host float32/float16 weight ([k, n], or [n, k] with layout="n_by_k" as in
    nn.Linear) to INT4 with group scales and packs it for the GEMM."""
    weight = np.ascontiguousarray(weight)
    dtypes = {np.dtype(np.float32): 0, np.dtype(np.float16): 1}
    if weight.dtype not in dtypes or weight.ndim != 2:
        raise type_error("slimserve: quantize_int4 takes a 2-D float32 or float16 array")
    k, n = weight.shape if layout == "k_by_n" else weight.shape[::-1]
    options = _capi.QuantizeOptions(group_size, 1 if symmetric else 0, ACTIVATION_DTYPES[activation])
    handle = c_void_p()
    _check(_lib.slimserve_int4_quantize(weight.ctypes.data, dtypes[weight.dtype],
                                        0 if layout == "k_by_n" else 1, k, n, byref(options),
                                        byref(handle)))
    return Int4Weights(handle, "bfloat16" if activation in ("bf16", "bfloat16") else "float16")


def _elements(x, name: str, count: int, dtypes):
    """A compact tensor of exactly `count` elements ([k/group_size, n] or flat)."""
    r = _tensor(x, name=name, dtypes=dtypes)
    if r.numel != count:
        raise value_error(f"slimserve: {name} has shape {r.shape} ({r.numel} elements), expected {count}")
    return r


def gemm_w4a16(a, packed, scales, zeros, group_size: int, *, out=None, bias=None,
               dtype: Optional[str] = None, stream=None):
    """out[m, n] = a[m, k] . dequant(W)[k, n] (+ bias), W as packed by quantize_int4."""
    ar = _tensor(a, name="a", ndim=2)
    m, k = ar.shape
    activation = _activation(ar, "a", dtype)
    pr = _tensor(packed, name="packed", dtypes={"uint32", "int32"})
    if m < 1 or k < 16 or k % 16:
        raise value_error(f"slimserve: a has shape {ar.shape}; k must be a positive multiple of 16")
    if not isinstance(group_size, (int, np.integer)) or group_size < 1 or k % group_size:
        raise value_error(f"slimserve: group_size {group_size!r} must divide k = {k}")
    if pr.numel * 8 % k or pr.numel == 0:
        raise value_error(f"slimserve: packed holds {pr.numel} words, not [k/16, n/16, 32] for k = {k}")
    n = pr.numel * 8 // k
    groups = k // group_size
    same = {"bfloat16", "uint16"} if activation == 0 else {"float16"}
    if out is None:
        out = _empty_like(a, shape=(m, n))
    args = _capi.GemmArgs(activation, m, n, k, group_size, ar.ptr, pr.ptr,
                          _elements(scales, "scales", groups * n, same).ptr,
                          _elements(zeros, "zeros", groups * n, same).ptr if zeros is not None else None,
                          _tensor(bias, name="bias", shape=(n,), dtypes=same).ptr if bias is not None else None,
                          _tensor(out, name="out", shape=(m, n), dtypes=same).ptr)
    plan = c_void_p()
    _check(_lib.slimserve_gemm_plan_create(byref(args), byref(plan)))
    try:
        size = _lib.slimserve_gemm_plan_workspace_bytes(plan)
        workspace = DeviceArray.empty(size) if size else None
        _check(_lib.slimserve_gemm_run(plan, byref(args), workspace.ptr if workspace else None,
                                       size, _stream(stream)))
        _check(_lib.slimserve_stream_synchronize(_stream(stream)))
    finally:
        _lib.slimserve_gemm_plan_destroy(plan)
    return out


try:  # torch.library custom ops, when PyTorch is importable
    import torch as _torch  # noqa: F401
except ImportError:
    _torch = None
if _torch is not None:
    from . import torch_ops  # noqa: F401,E402


# ---- ABI 2: tensor-core paged attention and MLA (slimserve.attention) --------------------------
from .attention import (MlaCache, MlaDecodeWrapper, PagedAttentionWrapper, mla_append,  # noqa: E402
                        mla_record_bytes, validate_block_table)

# ---- ABI 2: INT4 mixture-of-experts GEMM (slimserve.moe) -----------------------------------------
from .moe import MoeGemm, MoeRouter, MoeRouting, stack_experts, validate_moe_routing  # noqa: E402
