"""A plain-PyTorch attention backend for vLLM: the tests' FP8 reference where stock vLLM's CPU
FP8 kernels cannot run (they need AVX-512 or AMX). Written from vLLM's FP8 KV convention
(stored = fp8(x / scale), read = stored x scale) without slimserve: torch's own float8 casts
(round to nearest even; the test model's K/V stay inside e4m3's range at scale 1), then each
request's keys and values gathered from its blocks and attended in float32.
Registered as CPU_ATTN by generate.py (--runs reference:fp8_e4m3)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from vllm.v1.attention.backend import (AttentionBackend, AttentionImpl, AttentionMetadataBuilder,
                                       AttentionType, CommonAttentionMetadata)
from vllm.v1.kv_cache_interface import KVCacheLayout

_FP8 = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
COUNTS = {"forward": 0}


@dataclass
class ReferenceMetadata:
    num_actual_tokens: int
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor


class ReferenceBackend(AttentionBackend):
    forward_includes_kv_cache_update: bool = False
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.bfloat16]
    supported_kv_cache_dtypes: ClassVar[list[str]] = ["auto", "fp8", "fp8_e4m3", "fp8_e5m2"]

    @staticmethod
    def get_name() -> str:
        return "CPU_ATTN"

    @staticmethod
    def get_impl_cls():
        return ReferenceImpl

    @staticmethod
    def get_builder_cls():
        return ReferenceBuilder

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None):
        return [128]

    @classmethod
    def supported_kv_cache_layouts(cls):
        return (KVCacheLayout.LBHNC,)


class ReferenceBuilder(AttentionMetadataBuilder[ReferenceMetadata]):
    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)

    def build(self, common_prefix_len: int, cm: CommonAttentionMetadata, fast_build: bool = False):
        return ReferenceMetadata(cm.num_actual_tokens, cm.query_start_loc_cpu.clone(),
                                 cm.seq_lens.clone(), cm.block_table_tensor.clone())


class ReferenceImpl(AttentionImpl):
    def __init__(self, num_heads, head_size, scale, num_kv_heads, alibi_slopes, sliding_window,
                 kv_cache_dtype, logits_soft_cap=None, attn_type=AttentionType.DECODER,
                 kv_sharing_target_layer_name=None, sinks=None):
        self.num_heads, self.head_size, self.num_kv_heads = num_heads, head_size, num_kv_heads
        self.scale, self.kv_cache_dtype = float(scale), kv_cache_dtype
        self.fp8 = _FP8.get(kv_cache_dtype)
        self.kv_sharing_target_layer_name = None

    def _pages(self, kv_cache):
        b, h, n, d2 = kv_cache.shape
        pages = kv_cache.view(torch.uint8).view(self.fp8) if self.fp8 else kv_cache
        return pages.view(b, 2, n, h, d2 // 2)  # [block, K|V, slot, head, dim]

    def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping):
        pages = self._pages(kv_cache)
        n = pages.shape[2]
        for t, slot in enumerate(slot_mapping.tolist()):
            if slot < 0:
                continue
            for part, x, scale in ((0, key[t], layer._k_scale_float), (1, value[t], layer._v_scale_float)):
                pages[slot // n, part, slot % n] = (x.float() / scale).to(pages.dtype) if self.fp8 else x

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output,
                output_scale=None, output_block_scale=None):
        if attn_metadata is None:
            return output
        COUNTS["forward"] += 1
        pages = self._pages(kv_cache)
        n = pages.shape[2]
        m = attn_metadata
        out = output[: m.num_actual_tokens].view(-1, self.num_heads, self.head_size)
        qsl = m.query_start_loc.tolist()
        group = self.num_heads // self.num_kv_heads
        for r, seq_len in enumerate(m.seq_lens.tolist()):
            q0, q1 = qsl[r], qsl[r + 1]
            if q1 == q0:
                continue
            blocks = m.block_table[r, : (seq_len + n - 1) // n].long()
            kv = pages[blocks].float()  # [blocks, 2, slot, head, dim]
            if self.fp8:
                kv[:, 0] *= layer._k_scale_float
                kv[:, 1] *= layer._v_scale_float
            k = kv[:, 0].reshape(-1, self.num_kv_heads, self.head_size)[:seq_len]
            v = kv[:, 1].reshape(-1, self.num_kv_heads, self.head_size)[:seq_len]
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
            q = query[q0:q1].float()
            scores = torch.einsum("qhd,khd->hqk", q, k) * self.scale
            positions = torch.arange(seq_len - (q1 - q0), seq_len)
            mask = torch.arange(seq_len)[None, :] > positions[:, None]
            scores.masked_fill_(mask[None], float("-inf"))
            out[q0:q1] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).to(out.dtype)
        return output
