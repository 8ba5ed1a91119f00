"""vLLM's per-layer KV cache tensor as slimserve's paged K/V cache.

vLLM (CPU platform) allocates each layer's cache as [num_blocks, kv_heads, block_size,
2 * head_size] and treats a block as one contiguous run of bytes: it zeroes whole blocks
(`kv[block_id].zero_()`) and KV connectors move them as such. So the backend keeps every
block's K and V inside that block's bytes and only chooses the interior:

    block b = [ K page: block_size x kv_heads x head_size | V page: same ]   (NHD pages)

i.e. the tensor read as [num_blocks, 2, block_size, kv_heads, head_size], slimserve's combined
K/V allocation (`PagedKVCache(kv, None)`, page stride two pages), read in place by paged
attention. The append kernel takes packed page arrays, so it sees the same bytes as
2 * num_blocks - 1 pages of K (k_pages = base) and of V (v_pages = base + one page): block b's
K page is page 2b of the first and its V page page 2b of the second. FP8 caches are uint8.
"""
from __future__ import annotations

import copy

import torch

import slimserve as _s


def _bytes_view(kv_cache: torch.Tensor) -> torch.Tensor:
    """The cache with FP8 element types as uint8 (how slimserve takes 8-bit pages)."""
    return kv_cache.view(torch.uint8) if kv_cache.element_size() == 1 and kv_cache.dtype != torch.uint8 else kv_cache


class LayerCache:
    """slimserve views of one layer's cache tensor: `attention` (combined pages, for paged
    attention) and `append` (2 x num_blocks - 1 packed pages, for quantize-and-append)."""

    def __init__(self, kv_cache: torch.Tensor, *, kv_dtype: str, k_scale, v_scale):
        if kv_cache.dim() != 4 or kv_cache.shape[3] % 2:
            raise ValueError(f"slimserve vLLM backend: the KV cache tensor {tuple(kv_cache.shape)} must be "
                             "[num_blocks, kv_heads, block_size, 2 * head_size]")
        if not kv_cache.is_contiguous():
            raise ValueError("slimserve vLLM backend: the layer's KV cache tensor must be contiguous "
                             f"(strides {kv_cache.stride()})")
        num_blocks, kv_heads, block_size, twice_head = kv_cache.shape
        head_size = twice_head // 2
        pages = _bytes_view(kv_cache).view(num_blocks, 2, block_size, kv_heads, head_size)
        fp8 = kv_dtype.startswith("fp8")
        scales = dict(k_scale=k_scale, v_scale=v_scale) if fp8 else {}
        self.attention = _s.PagedKVCache(pages, None, layout="NHD", dtype=kv_dtype if fp8 else None, **scales)
        self.append = copy.copy(self.attention)
        view = _s._capi.KvCache()
        ctypes_copy(view, self.attention.view)
        page_bytes = block_size * kv_heads * head_size * kv_cache.element_size()
        view.v_pages = int(view.k_pages) + page_bytes
        view.num_pages = 2 * num_blocks - 1
        self.append.view = view
        self.append.page_stride = 0
        self.num_blocks, self.block_size = num_blocks, block_size
        self.kv_heads, self.head_size = kv_heads, head_size
        self.data_ptr = kv_cache.data_ptr()
        self.tensor = kv_cache  # kept alive with its views


def ctypes_copy(dst, src) -> None:
    """Field-by-field copy of a ctypes struct (the view holds plain pointers and ints)."""
    for name, _ in type(src)._fields_:
        setattr(dst, name, getattr(src, name))


def kv_bytes_per_token(kv_cache: torch.Tensor) -> int:
    """K + V bytes one token takes in this layer's cache (all KV heads)."""
    num_blocks, kv_heads, block_size, twice_head = kv_cache.shape
    return kv_heads * twice_head * kv_cache.element_size()
