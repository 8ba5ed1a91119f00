"""slimserve kernels as `torch.library` custom ops (imported by `slimserve` when PyTorch is).

Shaped like the calls engines already make:
  torch.ops.slimserve.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping,
                                        kv_cache_dtype, k_scale, v_scale)      # vLLM-style
  torch.ops.slimserve.paged_decode(q, k_cache, v_cache, indptr, indices, last_page_len,
                                   kv_cache_dtype, layout, sm_scale, k_scale, v_scale)
  torch.ops.slimserve.paged_attention(q, k_cache, v_cache, qo_indptr, block_table, seq_lens,
                                      kv_cache_dtype, sm_scale, sliding_window, logit_soft_cap,
                                      sinks, k_scale, v_scale)   # prefill / append / decode
  torch.ops.slimserve.gemm_w4a16(a, packed, scales, zeros, bias, group_size)
Each has a fake (meta) implementation, so torch.compile traces them without running kernels.
On the CPU-emulated library the tensors are CPU tensors; on the GPU library, CUDA tensors (the
current stream is used).
"""
from __future__ import annotations

import math
from typing import Optional

import torch

import slimserve as _s

if not hasattr(torch, "library") or not hasattr(torch.library, "custom_op"):
    raise ImportError("slimserve.torch_ops needs torch >= 2.4 (torch.library.custom_op)")


def _stream_of(t: torch.Tensor):
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else None


def _kv_dtype(cache: torch.Tensor, kv_cache_dtype: str) -> Optional[str]:
    if kv_cache_dtype != "auto":
        return kv_cache_dtype
    return {torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(cache.dtype)


def _scale(scale: Optional[torch.Tensor]):
    return None if scale is None else scale.reshape(1).to(torch.float32)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """FP8 caches cross as uint8 (DLPack has no portable FP8 code in older PyTorch)."""
    return t.view(torch.uint8) if t.element_size() == 1 and t.dtype != torch.uint8 else t


@torch.library.custom_op("slimserve::reshape_and_cache", mutates_args=("key_cache", "value_cache"))
def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                      value_cache: torch.Tensor, slot_mapping: torch.Tensor, kv_cache_dtype: str,
                      k_scale: Optional[torch.Tensor], v_scale: Optional[torch.Tensor]) -> None:
    _s.reshape_and_cache(key.contiguous(), value.contiguous(), _bits(key_cache), _bits(value_cache),
                         slot_mapping, _kv_dtype(key_cache, kv_cache_dtype) or "auto",
                         _scale(k_scale), _scale(v_scale), stream=_stream_of(key))


@reshape_and_cache.register_fake
def _(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale) -> None:
    return None


@torch.library.custom_op("slimserve::paged_decode", mutates_args=())
def paged_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 indptr: torch.Tensor, indices: torch.Tensor, last_page_len: torch.Tensor,
                 kv_cache_dtype: str, layout: str, sm_scale: float,
                 k_scale: Optional[torch.Tensor], v_scale: Optional[torch.Tensor]) -> torch.Tensor:
    dtype = _kv_dtype(k_cache, kv_cache_dtype)
    cache = _s.PagedKVCache(_bits(k_cache), _bits(v_cache), layout=layout, dtype=dtype,
                            k_scale=_scale(k_scale), v_scale=_scale(v_scale))
    wrapper = _s.DecodeWrapper()
    wrapper.plan(indptr.cpu().numpy(), indices.cpu().numpy(), last_page_len.cpu().numpy(),
                 q.shape[1], cache.view.num_kv_heads, cache.view.head_dim, cache.view.page_size,
                 dtype, stream=_stream_of(q))
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
    dtype = _kv_dtype(k_cache, kv_cache_dtype)
    cache = _s.PagedKVCache(_bits(k_cache), _bits(v_cache), dtype=dtype,
                            k_scale=_scale(k_scale), v_scale=_scale(v_scale))
    q_dtype = {torch.bfloat16: "bfloat16", torch.float16: "float16"}[q.dtype]
    wrapper = _s.PagedAttentionWrapper()
    wrapper.plan(qo_indptr.cpu().numpy(), q.shape[1], cache.view.num_kv_heads, cache.view.head_dim,
                 cache.view.page_size, block_table=block_table.cpu().numpy(), seq_lens=seq_lens.cpu().numpy(),
                 kv_dtype=dtype, q_dtype=q_dtype, stream=_stream_of(q))
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
        name = {torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(kv_data_type, kv_data_type)
        as_numpy = lambda t: t.cpu().numpy() if isinstance(t, torch.Tensor) else t  # noqa: E731
        self._wrapper.plan(as_numpy(indptr), as_numpy(indices), as_numpy(last_page_len),
                           num_qo_heads, num_kv_heads, head_dim, page_size, name)
        self._dtype = name

    def run(self, q: torch.Tensor, paged_kv_cache, *, k_scale=None, v_scale=None,
            sm_scale: Optional[float] = None) -> torch.Tensor:
        k_cache, v_cache = paged_kv_cache
        cache = _s.PagedKVCache(_bits(k_cache), _bits(v_cache), layout=self._layout,
                                dtype=self._dtype, k_scale=_scale(k_scale), v_scale=_scale(v_scale))
        scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(q.shape[-1])
        return self._wrapper.run(q.contiguous(), cache, sm_scale=scale, stream=_stream_of(q))
