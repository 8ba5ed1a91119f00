"""An accuracy-measurement mode: attention read from slimserve's pages on the host, in torch.

Selected with SLIMSERVE_ATTENTION=host (default `kernel`: slimserve's paged-attention kernel).
Off by default, and not a serving mode: it exists so that long accuracy runs on a machine
without a GPU do not spend hours in the kernel emulator (docs/accuracy.md).

What stays the same: every layer's do_kv_cache_update is slimserve's fused quantize-and-append
kernel, so the pages hold the same codes and scales, bit for bit, as in kernel mode (BF16, FP8
e4m3/e5m2 with vLLM's per-tensor scales or slimserve's per-token ones, or NVFP4). What changes: forward
reads those pages back with torch and widens each code as the kernels do (the FP8 code's value,
exact in float32, times its scale: real = stored * scale; NVFP4's E2M1 value times its block's
E4M3 scale, exact, times the per-tensor scale), then computes softmax(q k^T * scale)
v causally per request in float32, rounding only the output to the activation dtype. The
kernels differ from it only in their internal roundings (P rounded to 16 bits before P*V,
the order of the sums): tests/vllm/test_layout.py holds it within half a BF16 ulp of a float64
reference, compare.py checks the FP8 effect it measures inside vLLM against the kernel's, and
docs/accuracy.md reports both modes on the accuracy benchmark's windows.

It reads vLLM's block table and lengths on the host (a synchronization the kernel mode does
not make) and honours the tag guard's verdicts (an aborted request's rows are NaN, as the
kernel writes them).
"""
from __future__ import annotations

import os
from typing import Optional

import torch

ENV = "SLIMSERVE_ATTENTION"
MODES = ("kernel", "host")


def mode() -> str:
    """The attention SLIMSERVE_ATTENTION asks for: kernel (the default) or host."""
    value = os.environ.get(ENV) or "kernel"
    if value not in MODES:
        raise ValueError(f"slimserve vLLM backend: {ENV}={value!r} is not supported (supported: {', '.join(MODES)})")
    return value


_FP8_DTYPES = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
_LUTS: dict = {}


def code_values(kv_dtype: str) -> torch.Tensor:
    """float32 value of each of the 256 codes of an FP8 format (e4m3: the fn variant slimserve
    stores, 448 max, 0x7f/0xff NaN; e5m2: IEEE-like), exact: float32 holds every FP8 value."""
    lut = _LUTS.get(kv_dtype)
    if lut is None:
        lut = _LUTS[kv_dtype] = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(_FP8_DTYPES[kv_dtype]).to(torch.float32)
    return lut


# E2M1's 16 values, code order (bit 3 the sign).
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def widen_nvfp4(vectors: torch.Tensor, scale: float) -> torch.Tensor:
    """NVFP4 head vectors -> float32 values. vectors: [..., 9 D / 16] uint8 (D/2 bytes of E2M1
    codes, element 2i in byte i's low nibble and 2i + 1 in its high one, then D/16 E4M3 block
    scales); value = e2m1 * block scale (exact in float32) * the per-tensor scale. A NaN block
    scale (0x7f) gives NaN values, as the kernels widen it."""
    head_dim = vectors.shape[-1] * 16 // 9
    codes = vectors[..., : head_dim // 2].to(torch.int64)
    table = torch.tensor(_E2M1, dtype=torch.float32, device=vectors.device)
    e2m1 = torch.stack([table[codes & 0xF], table[codes >> 4]], dim=-1).flatten(-2)  # [..., D]
    blocks = vectors[..., head_dim // 2:].contiguous().view(torch.float8_e4m3fn).to(torch.float32)
    return (e2m1 * blocks.repeat_interleave(16, dim=-1)) * float(scale)


def widen(codes: torch.Tensor, kv_dtype: str, scale) -> torch.Tensor:
    """Page rows -> float32 values. codes: [tokens, kv_heads, head_size] (16-bit values or
    uint8 FP8 codes; NVFP4: [tokens, kv_heads, 9 head_size / 16] bytes); scale: None (16-bit),
    a python float (per-tensor) or a float32 [tokens, kv_heads] tensor (per-token)."""
    if kv_dtype == "nvfp4":
        return widen_nvfp4(codes, scale)
    if kv_dtype not in _FP8_DTYPES:
        return codes.to(torch.float32)
    values = code_values(kv_dtype).to(codes.device)[codes.to(torch.int64)]
    if isinstance(scale, torch.Tensor):
        return values * scale.to(torch.float32)[..., None]
    return values * float(scale)


def attend(*, q: torch.Tensor, out: torch.Tensor, pages: torch.Tensor, kv_dtype: str, k_scale, v_scale,
           k_token_scales: Optional[torch.Tensor], v_token_scales: Optional[torch.Tensor],
           query_start_loc, seq_lens, block_table: torch.Tensor, num_reqs: int, sm_scale: float,
           statuses: Optional[torch.Tensor]) -> None:
    """Causal paged attention for every request of the step, from the pages.

    q, out: [tokens, heads, head_size]; pages: [num_blocks, 2, block_size, kv_heads, head_size]
    (each block's K page then its V page); k/v_token_scales: [num_blocks, block_size, kv_heads]
    or None; query_start_loc: num_reqs + 1 host ints; seq_lens: num_reqs host ints (cached +
    new tokens); block_table: [>= num_reqs, max_blocks] int32."""
    block_size, kv_heads = pages.shape[2], pages.shape[3]
    heads, head_size = q.shape[1], q.shape[2]
    group = heads // kv_heads
    per_token = k_token_scales is not None
    k_static = None if per_token else (float(k_scale) if k_scale is not None else None)
    v_static = None if per_token else (float(v_scale) if v_scale is not None else None)
    verdicts = statuses[:num_reqs, 0].cpu().tolist() if statuses is not None else None
    table = block_table[:num_reqs].cpu()
    for r in range(num_reqs):
        start, end = int(query_start_loc[r]), int(query_start_loc[r + 1])
        new = end - start
        if new == 0:
            continue
        if verdicts is not None and verdicts[r] != 0:  # refused by the guard: read no page
            out[start:end] = float("nan")
            continue
        length = int(seq_lens[r])
        blocks = table[r, : -(-length // block_size)].to(torch.int64).to(pages.device)
        rows = pages.index_select(0, blocks)  # [blocks, 2, block_size, kv_heads, head_size]
        k_codes = rows[:, 0].reshape(-1, kv_heads, rows.shape[-1])[:length]  # a head vector's elements or bytes
        v_codes = rows[:, 1].reshape(-1, kv_heads, rows.shape[-1])[:length]
        if per_token:
            ks = k_token_scales.index_select(0, blocks).reshape(-1, kv_heads)[:length]
            vs = v_token_scales.index_select(0, blocks).reshape(-1, kv_heads)[:length]
        else:
            ks, vs = k_static, v_static
        k = widen(k_codes, kv_dtype, ks)  # [length, kv_heads, head_size] float32
        v = widen(v_codes, kv_dtype, vs)
        qr = q[start:end].to(torch.float32).view(new, kv_heads, group, head_size)
        # scores [kv_heads, group, new, length]; query i sits at position length - new + i.
        scores = torch.einsum("ihgd,jhd->hgij", qr, k) * sm_scale
        position = torch.arange(length - new, length, device=q.device)[:, None]
        hidden = torch.arange(length, device=q.device)[None, :] > position
        scores.masked_fill_(hidden, float("-inf"))
        p = torch.softmax(scores, dim=-1)
        o = torch.einsum("hgij,jhd->ihgd", p, v)
        out[start:end] = o.reshape(new, heads, head_size).to(out.dtype)
