"""Tensor-core paged attention and MLA over the C ABI (ABI 2): prefill, chunked prefill,
decode and speculative verify in one plan/run wrapper, with the inputs engines have (a CSR page
table or a 2-D block table + seq_lens, one combined K/V allocation, q read in place from a
fused QKV output, the fused mixed-dtype prefill), and MLA append / absorbed decode.

`plan` runs on the host once per step shape (it validates the lengths, schedules and uploads);
`run` only launches, per layer. Errors raise `slimserve.SlimserveError` with the library's
message.
"""
from __future__ import annotations

import ctypes
from ctypes import byref, c_size_t, c_void_p
from typing import Optional

import numpy as np

from . import (_activation, _capi, _check, _empty_like, _lib, _stream, _tensor, ACTIVATION_DTYPES,
               DeviceArray, KV_DTYPES, PagedKVCache, RequestStatuses)

__all__ = ["PagedAttentionWrapper", "validate_block_table", "MlaCache", "mla_append", "MlaDecodeWrapper",
           "mla_record_bytes"]

MLA_SCALE_MODES = {"none": 0, "per_tensor": 1, "per_token_group": 2}
# What q may be for each activation dtype (NumPy has no bfloat16: its bits as uint16).
_ACTIVATION_NAMES = {0: {"bfloat16", "uint16"}, 1: {"float16"}}


def _ints(values) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(values.cpu() if hasattr(values, "cpu") else values), np.int32)


def _strides(r, name: str, inner: int):
    """(token, head) element strides of a [tokens, heads, inner] tensor or view; 0 = packed."""
    if r.strides is None:
        return 0, 0
    if len(r.strides) != 3 or r.strides[2] != 1:
        raise ValueError(f"slimserve: {name} must be a [tokens, heads, {inner}] view with unit stride "
                         f"in its last dimension, got strides {r.strides}")
    return r.strides[0], r.strides[1]


def validate_block_table(block_table, seq_lens, expected_tags, num_pages: int, page_size: int) -> None:
    """Host preflight of a block table: every page a length uses is a real page of the cache."""
    block, lens, tags = _ints(block_table), _ints(seq_lens), np.ascontiguousarray(expected_tags, np.uint32)
    view = _capi.BlockTableView(block.ctypes.data, tags.ctypes.data, lens.ctypes.data, block.shape[0],
                                block.shape[1], page_size)
    _check(_lib.slimserve_validate_block_table(byref(view), num_pages))


class PagedAttentionWrapper:
    """Paged attention, FlashInfer-style plan/run. Request b owns query tokens
    [qo_indptr[b], qo_indptr[b + 1]) of q: its last positions, already counted by the page
    table (appended, or written by the fused prefill), attending causally to the cached prefix
    and themselves."""

    def __init__(self):
        self._plan = c_void_p()
        self._workspace: Optional[DeviceArray] = None
        self._arrays = []

    def plan(self, qo_indptr, num_qo_heads: int, num_kv_heads: int, head_dim: int, page_size: int, *,
             kv_indptr=None, kv_indices=None, last_page_len=None, block_table=None, seq_lens=None,
             expected_tags=None, kv_dtype: str = "bfloat16", q_dtype: Optional[str] = None, causal: bool = True,
             num_sms: int = 0, min_chunk_tokens: int = 0, allow_split: bool = True,
             workspace: Optional[DeviceArray] = None, stream=None) -> None:
        """Either the CSR table (kv_indptr, kv_indices, last_page_len) or the block table
        ([batch, max_pages] page ids, seq_lens). Host arrays; the plan uploads its copies.
        `expected_tags` (the tags the requests hold their pages under, shaped like kv_indices
        or the block table) enables `check_tags`. `workspace` (optional) is used as given, so
        a short one is refused."""
        qo = _ints(qo_indptr)
        q_dtype = q_dtype or (kv_dtype if kv_dtype in ACTIVATION_DTYPES else "bfloat16")
        args = _capi.versioned(_capi.PagedAttentionPlanArgs)
        args.problem = _capi.PagedAttentionProblem(len(qo) - 1, num_qo_heads, num_kv_heads, head_dim, page_size,
                                                   KV_DTYPES[kv_dtype], ACTIVATION_DTYPES[q_dtype],
                                                   0 if causal else 1)
        args.qo_indptr_host = qo.ctypes.data
        host = [qo]
        if block_table is not None:
            block, lens = _ints(block_table), _ints(seq_lens)
            host += [block, lens]
            args.seq_lens_host = lens.ctypes.data
        else:
            indptr, indices, last = _ints(kv_indptr), _ints(kv_indices), _ints(last_page_len)
            host += [indptr, indices, last]
            args.kv_indptr_host, args.last_page_len_host = indptr.ctypes.data, last.ctypes.data
        args.num_sms, args.min_chunk_tokens, args.disable_split = num_sms, min_chunk_tokens, 0 if allow_split else 1
        size = c_size_t(0)
        _check(_lib.slimserve_paged_attention_workspace_size(byref(args), byref(size)))
        if workspace is not None:
            self._workspace = workspace
        elif self._workspace is None or self._workspace.nbytes < max(size.value, 1):
            self._workspace = DeviceArray.empty(size.value)
        self._destroy_plan()
        _check(_lib.slimserve_paged_attention_plan_create(byref(args), self._workspace.ptr, self._workspace.nbytes,
                                                          _stream(stream), byref(self._plan)))
        tags = None
        if expected_tags is not None:
            tags = np.ascontiguousarray(np.asarray(expected_tags), np.uint32)
            ids = host[1] if block_table is not None else host[2]
            if tags.shape != ids.shape:
                raise ValueError(f"slimserve: expected_tags {tags.shape} must be shaped like the page ids {ids.shape}")
            host.append(tags)
        device = [DeviceArray(a, stream) for a in host]
        self._arrays = device
        tags_ptr = device[-1].ptr if tags is not None else None
        self._qo_indptr = device[0]
        self._table = self._block_table = None
        if block_table is not None:
            self._block_table = _capi.BlockTableView(device[1].ptr, tags_ptr, device[2].ptr, len(qo) - 1,
                                                     block.shape[1], page_size)
        else:
            self._table = _capi.PageTableView(device[1].ptr, device[2].ptr, device[3].ptr, tags_ptr, len(qo) - 1,
                                              page_size)
        self.problem = args.problem
        self.num_tokens = int(qo[-1])

    def check_tags(self, tags, statuses: RequestStatuses, *, writers=None, stream=None) -> None:
        """The tag check over the planned table (CSR or block table): one verdict per request in
        `statuses`, which `run(..., statuses=statuses)` then honours (needs expected_tags)."""
        if not self._plan:
            raise RuntimeError("slimserve: PagedAttentionWrapper.check_tags before plan")
        keep = DeviceArray(np.ascontiguousarray(writers, np.uint32), stream) if writers is not None else None
        writer_ptr = keep.ptr if keep is not None else None
        if self._block_table is not None:
            _check(_lib.slimserve_check_block_tags(byref(self._block_table), tags._handle, writer_ptr, None,
                                                   statuses.ptr, None, _stream(stream)))
        else:
            _check(_lib.slimserve_check_page_tags_owned(byref(self._table), tags._handle, writer_ptr, None,
                                                        statuses.ptr, None, _stream(stream)))
        _check(_lib.slimserve_stream_synchronize(_stream(stream)))  # `keep` is freed next

    @property
    def info(self) -> dict:
        info = _capi.versioned(_capi.PagedAttentionPlanInfo)
        _check(_lib.slimserve_paged_attention_plan_get_info(self._plan, byref(info)))
        return {"kernel": "cuda_core" if info.kernel == 1 else "tensor_core", "split_kv": bool(info.split_kv),
                "chunk_tokens": info.chunk_tokens, "workspace_bytes": info.workspace_bytes,
                "reason": (info.reason or b"").decode()}

    def run(self, q, kv_cache: PagedKVCache, *, out=None, lse=None, sm_scale: Optional[float] = None,
            sliding_window: int = 0, logit_soft_cap: float = 0.0, sinks=None, chunk_k=None, chunk_v=None,
            statuses: Optional[RequestStatuses] = None, stream=None):
        """q [tokens, num_qo_heads, head_dim] (a view with a token/head stride is read in place)
        -> out (packed or a strided view). chunk_k/chunk_v [tokens, num_kv_heads, head_dim]:
        fused prefill, written into the chunk's slots (do not append them first)."""
        if not self._plan:
            raise RuntimeError("slimserve: PagedAttentionWrapper.run before plan")
        p = self.problem
        qr = _tensor(q, name="q", strided=True, dtypes=_ACTIVATION_NAMES[p.q_dtype])
        if qr.shape != (self.num_tokens, p.num_qo_heads, p.head_dim):
            raise ValueError(f"slimserve: q has shape {qr.shape}, the plan needs "
                             f"{(self.num_tokens, p.num_qo_heads, p.head_dim)}")
        if out is None:
            out = _empty_like(q, shape=qr.shape)
        orr = _tensor(out, name="out", strided=True, shape=qr.shape, dtypes={qr.dtype})
        args = _capi.versioned(_capi.PagedAttentionArgs)
        args.cache = kv_cache.view
        args.kv_page_stride = kv_cache.page_stride
        if self._table is not None:
            args.table = ctypes.pointer(self._table)
        else:
            args.block_table = ctypes.pointer(self._block_table)
        args.statuses = statuses.ptr if statuses is not None else None
        args.qo_indptr = self._qo_indptr.ptr
        args.q, args.o = qr.ptr, orr.ptr
        args.q_token_stride, args.q_head_stride = _strides(qr, "q", p.head_dim)
        args.o_token_stride, args.o_head_stride = _strides(orr, "out", p.head_dim)
        if lse is not None:
            args.lse = _tensor(lse, name="lse", dtypes={"float32"}, shape=qr.shape[:2]).ptr
        args.sm_scale = 0.0 if sm_scale is None else sm_scale
        args.sliding_window, args.logit_soft_cap = sliding_window, logit_soft_cap
        keep = []
        if sinks is not None:
            sink_ref = _tensor(sinks, name="sinks", dtypes={"float32"}, shape=(p.num_qo_heads,))
            args.sinks = sink_ref.ptr
        if chunk_k is not None or chunk_v is not None:
            kr = _tensor(chunk_k, name="chunk_k", strided=True, dtypes={qr.dtype})
            vr = _tensor(chunk_v, name="chunk_v", strided=True, dtypes={qr.dtype})
            k_strides, v_strides = _strides(kr, "chunk_k", p.head_dim), _strides(vr, "chunk_v", p.head_dim)
            if k_strides != v_strides:
                raise ValueError(f"slimserve: chunk_k strides {k_strides} and chunk_v strides {v_strides} differ")
            args.chunk_k, args.chunk_v = kr.ptr, vr.ptr
            args.chunk_token_stride, args.chunk_head_stride = k_strides
            keep += [kr, vr]
        _check(_lib.slimserve_paged_attention_run(self._plan, byref(args), self._workspace.ptr,
                                                  self._workspace.nbytes, _stream(stream)))
        if stream is None:
            _check(_lib.slimserve_stream_synchronize(None))
        return out

    def _destroy_plan(self):
        if self._plan:
            _lib.slimserve_paged_attention_plan_destroy(self._plan)
            self._plan = c_void_p()

    def __del__(self):
        self._destroy_plan()


# ---- MLA -----------------------------------------------------------------------------------------

def mla_record_bytes(kv_dtype: str = "bfloat16", scale_mode: str = "none") -> int:
    """Bytes of one cached token (0 for an unsupported combination)."""
    return int(_lib.slimserve_mla_record_bytes(KV_DTYPES[kv_dtype], MLA_SCALE_MODES[scale_mode]))


class MlaCache:
    """A paged latent cache: a uint8 array [num_pages, page_size, record bytes]."""

    def __init__(self, pages, *, kv_dtype: str = "bfloat16", scale_mode: str = "none", latent_scale=None):
        r = _tensor(pages, name="pages", dtypes={"uint8"})
        if len(r.shape) != 3 or r.shape[2] != mla_record_bytes(kv_dtype, scale_mode):
            raise ValueError(f"slimserve: MLA pages {r.shape} must be [num_pages, page_size, "
                             f"{mla_record_bytes(kv_dtype, scale_mode)}] for {kv_dtype}/{scale_mode}")
        self._keep = [pages]
        self.view = _capi.MlaCache(r.ptr, None, r.shape[0], r.shape[1], KV_DTYPES[kv_dtype],
                                   MLA_SCALE_MODES[scale_mode])
        if latent_scale is not None:
            scale = DeviceArray(np.array([latent_scale], np.float32))
            self._keep.append(scale)
            self.view.latent_scale = scale.ptr.value


def mla_append(cache: MlaCache, indptr, indices, last_page_len, latent, rope, *, append_indptr,
               dtype: Optional[str] = None, stream=None) -> None:
    """Quantize-and-append new tokens' latent [n, 512] and rope [n, 64]: request b's rows
    [append_indptr[b], append_indptr[b + 1]) fill the last slots of its pages (CSR table)."""
    arrays = [DeviceArray(_ints(a), stream) for a in (indptr, indices, last_page_len, append_indptr)]
    table = _capi.PageTableView(arrays[0].ptr, arrays[1].ptr, arrays[2].ptr, None, len(_ints(last_page_len)),
                                cache.view.page_size)
    lr, rr = _tensor(latent, name="latent"), _tensor(rope, name="rope")
    args = _capi.versioned(_capi.MlaAppendArgs)
    args.cache = cache.view
    args.table = ctypes.pointer(table)
    args.latent_new, args.rope_new = lr.ptr, rr.ptr
    args.input_dtype = _activation(latent, "latent", dtype)
    args.num_tokens = lr.shape[0]
    args.append_indptr = arrays[3].ptr
    _check(_lib.slimserve_mla_append(byref(args), _stream(stream)))
    _check(_lib.slimserve_stream_synchronize(_stream(stream)))  # the uploads above are freed next


class MlaDecodeWrapper:
    """Absorbed MLA decode: q [batch * query_tokens, heads, 576] -> o [.., heads, 512], over a
    block table ([batch, max_pages] ids + seq_lens)."""

    def __init__(self):
        self._plan = c_void_p()
        self._workspace: Optional[DeviceArray] = None

    def plan(self, block_table, seq_lens, num_heads: int, page_size: int, *, query_tokens: int = 1,
             kv_dtype: str = "bfloat16", scale_mode: str = "none", num_sms: int = 0, stream=None) -> None:
        block, lens = _ints(block_table), _ints(seq_lens)
        args = _capi.versioned(_capi.MlaPlanArgs)
        args.problem = _capi.MlaProblem(len(lens), num_heads, query_tokens, page_size, KV_DTYPES[kv_dtype],
                                        MLA_SCALE_MODES[scale_mode], 0, 0)
        args.seq_lens_host = lens.ctypes.data
        args.num_sms = num_sms
        size = c_size_t(0)
        _check(_lib.slimserve_mla_workspace_size(byref(args), byref(size)))
        if self._workspace is None or self._workspace.nbytes < max(size.value, 1):
            self._workspace = DeviceArray.empty(size.value)
        self._destroy_plan()
        _check(_lib.slimserve_mla_plan_create(byref(args), self._workspace.ptr, self._workspace.nbytes,
                                              _stream(stream), byref(self._plan)))
        self._arrays = [DeviceArray(block, stream), DeviceArray(lens, stream)]
        self._block_table = _capi.BlockTableView(self._arrays[0].ptr, None, self._arrays[1].ptr, len(lens),
                                                 block.shape[1], page_size)
        self.problem = args.problem

    def run(self, q, cache: MlaCache, sm_scale: float, *, out=None, lse=None, stream=None):
        if not self._plan:
            raise RuntimeError("slimserve: MlaDecodeWrapper.run before plan")
        p = self.problem
        qr = _tensor(q, name="q", shape=(p.batch_size * p.query_tokens, p.num_heads, 576),
                     dtypes=_ACTIVATION_NAMES[0])
        if out is None:
            out = _empty_like(q, shape=(qr.shape[0], p.num_heads, 512))
        args = _capi.versioned(_capi.MlaDecodeArgs)
        args.cache = cache.view
        args.block_table = ctypes.pointer(self._block_table)
        args.q = qr.ptr
        args.o = _tensor(out, name="out", shape=(qr.shape[0], p.num_heads, 512)).ptr
        if lse is not None:
            args.lse = _tensor(lse, name="lse", dtypes={"float32"}, shape=qr.shape[:2]).ptr
        args.sm_scale = sm_scale
        _check(_lib.slimserve_mla_decode_run(self._plan, byref(args), self._workspace.ptr, self._workspace.nbytes,
                                             _stream(stream)))
        if stream is None:
            _check(_lib.slimserve_stream_synchronize(None))
        return out

    def _destroy_plan(self):
        if self._plan:
            _lib.slimserve_mla_plan_destroy(self._plan)
            self._plan = c_void_p()

    def __del__(self):
        self._destroy_plan()
