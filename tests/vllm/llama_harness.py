"""A llama model (SmolLM2-135M here) run on slimserve's own Python API, without vLLM: what a C++
or Rust engine does with the C ABI, written small enough to read.

PyTorch does the embedding, RMSNorm, RoPE, SiLU and the unquantized matrix products (float32
sums, BF16 activations); slimserve does the rest:
  * the KV cache: FP8 e4m3 pages with per-tensor scales, written by `append_kv` (quantize and
    append) and read in place by `PagedAttentionWrapper` (paged attention, causal);
  * the INT4 linear layers, where asked: the checkpoint's weights quantized and packed by
    `quantize_int4` (symmetric, groups of 64 along K), products by `gemm_w4a16`.

One K and one V page array hold every layer, [num_pages, layers * kv_heads, page_size, head_dim]
(HND): a page id names the same block in every layer (as in vLLM), layer l reads heads
[l * kv_heads, (l + 1) * kv_heads) of it in place (its pages layers * kv_heads * page_size *
head_dim elements apart), and the whole array is one cache to describe, register and move
(`KvPages.transfer_cache`): one transfer per request moves every layer.
"""
from __future__ import annotations

import json
import math
import os
from typing import List, Sequence, Tuple

import numpy as np
import torch

import slimserve as ss

FP8_MAX = 448.0  # e4m3's largest finite value
INT4_GROUP = 64  # divides SmolLM2's K (576 and 1536); 128 does not divide 576


class DenseLinear:
    """y = x W^T with the checkpoint's BF16 weight, float32 sums, BF16 out."""

    def __init__(self, weight: torch.Tensor):
        self.weight = weight.float()  # [n, k]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return (x.float() @ self.weight.t()).to(torch.bfloat16)


class Int4Linear:
    """y = x dequant(W)^T on slimserve's W4A16 GEMM (the emulated kernel on a CPU)."""

    def __init__(self, weight: torch.Tensor):
        q = ss.quantize_int4(weight.float().numpy(), group_size=INT4_GROUP, activation="bfloat16", layout="n_by_k")
        self.packed, self.scales = q.packed, q.scales  # host arrays the GEMM reads as they are

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return ss.gemm_w4a16(x.to(torch.bfloat16).contiguous(), self.packed, self.scales, None, INT4_GROUP)


class Layer:
    """One decoder layer's weights: q/k/v fused into one product, gate/up into another."""

    def __init__(self, w: dict, prefix: str, int4: bool):
        make = Int4Linear if int4 else DenseLinear
        attn, mlp = prefix + "self_attn.", prefix + "mlp."
        self.qkv = make(torch.cat([w[attn + n + "_proj.weight"] for n in ("q", "k", "v")]))
        self.o = make(w[attn + "o_proj.weight"])
        self.gate_up = make(torch.cat([w[mlp + "gate_proj.weight"], w[mlp + "up_proj.weight"]]))
        self.down = make(w[mlp + "down_proj.weight"])
        self.input_norm = w[prefix + "input_layernorm.weight"].float()
        self.post_norm = w[prefix + "post_attention_layernorm.weight"].float()


class Weights:
    """The checkpoint (a safetensors folder in the Hugging Face llama layout) and its config."""

    def __init__(self, folder: str):
        from safetensors.torch import load_file
        with open(os.path.join(folder, "config.json")) as f:
            c = json.load(f)
        rope_parameters = c.get("rope_parameters") or {"rope_type": "default", "rope_theta": c.get("rope_theta", 1e4)}
        if c.get("rope_scaling") or rope_parameters.get("rope_type", "default") != "default":
            raise ValueError(f"llama_harness: only the default RoPE is implemented, not {rope_parameters}")
        self.layers, self.hidden = c["num_hidden_layers"], c["hidden_size"]
        self.heads, self.kv_heads = c["num_attention_heads"], c["num_key_value_heads"]
        self.head_dim = c.get("head_dim") or self.hidden // self.heads
        self.eps, self.theta = c["rms_norm_eps"], float(rope_parameters["rope_theta"])
        self.tensors = {}
        for name in sorted(os.listdir(folder)):
            if name.endswith(".safetensors"):
                self.tensors.update(load_file(os.path.join(folder, name)))
        self.embed = self.tensors["model.embed_tokens.weight"]
        self.lm_head = self.tensors.get("lm_head.weight", self.embed).float()  # tied in SmolLM2
        self.final_norm = self.tensors["model.norm.weight"].float()

    def layer(self, i: int, int4: bool) -> Layer:
        return Layer(self.tensors, f"model.layers.{i}.", int4)


class KvPages:
    """The FP8 e4m3 K/V cache of every layer (see the module's docstring), in host memory with
    the emulated library; pages start poisoned so a slot nobody wrote is seen."""

    def __init__(self, weights: Weights, num_pages: int, k_scales: Sequence[float], v_scales: Sequence[float],
                 page_size: int = 16, poison: int = 0xA5):
        h, layers = weights.kv_heads, weights.layers
        shape = (num_pages, layers * h, page_size, weights.head_dim)
        self.k, self.v = np.full(shape, poison, np.uint8), np.full(shape, poison, np.uint8)
        self.page_size, self.num_pages = page_size, num_pages
        self.layer = [ss.PagedKVCache(self.k[:, i * h:(i + 1) * h], self.v[:, i * h:(i + 1) * h], layout="HND",
                                      dtype="fp8_e4m3", k_scale=k_scales[i], v_scale=v_scales[i])
                      for i in range(layers)]
        # The whole array as one cache: what the transfer describes and registers. Its scales are
        # placeholders (a descriptor carries the scale mode; both sides load the same calibration).
        self.transfer_cache = ss.PagedKVCache(self.k, self.v, layout="HND", dtype="fp8_e4m3", k_scale=1.0, v_scale=1.0)

    def request_bytes(self, page_ids: Sequence[int], num_tokens: int) -> List[bytes]:
        """The slots a request of num_tokens tokens fills in its pages, K then V, every layer."""
        out = []
        for array in (self.k, self.v):
            rows = np.concatenate([array[p] for p in page_ids], axis=1)  # [layers * heads, slots, dim]
            out.append(rows[:, :num_tokens].tobytes())
        return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.float()
    return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight).to(torch.bfloat16)


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding, Hugging Face's convention (the two halves of head_dim rotate)."""
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    angles = (positions.double()[:, None] * inv_freq[None, :]).float()
    cos, sin = torch.cat([angles.cos()] * 2, -1)[:, None, :], torch.cat([angles.sin()] * 2, -1)[:, None, :]
    x = x.float()
    rotated = torch.cat([-x[..., d // 2:], x[..., :d // 2]], -1)
    return (x * cos + rotated * sin).to(torch.bfloat16)


class Model:
    """The forward pass. `int4` (a set of layer indices) chooses which layers' seven linear
    products (q, k, v, o, gate, up, down; run as four fused GEMMs) use INT4 weights; the
    embedding and the (tied) LM head stay BF16."""

    def __init__(self, weights: Weights, int4: Sequence[int] = ()):
        self.w = weights
        self.int4 = sorted(set(int4))
        self.layers = [weights.layer(i, i in self.int4) for i in range(weights.layers)]

    def _qkv(self, layer: Layer, x: torch.Tensor, positions: torch.Tensor):
        w = self.w
        qkv = layer.qkv(rms_norm(x, layer.input_norm, w.eps))
        q, k, v = qkv.split([w.heads * w.head_dim, w.kv_heads * w.head_dim, w.kv_heads * w.head_dim], -1)
        q = rope(q.reshape(-1, w.heads, w.head_dim), positions, w.theta)
        k = rope(k.reshape(-1, w.kv_heads, w.head_dim), positions, w.theta)
        return q, k, v.reshape(-1, w.kv_heads, w.head_dim).contiguous()

    def _rest(self, layer: Layer, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        x = x + layer.o(attn.reshape(x.shape[0], -1)).float()
        gate, up = layer.gate_up(rms_norm(x, layer.post_norm, self.w.eps)).float().chunk(2, -1)
        return x + layer.down((torch.nn.functional.silu(gate) * up).to(torch.bfloat16)).float()

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x[-1:], self.w.final_norm, self.w.eps).float() @ self.w.lm_head.t()

    def forward(self, tokens: Sequence[int], start: int, kv: KvPages, pages: Sequence[Tuple[int, int]]) -> torch.Tensor:
        """Runs tokens at positions start.. of one request whose first `start` tokens are in
        `pages` already (the pages hold room for the new ones): appends their K/V to every
        layer's pages, attends over the pages; returns the last token's logits [1, vocab]."""
        w, m = self.w, len(tokens)
        n = start + m
        ids = np.array([p for p, _ in pages[:-(-n // kv.page_size)]], np.int32)
        table = ss.PageTable(1, len(ids), kv.page_size, kv.num_pages).build([(pages[:len(ids)], n)])
        attention = ss.PagedAttentionWrapper()
        attention.plan(np.array([0, m], np.int32), w.heads, w.kv_heads, w.head_dim, kv.page_size,
                       kv_indptr=np.array([0, len(ids)], np.int32), kv_indices=ids,
                       last_page_len=np.array([(n - 1) % kv.page_size + 1], np.int32),
                       kv_dtype="fp8_e4m3", q_dtype="bfloat16", causal=True)
        append_indptr = np.array([0, m], np.int32)
        positions = torch.arange(start, n)
        x = w.embed[torch.tensor(list(tokens))].float()
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, x, positions)
            ss.append_kv(kv.layer[i], table, k, v, append_indptr=append_indptr)
            out = torch.empty_like(q)
            attention.run(q, kv.layer[i], out=out, sm_scale=1.0 / math.sqrt(w.head_dim))
            x = self._rest(layer, x, out)
        return self._logits(x)

    def torch_forward(self, tokens: Sequence[int]):
        """The same model in plain PyTorch, without a cache: BF16 K/V, softmax attention in
        float32. Returns the last token's logits and each layer's largest |K| and |V|."""
        w, m = self.w, len(tokens)
        positions = torch.arange(m)
        mask = torch.full((m, m), float("-inf")).triu(1)
        x = w.embed[torch.tensor(list(tokens))].float()
        amax = []
        for layer in self.layers:
            q, k, v = self._qkv(layer, x, positions)
            amax.append((float(k.float().abs().max()), float(v.float().abs().max())))
            group = w.heads // w.kv_heads
            kf, vf = k.float().repeat_interleave(group, 1), v.float().repeat_interleave(group, 1)
            scores = torch.einsum("qhd,khd->hqk", q.float(), kf) / math.sqrt(w.head_dim) + mask
            out = torch.einsum("hqk,khd->qhd", scores.softmax(-1), vf).to(torch.bfloat16)
            x = self._rest(layer, x, out)
        return self._logits(x), amax

    def calibrate_kv_scales(self, tokens: Sequence[int], headroom: float = 2.0):
        """Per-layer FP8 scales ([k], [v]) from torch_forward over `tokens`: the power of two at
        or above amax * headroom / 448, so a calibration is the same wherever it runs."""
        _, amax = self.torch_forward(tokens)
        scale = [[2.0 ** math.ceil(math.log2(a[i] * headroom / FP8_MAX)) for a in amax] for i in (0, 1)]
        return scale[0], scale[1]


def greedy(logits: torch.Tensor) -> int:
    return int(logits[0].argmax())
