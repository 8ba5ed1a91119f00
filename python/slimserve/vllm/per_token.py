"""FP8 KV pages with per-token scales: one float32 scale per (token, KV head) for K and one for
V, set by slimserve's append (that vector's amax / the format's max) instead of vLLM's one
per-tensor scale. Selected with SLIMSERVE_KV_SCALES=per_token beside an FP8 kv_cache_dtype
(fp8 / fp8_e4m3 / fp8_e5m2); see docs/vllm.md.

The FP8 pages stay inside vLLM's cache tensor as layout.py describes; the scales live in two
[num_blocks, block_size, kv_heads] float32 arrays per layer beside it (4 B per token per KV
head each: +6.25 % over the FP8 data at head_dim 64), allocated at the layer's first step.
vLLM does not know about them: its KV memory budget leaves them out, and a KV connector that
moves blocks does not move their scales (not supported with this mode).

The append writes every token's scales with its pages (slot form, vLLM's slot_mapping, over the
combined K/V allocation), and paged attention reads them; a block vLLM zeroes is rewritten
with its scales before any token of it is read."""
from __future__ import annotations

from typing import Optional

import torch

import slimserve as _s

from . import stats, support
from .backend import SlimserveAttentionBackend
from .impl import SlimserveAttentionImpl

ENV = "SLIMSERVE_KV_SCALES"


class PerTokenLayerCache:
    """One layer's FP8 pages (inside vLLM's tensor) with their per-token scale arrays."""

    def __init__(self, kv_cache: torch.Tensor, kv_dtype: str):
        if kv_cache.dim() != 4 or kv_cache.shape[3] % 2 or not kv_cache.is_contiguous():
            raise ValueError(f"slimserve vLLM backend: the KV cache tensor {tuple(kv_cache.shape)} must be "
                             "a contiguous [num_blocks, kv_heads, block_size, 2 * head_size]")
        num_blocks, kv_heads, block_size, twice_head = kv_cache.shape
        pages = kv_cache.view(torch.uint8).view(num_blocks, 2, block_size, kv_heads, twice_head // 2)
        shape = (num_blocks, block_size, kv_heads)
        self.k_scales = torch.ones(shape, dtype=torch.float32, device=kv_cache.device)
        self.v_scales = torch.ones(shape, dtype=torch.float32, device=kv_cache.device)
        self.attention = _s.PagedKVCache(pages, None, layout="NHD", dtype=kv_dtype,
                                         k_token_scales=self.k_scales, v_token_scales=self.v_scales)
        self.pages = pages
        self.num_blocks, self.block_size = num_blocks, block_size
        self.data_ptr, self.tensor, self.kv_dtype = kv_cache.data_ptr(), kv_cache, kv_dtype


class SlimservePerTokenAttentionImpl(SlimserveAttentionImpl):
    """slimserve's attention layer with per-token FP8 scales: the base class's append and
    attention over a cache view that carries the scale arrays (the append writes them)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if not str(self.kv_dtype).startswith("fp8"):
            support._refuse(f"kv_cache_dtype with {ENV}=per_token:", self.kv_cache_dtype,
                            "fp8, fp8_e4m3, fp8_e5m2")
        self._per_token: Optional[PerTokenLayerCache] = None

    def _layer_cache(self, layer, kv_cache: torch.Tensor, activation: str) -> PerTokenLayerCache:
        c = self._per_token
        if c is None or c.data_ptr != kv_cache.data_ptr() or c.tensor.shape != kv_cache.shape:
            c = self._per_token = PerTokenLayerCache(kv_cache, self.kv_dtype)
            stats.note_cache(kv_cache)
        return c

    # do_kv_cache_update is the base class's: the step's guarded slots (-1 for an aborted
    # request's tokens) through _layer_cache's view, whose per-token scales the append writes.


class SlimservePerTokenBackend(SlimserveAttentionBackend):
    @staticmethod
    def get_impl_cls():
        return SlimservePerTokenAttentionImpl
