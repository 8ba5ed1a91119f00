"""vLLM's per-layer KV cache tensor as slimserve's paged K/V cache.

vLLM (CPU platform) allocates each layer's cache as [num_blocks, kv_heads, block_size,
2 * head_size] and treats a block as one contiguous run of bytes: it zeroes whole blocks
(`kv[block_id].zero_()`) and KV connectors move them as such. So the backend keeps every
block's K and V inside that block's bytes and only chooses the interior:

    block b = [ K page: block_size x kv_heads x head_size | V page: same ]   (NHD pages)

i.e. the tensor read as [num_blocks, 2, block_size, kv_heads, head_size], slimserve's combined
K/V allocation (`PagedKVCache(kv, None)`: page b's K at page 2b, its V one page later, page
stride two pages). Paged attention reads it in place, and the append writes it in place:
`slimserve_kv_append` with that page stride and vLLM's slot_mapping (slot s is block
s // block_size, row s % block_size). FP8 caches are uint8. NVFP4 caches are uint8 too, with
the backend's spec (backend.customize_spec) making vLLM's content per head and token 2 * 9 D /
16 bytes: each of K and V a head vector of D/2 bytes of E2M1 codes then D/16 E4M3 block
scales, so a block is exactly its two NVFP4 pages.
"""
from __future__ import annotations

import torch

import slimserve as _s


def _bytes_view(kv_cache: torch.Tensor) -> torch.Tensor:
    """The cache with FP8 element types as uint8 (how slimserve takes 8-bit pages)."""
    return kv_cache.view(torch.uint8) if kv_cache.element_size() == 1 and kv_cache.dtype != torch.uint8 else kv_cache


class LayerCache:
    """slimserve's view of one layer's cache tensor: `pages` ([num_blocks, 2, block_size,
    kv_heads, head_size], what the torch ops take) and `attention` (the same bytes as a
    PagedKVCache with its page stride, what the C entries take: attention and append alike)."""

    def __init__(self, kv_cache: torch.Tensor, *, kv_dtype: str, k_scale, v_scale):
        if kv_cache.dim() != 4 or kv_cache.shape[3] % 2:
            raise ValueError(f"slimserve vLLM backend: the KV cache tensor {tuple(kv_cache.shape)} must be "
                             "[num_blocks, kv_heads, block_size, 2 * head_size]")
        if not kv_cache.is_contiguous():
            raise ValueError("slimserve vLLM backend: the layer's KV cache tensor must be contiguous "
                             f"(strides {kv_cache.stride()})")
        num_blocks, kv_heads, block_size, twice_head = kv_cache.shape
        head_size = twice_head // 2  # elements; for nvfp4, a head vector's bytes (9 D / 16)
        self.pages = _bytes_view(kv_cache).view(num_blocks, 2, block_size, kv_heads, head_size)
        scaled = kv_dtype.startswith("fp8") or kv_dtype == "nvfp4"
        scales = dict(k_scale=k_scale, v_scale=v_scale) if scaled else {}
        self.attention = _s.PagedKVCache(self.pages, None, layout="NHD", dtype=kv_dtype if scaled else None, **scales)
        self.kv_dtype = kv_dtype
        self.k_scale, self.v_scale = (k_scale, v_scale) if scaled else (None, None)
        self.num_blocks, self.block_size = num_blocks, block_size
        self.kv_heads, self.head_size = kv_heads, head_size
        self.data_ptr = kv_cache.data_ptr()
        self.tensor = kv_cache  # kept alive with its views


def kv_bytes_per_token(kv_cache: torch.Tensor) -> int:
    """K + V bytes one token takes in this layer's cache (all KV heads)."""
    num_blocks, kv_heads, block_size, twice_head = kv_cache.shape
    return kv_heads * twice_head * kv_cache.element_size()
