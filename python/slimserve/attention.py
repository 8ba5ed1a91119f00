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
import sys
from ctypes import byref, c_size_t, c_void_p
from typing import Optional

import numpy as np

from . import (_activation, _capi, _check, _dtype_name, _empty_like, _host_ints, _lib, _stream, _tensor,
               ACTIVATION_DTYPES, DeviceArray, KV_DTYPES, PagedKVCache, RequestStatuses, SlimserveError,
               kv_dtype_name, type_error, value_error)

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
        raise value_error(f"slimserve: {name} must be a [tokens, heads, {inner}] view with unit stride "
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
    and themselves.

    Persistent buffers (CUDA graphs, FlashInfer's use_cuda_graph mode): the wrapper owns its
    workspace and device index arrays and keeps them across plans; a plan whose arrays fit
    writes into the same memory, so the pointers a captured run holds stay valid. With
    max_batch / max_total_qo_tokens / max_kv_tokens the workspace is sized once, for every
    plan up to them (slimserve_paged_attention_workspace_bound). `run(..., block_table=,
    seq_lens=)` reads caller-owned device tensors instead of the plan's copies: they must hold
    what was planned (the schedule comes from the plan's host lengths)."""

    def __init__(self, *, max_batch: int = 0, max_total_qo_tokens: int = 0, max_kv_tokens: int = 0):
        self._plan = c_void_p()
        self._workspace: Optional[DeviceArray] = None
        self._buffers = {}
        self._bound = (max_batch, max_total_qo_tokens, max_kv_tokens)

    def _upload(self, name: str, host: np.ndarray, stream) -> DeviceArray:
        buffer = self._buffers.get(name)
        if buffer is None or buffer.nbytes < host.nbytes:
            buffer = self._buffers[name] = DeviceArray(host, stream)
        else:
            buffer.upload(host, stream)
        return buffer

    def plan(self, qo_indptr, num_qo_heads: int, num_kv_heads: int, head_dim: int, page_size: int, *,
             kv_indptr=None, kv_indices=None, last_page_len=None, block_table=None, seq_lens=None,
             expected_tags=None, kv_dtype="bfloat16", q_dtype=None, causal: bool = True,
             num_sms: int = 0, min_chunk_tokens: int = 0, allow_split: bool = True,
             warpgroup_mma: bool = False, max_pages_per_request: int = 0,
             workspace: Optional[DeviceArray] = None, stream=None) -> None:
        """Either the CSR table (kv_indptr, kv_indices, last_page_len) or the block table
        ([batch, max_pages] page ids, seq_lens). Host arrays; the plan uploads its copies.
        `expected_tags` (the tags the requests hold their pages under, shaped like kv_indices
        or the block table) enables `check_tags`. `workspace` (optional) is used as given, so
        a short one is refused. seq_lens with max_pages_per_request and no block_table: the block
        table stays on the device, given to every run (`run(..., block_table=)`; page ids are
        then checked by the kernels, which read no page outside the cache). warpgroup_mma: the sm_90a wgmma prefill kernel where it
        applies (`info["reason"]` says whether it was taken)."""
        qo = _host_ints(qo_indptr, "qo_indptr")
        if qo.shape[0] < 1 or qo[0] != 0 or np.any(np.diff(qo) < 0):
            raise value_error("slimserve: qo_indptr must start at 0 and never decrease")
        kv_dtype = kv_dtype_name(kv_dtype, None, "kv_dtype")
        q_dtype = _dtype_name(q_dtype) or (kv_dtype if kv_dtype in ACTIVATION_DTYPES else "bfloat16")
        if q_dtype not in ACTIVATION_DTYPES:
            raise value_error(f"slimserve: q_dtype {q_dtype!r} (bfloat16 or float16)")
        batch = len(qo) - 1
        args = _capi.versioned(_capi.PagedAttentionPlanArgs)
        args.problem = _capi.PagedAttentionProblem(batch, num_qo_heads, num_kv_heads, head_dim, page_size,
                                                   KV_DTYPES[kv_dtype], ACTIVATION_DTYPES[q_dtype],
                                                   0 if causal else 1)
        args.qo_indptr_host = qo.ctypes.data
        host = {"qo_indptr": qo}
        if (seq_lens is None) == (kv_indptr is None):
            raise value_error("slimserve: give the CSR table (kv_indptr, kv_indices, last_page_len) or "
                              "seq_lens (with block_table or max_pages_per_request), exactly one")
        self._device_block_table = seq_lens is not None and block_table is None
        if self._device_block_table:
            if not isinstance(max_pages_per_request, (int, np.integer)) or max_pages_per_request < 1:
                raise value_error("slimserve: seq_lens without block_table needs max_pages_per_request >= 1 "
                                  "(the columns of the block table each run gives)")
            block = np.zeros((batch, int(max_pages_per_request)), np.int32)
            lens = _host_ints(seq_lens, "seq_lens", length=batch)
            if lens.size and (lens.min() < 0 or lens.max() > block.shape[1] * page_size):
                raise value_error(f"slimserve: seq_lens must be in 0..{block.shape[1] * page_size} "
                                  f"(block_table rows of {block.shape[1]} pages)")
            used = np.zeros(0, np.int32)
            host.update(seq_lens=lens)
            args.seq_lens_host = lens.ctypes.data
        elif block_table is not None:
            block = np.ascontiguousarray(np.asarray(block_table.cpu() if hasattr(block_table, "cpu")
                                                    else block_table), np.int32)
            if block.ndim != 2 or block.shape[0] != batch:
                raise value_error(f"slimserve: block_table has shape {block.shape}, expected [{batch}, max_pages]")
            lens = _host_ints(seq_lens, "seq_lens", length=batch)
            if lens.size and (lens.min() < 0 or lens.max() > block.shape[1] * page_size):
                raise value_error(f"slimserve: seq_lens must be in 0..{block.shape[1] * page_size} "
                                  f"(block_table rows of {block.shape[1]} pages)")
            used = [block[b, :(int(n) + page_size - 1) // page_size] for b, n in enumerate(lens)] if page_size > 0 else []
            used = np.concatenate(used) if used else np.zeros(0, np.int32)
            host.update(block_table=block, seq_lens=lens)
            args.seq_lens_host = lens.ctypes.data
        else:
            indptr = _host_ints(kv_indptr, "kv_indptr")
            indices, last = _host_ints(kv_indices, "kv_indices"), _host_ints(last_page_len, "last_page_len", length=batch)
            from . import _check_csr
            _check_csr(indptr, indices, last, page_size)
            used = indices
            host.update(kv_indptr=indptr, kv_indices=indices, last_page_len=last)
            args.kv_indptr_host, args.last_page_len_host = indptr.ctypes.data, last.ctypes.data
        if used.size and used.min() < 0:
            raise value_error(f"slimserve: the page table holds page id {int(used.min())}", "out_of_range")
        args.num_sms, args.min_chunk_tokens, args.disable_split = num_sms, min_chunk_tokens, 0 if allow_split else 1
        args.warpgroup_mma = 1 if warpgroup_mma else 0
        size = c_size_t(0)
        _check(_lib.slimserve_paged_attention_workspace_size(byref(args), byref(size)))
        if workspace is not None:
            if not isinstance(workspace, DeviceArray):
                raise type_error(f"slimserve: workspace must be a DeviceArray, got {type(workspace).__name__}")
            self._workspace = workspace
        elif self._workspace is None or self._workspace.nbytes < max(size.value, 1):
            self._workspace = DeviceArray.empty(max(size.value, self._bound_bytes(args.problem)))
        tags = None
        if expected_tags is not None:
            tags = np.ascontiguousarray(np.asarray(expected_tags), np.uint32)
            ids = block if seq_lens is not None else host["kv_indices"]
            if tags.shape != ids.shape:
                raise value_error(f"slimserve: expected_tags {tags.shape} must be shaped like the page ids {ids.shape}")
        self._destroy_plan()
        _check(_lib.slimserve_paged_attention_plan_create(byref(args), self._workspace.ptr, self._workspace.nbytes,
                                                          _stream(stream), byref(self._plan)))
        device = {name: self._upload(name, array, stream) for name, array in host.items()}
        tags_ptr = self._upload("expected_tags", tags, stream).ptr if tags is not None else None
        self._qo_indptr = device["qo_indptr"]
        self._table = self._block_table = None
        if seq_lens is not None:
            block_ptr = None if self._device_block_table else device["block_table"].ptr
            self._block_table = _capi.BlockTableView(block_ptr, tags_ptr, device["seq_lens"].ptr,
                                                     batch, block.shape[1], page_size)
        else:
            self._table = _capi.PageTableView(device["kv_indptr"].ptr, device["kv_indices"].ptr,
                                              device["last_page_len"].ptr, tags_ptr, batch, page_size)
        self.problem = args.problem
        self.num_tokens = int(qo[-1])
        self._max_page_id = int(used.max()) if used.size else -1

    def _bound_bytes(self, problem) -> int:
        max_batch, max_qo, max_kv = self._bound
        if not max_batch:
            return 0
        bound = _capi.versioned(_capi.PagedAttentionBound)
        bound.problem = problem
        bound.problem.batch_size = max_batch
        bound.max_total_qo_tokens, bound.max_kv_tokens = max_qo, max_kv
        size = c_size_t(0)
        _check(_lib.slimserve_paged_attention_workspace_bound(byref(bound), byref(size)))
        return size.value

    @property
    def workspace(self) -> Optional[DeviceArray]:
        """The plan's persistent device workspace (None before the first plan)."""
        return self._workspace

    def check_tags(self, tags, statuses: RequestStatuses, *, writers=None, stream=None) -> None:
        """The tag check over the planned table (CSR or block table): one verdict per request in
        `statuses`, which `run(..., statuses=statuses)` then honours (needs expected_tags)."""
        if not self._plan:
            raise SlimserveError("PagedAttentionWrapper.check_tags before plan", "failed_precondition")
        from . import _statuses_ptr
        statuses_ptr = _statuses_ptr(statuses, self.problem.batch_size, "the plan")
        keep = (DeviceArray(_host_ints(writers, "writers", np.uint32, self.problem.batch_size), stream)
                if writers is not None else None)
        writer_ptr = keep.ptr if keep is not None else None
        if self._block_table is not None:
            _check(_lib.slimserve_check_block_tags(byref(self._block_table), tags._handle, writer_ptr, None,
                                                   statuses_ptr, None, _stream(stream)))
        else:
            _check(_lib.slimserve_check_page_tags_owned(byref(self._table), tags._handle, writer_ptr, None,
                                                        statuses_ptr, None, _stream(stream)))
        if keep is not None:
            _check(_lib.slimserve_stream_synchronize(_stream(stream)))  # `keep` is freed next

    @property
    def info(self) -> dict:
        if not self._plan:
            raise SlimserveError("PagedAttentionWrapper.info before plan", "failed_precondition")
        info = _capi.versioned(_capi.PagedAttentionPlanInfo)
        _check(_lib.slimserve_paged_attention_plan_get_info(self._plan, byref(info)))
        return {"kernel": "cuda_core" if info.kernel == 1 else "tensor_core", "split_kv": bool(info.split_kv),
                "chunk_tokens": info.chunk_tokens, "num_work_items": info.num_work_items,
                "workspace_bytes": info.workspace_bytes,
                "reason": (info.reason or b"").decode()}

    def run(self, q, kv_cache: PagedKVCache, *, out=None, lse=None, sm_scale: Optional[float] = None,
            sliding_window: int = 0, logit_soft_cap: float = 0.0, sinks=None, chunk_k=None, chunk_v=None,
            statuses=None, block_table=None, seq_lens=None, stream=None,
            synchronize: Optional[bool] = None, rotation: str = "none"):
        """q [tokens, num_qo_heads, head_dim] (a view with a token/head stride is read in place)
        -> out (packed or a strided view). chunk_k/chunk_v [tokens, num_kv_heads, head_dim]:
        fused prefill, written into the chunk's slots (do not append them first). statuses:
        the tag check's verdicts (RequestStatuses, or an int32 [batch, 2] device tensor).
        block_table ([batch, max_pages] int32) and seq_lens ([batch] int32), device tensors
        holding the planned values, replace the plan's copies (block-table plans only).
        rotation: the rotation the cache was appended with ("none", "keys", "keys_and_values";
        head_dim 64, 128, 256): q and out are the unrotated ones, the kernel rotates them.
        Launches only; synchronize (default: when stream is None) waits before returning."""
        if not self._plan:
            raise SlimserveError("PagedAttentionWrapper.run before plan", "failed_precondition")
        from . import _check_cache_matches_plan, _rotation, _statuses_ptr
        p = self.problem
        _check_cache_matches_plan(kv_cache, p)
        rotation_value = _rotation(rotation, p.head_dim)  # refused by name before anything runs
        c = kv_cache.view
        if self._max_page_id >= c.num_pages:
            raise value_error(f"slimserve: the planned table holds page id {self._max_page_id}; the cache has "
                              f"{c.num_pages} pages", "out_of_range")
        qr = _tensor(q, name="q", strided=True, dtypes=_ACTIVATION_NAMES[p.q_dtype])
        if qr.shape != (self.num_tokens, p.num_qo_heads, p.head_dim):
            raise value_error(f"slimserve: q has shape {qr.shape}, the plan needs "
                              f"{(self.num_tokens, p.num_qo_heads, p.head_dim)}")
        if out is None:
            out = _empty_like(q, shape=qr.shape)
        orr = _tensor(out, name="out", strided=True, shape=qr.shape, dtypes={qr.dtype})
        args = _capi.versioned(_capi.PagedAttentionArgs)
        args.cache = c
        args.kv_page_stride = kv_cache.page_stride
        if self._table is not None:
            if block_table is not None or seq_lens is not None:
                raise value_error("slimserve: block_table/seq_lens given to a run planned with a CSR table")
            args.table = ctypes.pointer(self._table)
        else:
            view = self._block_table
            if block_table is not None or seq_lens is not None:
                view = _capi.BlockTableView(view.block_table, view.expected_tags, view.seq_lens, view.batch_size,
                                            view.max_pages_per_request, view.page_size)
                if block_table is not None:
                    br = _tensor(block_table, name="block_table", dtypes={"int32"}, ndim=2)
                    if br.shape[0] != p.batch_size or br.shape[1] < 1:
                        raise value_error(f"slimserve: block_table has shape {br.shape}; the plan has "
                                          f"{p.batch_size} requests")
                    if (view.expected_tags or self._device_block_table) and br.shape[1] != view.max_pages_per_request:
                        raise value_error(f"slimserve: block_table has {br.shape[1]} columns; the planned "
                                          f"expected_tags have {view.max_pages_per_request}")
                    view.block_table, view.max_pages_per_request = br.ptr, br.shape[1]
                if seq_lens is not None:
                    view.seq_lens = _tensor(seq_lens, name="seq_lens", dtypes={"int32"}, shape=(p.batch_size,)).ptr
            args.block_table = ctypes.pointer(view)
        if self._block_table is not None and self._device_block_table and block_table is None:
            raise type_error("slimserve: this plan keeps no block table: give run(..., block_table=) "
                             "(the device tensor)")
        args.statuses = _statuses_ptr(statuses, p.batch_size, "the plan")
        args.qo_indptr = self._qo_indptr.ptr
        args.q, args.o = qr.ptr, orr.ptr
        args.q_token_stride, args.q_head_stride = _strides(qr, "q", p.head_dim)
        args.o_token_stride, args.o_head_stride = _strides(orr, "out", p.head_dim)
        if lse is not None:
            args.lse = _tensor(lse, name="lse", dtypes={"float32"}, shape=qr.shape[:2]).ptr
        if sm_scale is not None and (not np.isfinite(sm_scale) or sm_scale < 0):
            raise value_error(f"slimserve: sm_scale must be finite and > 0, got {sm_scale}")
        args.sm_scale = 0.0 if sm_scale is None else sm_scale
        args.sliding_window, args.logit_soft_cap = sliding_window, logit_soft_cap
        # The cache's rotation (append_kv's): the kernel rotates q, and for keys_and_values the
        # output back, itself (no rotate_heads around the call).
        args.rotation = rotation_value
        keep = []
        if sinks is not None:
            sink_ref = _tensor(sinks, name="sinks", dtypes={"float32"}, shape=(p.num_qo_heads,))
            args.sinks = sink_ref.ptr
        if chunk_k is not None or chunk_v is not None:
            chunk_shape = (self.num_tokens, p.num_kv_heads, p.head_dim)
            kr = _tensor(chunk_k, name="chunk_k", strided=True, dtypes={qr.dtype}, shape=chunk_shape)
            vr = _tensor(chunk_v, name="chunk_v", strided=True, dtypes={qr.dtype}, shape=chunk_shape)
            k_strides, v_strides = _strides(kr, "chunk_k", p.head_dim), _strides(vr, "chunk_v", p.head_dim)
            if k_strides != v_strides:
                raise value_error(f"slimserve: chunk_k strides {k_strides} and chunk_v strides {v_strides} differ")
            args.chunk_k, args.chunk_v = kr.ptr, vr.ptr
            args.chunk_token_stride, args.chunk_head_stride = k_strides
            keep += [kr, vr]
        _check(_lib.slimserve_paged_attention_run(self._plan, byref(args), self._workspace.ptr,
                                                  self._workspace.nbytes, _stream(stream)))
        if synchronize if synchronize is not None else stream is None:
            _check(_lib.slimserve_stream_synchronize(_stream(stream)))
        return out

    def _destroy_plan(self):
        if self._plan:
            _lib.slimserve_paged_attention_plan_destroy(self._plan)
            self._plan = c_void_p()

    def __del__(self, _exiting=sys.is_finalizing):
        if not _exiting():  # at interpreter exit the module's globals may be gone
            self._destroy_plan()


# ---- MLA -----------------------------------------------------------------------------------------

def _scale_mode(scale_mode: str) -> int:
    if scale_mode not in MLA_SCALE_MODES:
        raise value_error(f"slimserve: MLA scale_mode {scale_mode!r} (one of {sorted(MLA_SCALE_MODES)})")
    return MLA_SCALE_MODES[scale_mode]


def mla_record_bytes(kv_dtype: str = "bfloat16", scale_mode: str = "none") -> int:
    """Bytes of one cached token (0 for an unsupported combination)."""
    return int(_lib.slimserve_mla_record_bytes(KV_DTYPES[kv_dtype_name(kv_dtype, None, "kv_dtype")],
                                               _scale_mode(scale_mode)))


class MlaCache:
    """A paged latent cache: a uint8 array [num_pages, page_size, record bytes]."""

    def __init__(self, pages, *, kv_dtype: str = "bfloat16", scale_mode: str = "none", latent_scale=None):
        r = _tensor(pages, name="pages", dtypes={"uint8"})
        kv_dtype = kv_dtype_name(kv_dtype, None, "kv_dtype")
        if len(r.shape) != 3 or r.shape[2] != mla_record_bytes(kv_dtype, scale_mode):
            raise value_error(f"slimserve: MLA pages {r.shape} must be [num_pages, page_size, "
                             f"{mla_record_bytes(kv_dtype, scale_mode)}] for {kv_dtype}/{scale_mode}")
        self._keep = [pages]
        self.view = _capi.MlaCache(r.ptr, None, r.shape[0], r.shape[1], KV_DTYPES[kv_dtype],
                                   MLA_SCALE_MODES[scale_mode])
        if latent_scale is not None:
            from . import _check_scale_value
            scale = DeviceArray(np.array([_check_scale_value(latent_scale, "latent_scale", kv_dtype)], np.float32))
            self._keep.append(scale)
            self.view.latent_scale = scale.ptr.value


def mla_append(cache: MlaCache, indptr, indices, last_page_len, latent, rope, *, append_indptr,
               dtype: Optional[str] = None, stream=None) -> None:
    """Quantize-and-append new tokens' latent [n, 512] and rope [n, 64]: request b's rows
    [append_indptr[b], append_indptr[b + 1]) fill the last slots of its pages (CSR table)."""
    from . import _check_csr
    indptr, indices = _host_ints(indptr, "indptr"), _host_ints(indices, "indices")
    last, append = _host_ints(last_page_len, "last_page_len"), _host_ints(append_indptr, "append_indptr")
    _check_csr(indptr, indices, last, cache.view.page_size)
    if indices.size and indices.max() >= cache.view.num_pages:
        raise value_error(f"slimserve: page id {int(indices.max())} outside the cache's {cache.view.num_pages} pages",
                          "out_of_range")
    lr = _tensor(latent, name="latent", ndim=2)
    if lr.shape[1] != 512:
        raise value_error(f"slimserve: latent has shape {lr.shape}, expected [num_tokens, 512]")
    rr = _tensor(rope, name="rope", shape=(lr.shape[0], 64), dtypes={lr.dtype})
    if append.shape[0] != len(last) + 1 or append[0] != 0 or append[-1] != lr.shape[0] or np.any(np.diff(append) < 0):
        raise value_error(f"slimserve: append_indptr must run from 0 to num_tokens = {lr.shape[0]} over "
                          f"{len(last) + 1} entries, never decreasing")
    arrays = [DeviceArray(a, stream) for a in (indptr, indices, last, append)]
    table = _capi.PageTableView(arrays[0].ptr, arrays[1].ptr, arrays[2].ptr, None, len(last),
                                cache.view.page_size)
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
             kv_dtype: str = "bfloat16", scale_mode: str = "none", num_sms: int = 0,
             warpgroup_mma: bool = False, stream=None) -> None:
        """warpgroup_mma: the sm_90a wgmma kernel for requests of >= 64 rows (docs/mla.md)."""
        block, lens = _ints(block_table), _host_ints(seq_lens, "seq_lens")
        if block.ndim != 2 or block.shape[0] != len(lens):
            raise value_error(f"slimserve: block_table has shape {block.shape}, expected [{len(lens)}, max_pages]")
        if lens.size and (lens.min() < 0 or lens.max() > block.shape[1] * page_size):
            raise value_error(f"slimserve: seq_lens must be in 0..{block.shape[1] * page_size}")
        used = [block[b, :(int(n) + page_size - 1) // page_size] for b, n in enumerate(lens)] if page_size > 0 else []
        used = np.concatenate(used) if used else np.zeros(0, np.int32)
        if used.size and used.min() < 0:
            raise value_error(f"slimserve: block_table holds page id {int(used.min())}", "out_of_range")
        self._max_page_id = int(used.max()) if used.size else -1
        args = _capi.versioned(_capi.MlaPlanArgs)
        args.problem = _capi.MlaProblem(len(lens), num_heads, query_tokens, page_size,
                                        KV_DTYPES[kv_dtype_name(kv_dtype, None, "kv_dtype")],
                                        _scale_mode(scale_mode), 0, 0)
        args.seq_lens_host = lens.ctypes.data
        args.num_sms = num_sms
        args.warpgroup_mma = 1 if warpgroup_mma else 0
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
            raise SlimserveError("MlaDecodeWrapper.run before plan", "failed_precondition")
        p = self.problem
        if not isinstance(cache, MlaCache):
            raise type_error(f"slimserve: cache must be an MlaCache, got {type(cache).__name__}")
        c = cache.view
        if (c.page_size, c.dtype, c.scale_mode) != (p.page_size, p.kv_dtype, p.scale_mode):
            raise value_error(f"slimserve: the MLA cache (page_size {c.page_size}, dtype {c.dtype}, scale mode "
                              f"{c.scale_mode}) does not match the plan (page_size {p.page_size}, dtype "
                              f"{p.kv_dtype}, scale mode {p.scale_mode})")
        if self._max_page_id >= c.num_pages:
            raise value_error(f"slimserve: the planned block table holds page id {self._max_page_id}; the cache has "
                              f"{c.num_pages} pages", "out_of_range")
        qr = _tensor(q, name="q", shape=(p.batch_size * p.query_tokens, p.num_heads, 576),
                     dtypes=_ACTIVATION_NAMES[0])
        if out is None:
            out = _empty_like(q, shape=(qr.shape[0], p.num_heads, 512))
        args = _capi.versioned(_capi.MlaDecodeArgs)
        args.cache = cache.view
        args.block_table = ctypes.pointer(self._block_table)
        args.q = qr.ptr
        args.o = _tensor(out, name="out", shape=(qr.shape[0], p.num_heads, 512), dtypes={qr.dtype}).ptr
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

    def __del__(self, _exiting=sys.is_finalizing):
        if not _exiting():  # at interpreter exit the module's globals may be gone
            self._destroy_plan()
