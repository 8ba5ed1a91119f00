"""slimserve kernels as `torch.library` custom ops (imported by `slimserve` when PyTorch is).

Capturable ops, shaped like the calls engines make (plan once per batch on the host, run per
layer with launches only: no host synchronization, no allocation, so a CUDA graph can capture
the run and replay it after the next plan has rewritten the persistent buffers):

  plan = slimserve.torch_ops.PagedAttentionPlan(num_qo_heads, num_kv_heads, head_dim, page_size,
             kv_cache_dtype="auto", q_dtype=torch.bfloat16, max_batch=..., max_num_tokens=...,
             max_seq_len=..., max_pages_per_request=...)                    # once
  plan.plan(qo_indptr, seq_lens)           # per batch: HOST int tensors / arrays; writes the
                                           # plan's persistent device buffers (workspace,
                                           # qo_indptr) in place
  torch.ops.slimserve.paged_attention_run(q, k_cache, v_cache, block_table, seq_lens, out,
      statuses, plan.id, kv_cache_dtype, kv_layout, sm_scale, k_scale, v_scale)   # per layer
  torch.ops.slimserve.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping,
      kv_cache_dtype, k_scale, v_scale)    # vLLM's call; slot_mapping int64 on the device
  torch.ops.slimserve.reshape_and_cache_layout(..., kv_layout)   # the same, NHD or HND

block_table ([batch, max_pages_per_request] int32) and seq_lens ([batch] int32) are the
engine's own device tensors; they must hold what `plan.plan` was given (the schedule comes
from the host lengths). out ([tokens, heads, head_dim], q's dtype) is written in place;
statuses (an int32 [>= batch, 2] device tensor written by the tag check, or None) makes the run
skip aborted requests (their rows NaN). kv_cache_dtype: vLLM's names ("auto", "fp8",
"fp8_e4m3", "fp8_e5m2", "bfloat16", ...); the caches may be uint8 or torch.float8_e4m3fn /
float8_e5m2 tensors. k_scale / v_scale: one-element float32 device tensors (read by the kernels
at run time: a captured graph sees their current values); `slimserve.reshape_and_cache` also
takes floats. k_cache / v_cache may be views of one combined allocation
(kv_cache[:, 0] / kv_cache[:, 1]: pages further apart than their size).

A captured run stays valid while the schedule's shape does not change: `plan.plan` raises
SlimserveError (failed_precondition) when `use_cuda_graph=True` and a new batch would launch
another grid (batch size, query lengths, split); capture again then. allow_split=False (the
default here) keeps the grid independent of the sequence lengths.

Convenience ops that plan inside the call (simple, not capturable):
  torch.ops.slimserve.paged_decode(...), torch.ops.slimserve.paged_attention(...),
  torch.ops.slimserve.gemm_w4a16(...).
Each op has a fake (meta) implementation, so torch.compile traces them without running kernels.
On the CPU-emulated library the tensors are CPU tensors; on the GPU library, CUDA tensors (the
current stream is used).
"""
from __future__ import annotations

import itertools
import math
import weakref
from typing import Optional

import numpy as np
import torch

import slimserve as _s
from slimserve._errors import SlimserveError, type_error, value_error

if not hasattr(torch, "library") or not hasattr(torch.library, "custom_op"):
    raise ImportError("slimserve.torch_ops needs torch >= 2.4 (torch.library.custom_op)")


def _stream_of(t: torch.Tensor):
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else None


def _kv_dtype(cache: torch.Tensor, kv_cache_dtype) -> str:
    return _s.kv_dtype_name(kv_cache_dtype, _s._dtype_name(cache.dtype))


def _scale(scale: Optional[torch.Tensor], name: str):
    """A one-element float32 tensor as it is (no copy: the kernels read it at run time)."""
    if scale is None:
        return None
    if scale.dtype != torch.float32 or scale.numel() != 1:
        raise type_error(f"slimserve: {name} must be a one-element float32 tensor, got {scale.dtype} "
                         f"of shape {tuple(scale.shape)}")
    return scale


def _bits(t: torch.Tensor) -> torch.Tensor:
    """FP8 caches cross as uint8 when the DLPack of this PyTorch has no FP8 codes."""
    if t.element_size() == 1 and t.dtype not in (torch.uint8, torch.int8):
        try:
            t.__dlpack__()
        except (TypeError, RuntimeError, BufferError):
            return t.view(torch.uint8)
    return t


def _cache(k_cache, v_cache, kv_cache_dtype, layout, k_scale, v_scale) -> "_s.PagedKVCache":
    dtype = _kv_dtype(k_cache, kv_cache_dtype)
    return _s.PagedKVCache(_bits(k_cache), None if v_cache is None else _bits(v_cache), layout=layout,
                           dtype=dtype, k_scale=_scale(k_scale, "k_scale"), v_scale=_scale(v_scale, "v_scale"))


def _reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale,
                       layout) -> None:
    cache = _cache(key_cache, value_cache, kv_cache_dtype, layout, k_scale, v_scale)
    kr, vr = cache.check_rows(key, value, "key", "value", strided=True)
    slots = _s._tensor(slot_mapping, name="slot_mapping", dtypes={"int64"}, shape=(kr.shape[0],))
    _s._kv_append(cache, kr, vr, _s._activation(kr, "key", None), slot_mapping=slots.ptr,
                  stream=_stream_of(key), names=("key", "value"))


@torch.library.custom_op("slimserve::reshape_and_cache", mutates_args=("key_cache", "value_cache"))
def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                      value_cache: torch.Tensor, slot_mapping: torch.Tensor, kv_cache_dtype: str,
                      k_scale: Optional[torch.Tensor], v_scale: Optional[torch.Tensor]) -> None:
    """vLLM's reshape_and_cache(_flash) on NHD caches [num_pages, page_size, H, D]: token t goes
    to flat slot slot_mapping[t] (int64, on the device; -1 skips). key / value: [tokens, H, D],
    packed or strided views of a fused QKV output (rows a multiple of 8 elements apart, heads
    contiguous), read in place. Launch only."""
    _reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale, "NHD")


@reshape_and_cache.register_fake
def _(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale) -> None:
    return None


@torch.library.custom_op("slimserve::reshape_and_cache_layout", mutates_args=("key_cache", "value_cache"))
def reshape_and_cache_layout(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                             value_cache: torch.Tensor, slot_mapping: torch.Tensor, kv_cache_dtype: str,
                             k_scale: Optional[torch.Tensor], v_scale: Optional[torch.Tensor],
                             kv_layout: str) -> None:
    """reshape_and_cache for NHD or HND ([num_pages, H, page_size, D], FlashInfer's) caches."""
    _reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale,
                       kv_layout)


@reshape_and_cache_layout.register_fake
def _(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale, kv_layout) -> None:
    return None


# ---- capturable paged attention: a plan object, a run op ---------------------------------------

_plans: "weakref.WeakValueDictionary[int, PagedAttentionPlan]" = weakref.WeakValueDictionary()
_plan_ids = itertools.count(1)


class PagedAttentionPlan:
    """The host half of paged attention for one layer shape (FlashInfer's use_cuda_graph
    wrapper): persistent device buffers sized once for max_batch requests, max_num_tokens
    query tokens per step and sequences up to max_seq_len, and a `plan` per batch that fills
    them. `id` names it to torch.ops.slimserve.paged_attention_run. Keep the object alive while
    runs (or graphs that captured them) use it."""

    def __init__(self, num_qo_heads: int, num_kv_heads: int, head_dim: int, page_size: int, *,
                 kv_cache_dtype="auto", q_dtype=torch.bfloat16, max_batch: int, max_num_tokens: int,
                 max_seq_len: int, max_pages_per_request: Optional[int] = None, causal: bool = True,
                 allow_split: bool = False, warpgroup_mma: bool = False, use_cuda_graph: bool = True):
        for name, value in (("max_batch", max_batch), ("max_num_tokens", max_num_tokens),
                            ("max_seq_len", max_seq_len)):
            if not isinstance(value, int) or value < 1:
                raise value_error(f"slimserve: {name} must be a positive int, got {value!r}")
        if kv_cache_dtype == "auto":
            kv_cache_dtype = q_dtype  # an "auto" cache holds the activations' type
        self.kv_cache_dtype = _s.kv_dtype_name(kv_cache_dtype, None, "kv_cache_dtype")
        self.q_dtype = _s._dtype_name(q_dtype)
        self.shape = (num_qo_heads, num_kv_heads, head_dim, page_size)
        self.max_pages_per_request = max_pages_per_request or -(-max_seq_len // max(page_size, 1))
        self.options = dict(causal=causal, allow_split=allow_split, warpgroup_mma=warpgroup_mma)
        self.use_cuda_graph = use_cuda_graph
        self.wrapper = _s.PagedAttentionWrapper(max_batch=max_batch, max_total_qo_tokens=max_num_tokens,
                                                max_kv_tokens=max_seq_len)
        self._limits = (max_batch, max_num_tokens, max_seq_len)
        self._graph_key = None
        self.id = next(_plan_ids)
        _plans[self.id] = self

    def plan(self, qo_indptr, seq_lens) -> None:
        """Host qo_indptr [batch + 1] and seq_lens [batch] (CPU tensors, NumPy arrays or lists):
        schedules the batch and writes the persistent buffers. Not capturable (host work)."""
        qo = _s._host_ints(qo_indptr, "qo_indptr")
        lens = _s._host_ints(seq_lens, "seq_lens")
        max_batch, max_tokens, max_seq_len = self._limits
        if len(lens) > max_batch or (qo.size and qo[-1] > max_tokens) or (lens.size and lens.max() > max_seq_len):
            raise value_error(f"slimserve: a batch of {len(lens)} requests, {int(qo[-1]) if qo.size else 0} tokens, "
                              f"longest {int(lens.max()) if lens.size else 0}, exceeds the plan's limits "
                              f"({max_batch} requests, {max_tokens} tokens, {max_seq_len} per request)")
        heads, kv_heads, head_dim, page_size = self.shape
        before = (self.wrapper.workspace.ptr.value if self.wrapper.workspace is not None else None,
                  getattr(self.wrapper, "_qo_indptr", None))
        self.wrapper.plan(qo, heads, kv_heads, head_dim, page_size, seq_lens=lens,
                          max_pages_per_request=self.max_pages_per_request, kv_dtype=self.kv_cache_dtype,
                          q_dtype=self.q_dtype, **self.options)
        info = self.wrapper.info
        # What a captured launch holds fixed: the grid and the schedule's shape (a chunk length
        # matters only when the plan splits).
        key = (len(lens), tuple(np.diff(qo).tolist()), info["kernel"], info["split_kv"], info["num_work_items"],
               info["chunk_tokens"] if info["split_kv"] else 0)
        if self.use_cuda_graph and self._graph_key is not None:
            moved = before[0] is not None and before[0] != self.wrapper.workspace.ptr.value
            if key != self._graph_key or moved:
                self._graph_key = key
                raise SlimserveError("this batch launches another grid than the one planned before (batch size, "
                                     "query lengths or split changed): a graph captured on the earlier plan "
                                     "must be captured again; the plan itself was made", "failed_precondition")
        self._graph_key = key
        self.num_tokens = int(qo[-1])

    @property
    def buffers(self) -> dict:
        """The device pointers a captured run holds (stable across plans)."""
        return {"workspace": self.wrapper.workspace.ptr.value,
                "qo_indptr": self.wrapper._qo_indptr.ptr.value}


def _plan_of(plan_id: int) -> PagedAttentionPlan:
    plan = _plans.get(plan_id)
    if plan is None:
        raise SlimserveError(f"no live PagedAttentionPlan has id {plan_id}", "failed_precondition")
    return plan


@torch.library.custom_op("slimserve::paged_attention_run", mutates_args=("out",))
def paged_attention_run(q: torch.Tensor, k_cache: torch.Tensor, v_cache: Optional[torch.Tensor],
                        block_table: torch.Tensor, seq_lens: torch.Tensor, out: torch.Tensor,
                        statuses: Optional[torch.Tensor], plan_id: int, kv_cache_dtype: str, kv_layout: str,
                        sm_scale: float, k_scale: Optional[torch.Tensor], v_scale: Optional[torch.Tensor],
                        rotation: str = "none") -> None:
    """Paged attention over the engine's block table under a PagedAttentionPlan: launches only
    (no synchronization, no allocation). v_cache None: k_cache is the combined [pages, 2, ...]
    allocation. sm_scale 0: 1/sqrt(head_dim). rotation: the cache's (append_kv's); q and out
    are the unrotated ones (the kernel rotates them)."""
    plan = _plan_of(plan_id)
    cache = _cache(k_cache, v_cache, kv_cache_dtype, kv_layout, k_scale, v_scale)
    plan.wrapper.run(q, cache, out=out, sm_scale=sm_scale or None, statuses=statuses, block_table=block_table,
                     seq_lens=seq_lens, stream=_stream_of(q), synchronize=False, rotation=rotation)


@paged_attention_run.register_fake
def _(q, k_cache, v_cache, block_table, seq_lens, out, statuses, plan_id, kv_cache_dtype, kv_layout, sm_scale,
      k_scale, v_scale, rotation="none") -> None:
    return None


# ---- convenience ops (plan inside the call; not capturable) --------------------------------------

def _host(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


@torch.library.custom_op("slimserve::paged_decode", mutates_args=())
def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 indptr: torch.Tensor, indices: torch.Tensor, last_page_len: torch.Tensor,
                 kv_cache_dtype: str, layout: str, sm_scale: float,
                 k_scale: Optional[torch.Tensor], v_scale: Optional[torch.Tensor]) -> torch.Tensor:
    cache = _cache(k_cache, v_cache, kv_cache_dtype, layout, k_scale, v_scale)
    wrapper = _s.DecodeWrapper()
    wrapper.plan(_host(indptr), _host(indices), _host(last_page_len), q.shape[1], cache.view.num_kv_heads,
                 cache.view.head_dim, cache.view.page_size, cache.dtype, stream=_stream_of(q))
    return wrapper.run(q.contiguous(), cache, sm_scale=sm_scale, stream=_stream_of(q))


@paged_decode.register_fake
def _(q, k_cache, v_cache, indptr, indices, last_page_len, kv_cache_dtype, layout, sm_scale,
      k_scale, v_scale):
    return torch.empty_like(q)


@torch.library.custom_op("slimserve::paged_attention", mutates_args=())
def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    qo_indptr: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor,
                    kv_cache_dtype: str, sm_scale: float, sliding_window: int, logit_soft_cap: float,
                    sinks: Optional[torch.Tensor], k_scale: Optional[torch.Tensor],
                    v_scale: Optional[torch.Tensor]) -> torch.Tensor:
    """Tensor-core paged attention over a vLLM-style block table (NHD caches): request b's
    query rows [qo_indptr[b], qo_indptr[b + 1]) are its last positions of seq_lens[b];
    sm_scale 0 is 1/sqrt(head_dim), sliding_window 0 and logit_soft_cap 0 are none."""
    cache = _cache(k_cache, v_cache, kv_cache_dtype, "NHD", k_scale, v_scale)
    wrapper = _s.PagedAttentionWrapper()
    wrapper.plan(_host(qo_indptr), q.shape[1], cache.view.num_kv_heads, cache.view.head_dim,
                 cache.view.page_size, block_table=_host(block_table), seq_lens=_host(seq_lens),
                 kv_dtype=cache.dtype, q_dtype=_s._dtype_name(q.dtype), stream=_stream_of(q))
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    return wrapper.run(q, cache, out=out, sm_scale=sm_scale or None, sliding_window=sliding_window,
                       logit_soft_cap=logit_soft_cap,
                       sinks=None if sinks is None else sinks.to(torch.float32).contiguous(),
                       stream=_stream_of(q))


@paged_attention.register_fake
def _(q, k_cache, v_cache, qo_indptr, block_table, seq_lens, kv_cache_dtype, sm_scale, sliding_window,
      logit_soft_cap, sinks, k_scale, v_scale):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


@torch.library.custom_op("slimserve::gemm_w4a16", mutates_args=())
def gemm_w4a16(a: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor,
               zeros: Optional[torch.Tensor], bias: Optional[torch.Tensor],
               group_size: int) -> torch.Tensor:
    return _s.gemm_w4a16(a.contiguous(), packed, scales, zeros, group_size, bias=bias,
                         stream=_stream_of(a))


@gemm_w4a16.register_fake
def _(a, packed, scales, zeros, bias, group_size):
    return a.new_empty((a.shape[0], packed.numel() * 8 // a.shape[1]))


class BatchDecodeWrapper:
    """FlashInfer-shaped wrapper for PyTorch engines: plan(...) then run(q, (k_cache, v_cache))."""

    def __init__(self, kv_layout: str = "NHD"):
        self._layout = kv_layout
        self._wrapper = _s.DecodeWrapper()

    def plan(self, indptr, indices, last_page_len, num_qo_heads: int, num_kv_heads: int,
             head_dim: int, page_size: int, kv_data_type=torch.bfloat16) -> None:
        self._dtype = _s.kv_dtype_name(kv_data_type, None, "kv_data_type")
        self._wrapper.plan(indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
                           self._dtype)

    def run(self, q: torch.Tensor, paged_kv_cache, *, k_scale=None, v_scale=None,
            sm_scale: Optional[float] = None, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        if isinstance(paged_kv_cache, torch.Tensor):
            k_cache, v_cache = paged_kv_cache, None  # combined [pages, 2, ...]
        else:
            k_cache, v_cache = paged_kv_cache
        cache = _s.PagedKVCache(_bits(k_cache), None if v_cache is None else _bits(v_cache), layout=self._layout,
                                dtype=self._dtype, k_scale=k_scale, v_scale=v_scale)
        scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(q.shape[-1])
        return self._wrapper.run(q, cache, out=out, sm_scale=scale, stream=_stream_of(q))
