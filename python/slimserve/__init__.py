"""slimserve for Python engines: tagged KV pages, FP8/BF16 KV cache append and decode
attention, INT4 weights.

ctypes bindings over slimserve's C ABI (`slimserve/c/slimserve.h`). Tensors cross through DLPack
(NumPy, PyTorch, CuPy alike) without copies. The package ships the CPU-emulated library, so
everything here runs on a machine without a GPU on host arrays; a GPU build
(`SLIMSERVE_PYTHON_CUDA=ON`) runs the same calls on CUDA tensors. When PyTorch is importable,
`slimserve.torch_ops` registers the kernels as `torch.library` custom ops with fake
implementations (torch.compile, CUDA graphs).
"""
from __future__ import annotations

import ctypes
import math
import weakref
from ctypes import byref, c_int32, c_size_t, c_void_p
from typing import Iterable, List, Optional, Sequence, Tuple

import numpy as np

from . import _capi
from ._capi import Page
from ._dlpack import ref as _ref

_lib, library_path = _capi.load()
EMULATED: bool = bool(_lib.slimserve_is_emulated())
_v = _lib.slimserve_version()
__version__ = f"{_v // 10000}.{_v // 100 % 100}.{_v % 100}"

KV_DTYPES = {"bfloat16": 0, "bf16": 0, "float16": 1, "fp16": 1, "fp8_e4m3": 2,
             "float8_e4m3fn": 2, "fp8_e5m2": 3, "float8_e5m2": 3}
ACTIVATION_DTYPES = {"bfloat16": 0, "bf16": 0, "float16": 1, "fp16": 1}
LAYOUTS = {"NHD": 0, "HND": 1}
REQUEST_STATES = {0: "ok", 1: "stale_tag", 2: "page_out_of_range", 3: "bad_page_table",
                  4: "guard_page", 5: "write_denied", 6: "read_denied"}

PageHandle = Tuple[int, int]  # (page id, tag)


class SlimserveError(RuntimeError):
    """A failed call: `code` is the status name ("stale_handle", ...), the message says why."""

    def __init__(self, status: int, message: str):
        self.status = status
        self.code = _capi.STATUS_NAMES.get(status, "unknown")
        super().__init__(f"{self.code}: {message}")


def _check(status: int) -> None:
    if status != _capi.OK:
        raise SlimserveError(status, (_lib.slimserve_last_error() or b"").decode())


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

    def __init__(self, host: np.ndarray, stream=None):
        host = np.ascontiguousarray(host)
        self.nbytes = max(host.nbytes, 1)
        self.ptr = c_void_p()
        _check(_lib.slimserve_device_alloc(self.nbytes, byref(self.ptr)))
        if host.nbytes:
            _check(_lib.slimserve_memcpy_async(self.ptr, host.ctypes.data, host.nbytes, 0, _stream(stream)))

    @classmethod
    def empty(cls, nbytes: int) -> "DeviceArray":
        return cls(np.zeros(0, np.uint8)) if nbytes == 0 else cls(np.empty(nbytes, np.uint8))

    def download(self, out: np.ndarray, stream=None) -> np.ndarray:
        _check(_lib.slimserve_memcpy_async(out.ctypes.data, self.ptr, out.nbytes, 1, _stream(stream)))
        _check(_lib.slimserve_stream_synchronize(_stream(stream)))
        return out

    def __del__(self):
        if getattr(self, "ptr", None) is not None and self.ptr.value:
            _lib.slimserve_device_free(self.ptr)
            self.ptr = None


# ---- KV pages ----------------------------------------------------------------------------------

class PagePool:
    """Pages with generation tags; page 0 is the guard page (num_pages - 1 usable)."""

    def __init__(self, num_pages: int):
        self._handle = c_void_p()
        self._dependents = []  # weak references to caches / page sets built on this pool
        self._open_dependents = 0  # of those, not yet destroyed (see _close_or_defer)
        self._close_pending = False
        _check(_lib.slimserve_page_pool_create(num_pages, byref(self._handle)))
        self.num_pages = num_pages

    def allocate(self, count: int) -> List[PageHandle]:
        """`count` pages, all or nothing (SlimserveError resource_exhausted takes none)."""
        out = (Page * max(count, 1))()
        _check(_lib.slimserve_page_pool_allocate(self._handle, out, count))
        return [(out[i].id, out[i].tag) for i in range(count)]

    def release(self, pages: Sequence[PageHandle]) -> None:
        """Drops one reference of each page, all or nothing."""
        _check(_lib.slimserve_page_pool_release(self._handle, _pages_array(pages), len(pages)))

    def share(self, page: PageHandle) -> None:
        _check(_lib.slimserve_page_pool_share(self._handle, Page(*page)))

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

    __del__ = close


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

    __del__ = close


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

    def close(self) -> None:
        if getattr(self, "_handle", None):
            _lib.slimserve_request_sets_destroy(self._handle)
            self._handle = None
            if self._cache is not None:
                _dependent_closed(self._cache)
            _dependent_closed(self._pool)

    __del__ = close


class DeviceTags:
    """The device copy of every page's tag; `sync` once per step, before the tag check."""

    def __init__(self, num_pages: int):
        self._handle = c_void_p()
        _check(_lib.slimserve_device_tags_create(num_pages, byref(self._handle)))

    def sync(self, pool: PagePool, stream=None) -> None:
        _check(_lib.slimserve_device_tags_sync(self._handle, pool._handle, _stream(stream)))

    def __del__(self):
        if getattr(self, "_handle", None):
            _lib.slimserve_device_tags_destroy(self._handle)
            self._handle = None


class BuiltTable:
    """A batch's page table: `device` for kernels, host copies of indptr/last_page_len/indices
    for planning."""

    def __init__(self, host: _capi.PageTableView, device: _capi.PageTableView):
        self.device = device
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


class PageTable:
    """Pinned host staging plus device arrays for tables of up to max_batch requests."""

    def __init__(self, max_batch: int, max_entries: int, page_size: int, num_pages: int):
        self._handle = c_void_p()
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
        return BuiltTable(host, device)

    def __del__(self):
        if getattr(self, "_handle", None):
            _lib.slimserve_page_table_destroy(self._handle)
            self._handle = None


class RequestStatuses:
    """Device array of per-request verdicts written by the tag check, read by the kernels."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.buffer = DeviceArray(np.zeros(2 * capacity, np.int32))

    @property
    def ptr(self):
        return self.buffer.ptr

    def to_host(self, count: int, stream=None) -> List[Tuple[str, int]]:
        """[(state name, failed slot)] of the first `count` requests (synchronizes)."""
        host = self.buffer.download(np.empty(2 * count, np.int32), stream).reshape(count, 2)
        return [(REQUEST_STATES.get(int(s), str(int(s))), int(slot)) for s, slot in host]


def check_page_tags(table: BuiltTable, tags: DeviceTags, statuses: RequestStatuses, *,
                    writers: Optional[Sequence[int]] = None, append_indptr=None, stream=None) -> None:
    """Compares every page-table entry with the device tags; one verdict per request. With
    `writers` (the requests' identities from RequestSets) and the step's `append_indptr`, also
    checks write ownership: pages a step writes must be the request's own."""
    if table.batch_size > statuses.capacity:
        raise ValueError(f"slimserve: {table.batch_size} requests, statuses hold {statuses.capacity}")
    if writers is None and append_indptr is None:
        _check(_lib.slimserve_check_page_tags(byref(table.device), tags._handle, statuses.ptr, None,
                                              _stream(stream)))
        return
    keep = [DeviceArray(np.asarray(writers, np.uint32), stream) if writers is not None else None,
            DeviceArray(np.asarray(append_indptr, np.int32), stream) if append_indptr is not None else None]
    _check(_lib.slimserve_check_page_tags_owned(byref(table.device), tags._handle,
                                                keep[0].ptr if keep[0] else None,
                                                keep[1].ptr if keep[1] else None,
                                                statuses.ptr, None, _stream(stream)))
    _check(_lib.slimserve_stream_synchronize(_stream(stream)))  # the uploads are freed on return


# ---- KV cache, append, decode ------------------------------------------------------------------

def _activation(x, name: str, dtype: Optional[str]) -> int:
    r = _tensor(x, name=name)
    name_of = dtype or r.dtype
    if name_of not in ACTIVATION_DTYPES:
        raise TypeError(f"slimserve: {name} has dtype {r.dtype}; pass dtype='bfloat16' for BF16 "
                        "bits in uint16 arrays")
    return ACTIVATION_DTYPES[name_of]


class PagedKVCache:
    """K and V page arrays, [num_pages, page_size, H, D] (NHD) or [num_pages, H, page_size, D]
    (HND), with their element type and scales. FP8 pages are uint8 arrays plus `dtype`.
    One combined allocation [num_pages, 2, ...] (K page, then V page) is passed as k_pages with
    v_pages=None: `page_stride` is then twice a page (only paged attention reads it)."""

    def __init__(self, k_pages, v_pages, *, layout: str = "NHD", dtype: Optional[str] = None,
                 k_scale=None, v_scale=None, k_token_scales=None, v_token_scales=None):
        self.page_stride = 0  # elements between pages; 0: packed
        if v_pages is None:
            kv = _tensor(k_pages, name="kv_pages")
            if len(kv.shape) != 5 or kv.shape[1] != 2:
                raise ValueError(f"slimserve: combined kv_pages {kv.shape} must be [num_pages, 2, ...] (5-D)")
            page = kv.shape[2] * kv.shape[3] * kv.shape[4]
            element = 1 if (dtype or kv.dtype) in ("fp8_e4m3", "fp8_e5m2", "float8_e4m3fn", "float8_e5m2", "uint8") else 2
            k = _TensorShape(kv.ptr, (kv.shape[0],) + kv.shape[2:], kv.dtype)
            v = _TensorShape(kv.ptr + page * element, k.shape, kv.dtype)
            self.page_stride = 2 * page
        else:
            k, v = _tensor(k_pages, name="k_pages"), _tensor(v_pages, name="v_pages")
        if k.shape != v.shape or len(k.shape) != 4:
            raise ValueError(f"slimserve: k_pages {k.shape} and v_pages {v.shape} must be equal 4-D shapes")
        dtype = dtype or k.dtype
        if dtype not in KV_DTYPES:
            raise TypeError(f"slimserve: KV dtype {dtype} (uint8 pages need dtype='fp8_e4m3' or 'fp8_e5m2')")
        if layout not in LAYOUTS:
            raise ValueError(f"slimserve: layout {layout} (NHD or HND)")
        num_pages, a, b, head_dim = k.shape
        page_size, heads = (a, b) if layout == "NHD" else (b, a)
        self._keep = [k_pages, v_pages]
        self.view = _capi.KvCache()
        self.view.k_pages, self.view.v_pages = k.ptr, v.ptr
        self.view.num_pages, self.view.page_size = num_pages, page_size
        self.view.num_kv_heads, self.view.head_dim = heads, head_dim
        self.view.dtype, self.view.layout = KV_DTYPES[dtype], LAYOUTS[layout]
        if k_token_scales is not None:
            self.view.scale_mode = 2
            self.view.k_token_scales = self._pointer(k_token_scales, "k_token_scales")
            self.view.v_token_scales = self._pointer(v_token_scales, "v_token_scales")
        elif k_scale is not None:
            self.view.scale_mode = 1
            self.view.k_scale = self._scale(k_scale, "k_scale")
            self.view.v_scale = self._scale(v_scale, "v_scale")
        self.dtype, self.layout = dtype, layout

    def _pointer(self, tensor, name):
        r = _tensor(tensor, name=name, dtypes={"float32"})
        self._keep.append(tensor)
        return r.ptr

    def _scale(self, value, name):
        if value is None:
            raise TypeError(f"slimserve: {name} is required with per-tensor scales")
        if isinstance(value, (int, float)):  # a calibrated constant: one device float
            value = DeviceArray(np.array([value], np.float32))
            self._keep.append(value)
            return value.ptr.value
        return self._pointer(value, name)


def append_kv(cache: PagedKVCache, table: BuiltTable, k, v, *, token_request=None,
              token_position=None, append_indptr=None, statuses: Optional[RequestStatuses] = None,
              dtype: Optional[str] = None, stream=None) -> None:
    """Quantize-and-append new K/V rows [num_tokens, H, D] into the pages the table gives them."""
    kr = _tensor(k, name="k")
    _tensor(v, name="v", shape=kr.shape)
    args = _capi.AppendArgs()
    args.k_new, args.v_new = kr.ptr, _tensor(v, name="v").ptr
    args.input_dtype = _activation(k, "k", dtype)
    args.num_tokens = kr.shape[0]
    keep = []
    for field, value in (("token_request", token_request), ("token_position", token_position),
                         ("append_indptr", append_indptr)):
        if value is not None:
            device = DeviceArray(np.asarray(value, np.int32), stream)
            keep.append(device)
            setattr(args, field, device.ptr.value)
    _check(_lib.slimserve_append_kv(byref(cache.view), byref(table.device),
                                    statuses.ptr if statuses is not None else None, byref(args),
                                    _stream(stream)))
    _check(_lib.slimserve_stream_synchronize(_stream(stream)))  # the uploads above are freed next


def reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype: str = "auto",
                      k_scale=None, v_scale=None, *, dtype: Optional[str] = None, stream=None) -> None:
    """vLLM-style append: token t goes to flat slot slot_mapping[t] = page * page_size + offset
    of [num_pages, page_size, H, D] caches; slot -1 skips the token. kv_cache_dtype: "auto"
    (the caches' own dtype) or "fp8_e4m3"/"fp8_e5m2" for uint8 caches with per-tensor scales."""
    cache = PagedKVCache(key_cache, value_cache, layout="NHD",
                         dtype=None if kv_cache_dtype == "auto" else kv_cache_dtype,
                         k_scale=k_scale, v_scale=v_scale)
    slots = np.asarray(slot_mapping.cpu() if hasattr(slot_mapping, "cpu") else slot_mapping, np.int64)
    page_size, num_pages = cache.view.page_size, cache.view.num_pages
    valid = slots >= 0
    if np.any(slots >= np.int64(num_pages) * page_size):
        raise SlimserveError(2, f"slot {int(slots.max())} outside {num_pages} pages of {page_size}")
    # One single-page request per token: its page holds the slot; skipped tokens own no page.
    counts = valid.astype(np.int32)
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    indices = (slots[valid] // page_size).astype(np.int32)
    last = np.where(valid, page_size, 0).astype(np.int32)
    tables = [DeviceArray(a, stream) for a in (indptr, indices, last)]
    table = BuiltTable.__new__(BuiltTable)
    table.device = _capi.PageTableView(tables[0].ptr, tables[1].ptr, tables[2].ptr, None,
                                       len(slots), page_size)
    table._keep = tables
    append_kv(cache, table, key, value, token_request=np.arange(len(slots), dtype=np.int32),
              token_position=np.where(valid, slots % page_size, 0).astype(np.int32),
              dtype=dtype, stream=stream)


def copy_pages(cache: PagedKVCache, tags: DeviceTags, copies: Sequence[dict], stream=None) -> List[Tuple[str, int]]:
    """Copy-on-write / defragmentation copies inside one cache, each checked on the device:
    copies are dicts {src, dst (page handles), writer, tokens}. Returns each copy's verdict."""
    array = (_capi.PageCopy * max(len(copies), 1))()
    for i, c in enumerate(copies):
        array[i] = _capi.PageCopy(c["src"][0], c["src"][1], c["dst"][0], c["dst"][1], c["writer"], c["tokens"])
    _check(_lib.slimserve_check_page_copies(byref(cache.view), array, len(copies)))
    device = DeviceArray(np.frombuffer(bytes(array), np.uint8)[: len(copies) * ctypes.sizeof(_capi.PageCopy)], stream)
    statuses = RequestStatuses(max(len(copies), 1))
    _check(_lib.slimserve_copy_pages(byref(cache.view), tags._handle, device.ptr, len(copies),
                                     statuses.ptr, _stream(stream)))
    return statuses.to_host(len(copies), stream)


class DecodeWrapper:
    """Paged decode attention, FlashInfer-style: `plan` once per batch shape (host), `run` per
    layer (launches only; capturable in a CUDA graph on a GPU)."""

    def __init__(self):
        self._workspace: Optional[DeviceArray] = None
        self._plan = c_void_p()
        self._table = None

    def plan(self, indptr, indices, last_page_len, num_qo_heads: int, num_kv_heads: int,
             head_dim: int, page_size: int, kv_data_type: str = "bfloat16", *,
             query_tokens: int = 1, stream=None) -> None:
        indptr = np.ascontiguousarray(np.asarray(indptr), np.int32)
        last = np.ascontiguousarray(np.asarray(last_page_len), np.int32)
        indices = np.ascontiguousarray(np.asarray(indices), np.int32)
        problem = _capi.DecodeProblem(len(last), num_qo_heads, num_kv_heads, head_dim, page_size,
                                      query_tokens, KV_DTYPES[kv_data_type])
        size = c_size_t(0)
        _check(_lib.slimserve_decode_workspace_size(byref(problem), indptr.ctypes.data,
                                                    last.ctypes.data, byref(size)))
        if self._workspace is None or self._workspace.nbytes < max(size.value, 1):
            self._workspace = DeviceArray.empty(size.value)
        self._destroy_plan()
        _check(_lib.slimserve_decode_plan_create(byref(problem), indptr.ctypes.data, last.ctypes.data,
                                                 self._workspace.ptr, self._workspace.nbytes,
                                                 _stream(stream), byref(self._plan)))
        arrays = [DeviceArray(a, stream) for a in (indptr, indices, last)]
        self._table = (_capi.PageTableView(arrays[0].ptr, arrays[1].ptr, arrays[2].ptr, None,
                                           len(last), page_size), arrays)
        self.problem = problem

    def run(self, q, kv_cache: PagedKVCache, *, out=None, lse=None, sm_scale: Optional[float] = None,
            statuses: Optional[RequestStatuses] = None, table: Optional[BuiltTable] = None,
            dtype: Optional[str] = None, stream=None):
        """q [batch * query_tokens, num_qo_heads, head_dim] -> out (same shape and dtype).
        `table` (from PageTable.build) replaces the plan's own copy of the page table, so
        its expected tags and the tag check's `statuses` guard the pages."""
        if not self._plan:
            raise RuntimeError("slimserve: DecodeWrapper.run before plan")
        if out is None:
            out = _empty_like(q)
        args = _capi.DecodeArgs()
        args.q = _tensor(q, name="q").ptr
        args.o = _tensor(out, name="out", shape=_tensor(q).shape).ptr
        args.lse = _tensor(lse, name="lse", dtypes={"float32"}).ptr if lse is not None else None
        args.q_dtype = _activation(q, "q", dtype)
        args.sm_scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(self.problem.head_dim)
        view = table.device if table is not None else self._table[0]
        _check(_lib.slimserve_decode_run(self._plan, byref(kv_cache.view), byref(view),
                                         statuses.ptr if statuses is not None else None,
                                         byref(args), self._workspace.ptr, self._workspace.nbytes,
                                         _stream(stream)))
        if stream is None:
            _check(_lib.slimserve_stream_synchronize(None))
        return out

    def _destroy_plan(self):
        if self._plan:
            _lib.slimserve_decode_plan_destroy(self._plan)
            self._plan = c_void_p()

    def __del__(self):
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

    def __del__(self):
        if getattr(self, "_handle", None):
            _lib.slimserve_int4_weights_destroy(self._handle)
            self._handle = None


def quantize_int4(weight: np.ndarray, *, group_size: int = 128, symmetric: bool = True,
                  activation: str = "bfloat16", layout: str = "k_by_n") -> Int4Weights:
    """Quantizes a host float32/float16 weight ([k, n], or [n, k] with layout="n_by_k" as in
    nn.Linear) to INT4 with group scales and packs it for the GEMM."""
    weight = np.ascontiguousarray(weight)
    dtypes = {np.dtype(np.float32): 0, np.dtype(np.float16): 1}
    if weight.dtype not in dtypes or weight.ndim != 2:
        raise TypeError("slimserve: quantize_int4 takes a 2-D float32 or float16 array")
    k, n = weight.shape if layout == "k_by_n" else weight.shape[::-1]
    options = _capi.QuantizeOptions(group_size, 1 if symmetric else 0, ACTIVATION_DTYPES[activation])
    handle = c_void_p()
    _check(_lib.slimserve_int4_quantize(weight.ctypes.data, dtypes[weight.dtype],
                                        0 if layout == "k_by_n" else 1, k, n, byref(options),
                                        byref(handle)))
    return Int4Weights(handle, "bfloat16" if activation in ("bf16", "bfloat16") else "float16")


def gemm_w4a16(a, packed, scales, zeros, group_size: int, *, out=None, bias=None,
               dtype: Optional[str] = None, stream=None):
    """out[m, n] = a[m, k] . dequant(W)[k, n] (+ bias), W as packed by quantize_int4."""
    ar = _tensor(a, name="a")
    m, k = ar.shape
    pr = _tensor(packed, name="packed", dtypes={"uint32", "int32"})
    n = pr.numel * 8 // k
    if out is None:
        out = _empty_like(a, shape=(m, n))
    args = _capi.GemmArgs(_activation(a, "a", dtype), m, n, k, group_size, ar.ptr, pr.ptr,
                          _tensor(scales, name="scales").ptr,
                          _tensor(zeros, name="zeros").ptr if zeros is not None else None,
                          _tensor(bias, name="bias").ptr if bias is not None else None,
                          _tensor(out, name="out", shape=(m, n)).ptr)
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
