"""What slimserve's vLLM backend takes, and the start-up refusals for everything else.

Every refusal names the value it got and what is supported, so a misconfigured engine stops
before it loads weights instead of computing a wrong answer."""
from __future__ import annotations

from typing import Optional

import torch

from slimserve import _NVFP4_E2M1_MAX  # the scalar arithmetic, tested without vLLM
from slimserve import _check_scale_value  # the one scale check of every host-given scale
from slimserve import _NVFP4_MAX_TENSOR_SCALE as NVFP4_MAX_TENSOR_SCALE  # FLT_MAX / 2^14

# slimserve's paged attention (docs/attention.md): head_dim and page sizes it dispatches.
HEAD_SIZES = (64, 96, 128, 192, 256)
# vLLM's CPU cache wants blocks in multiples of 32; slimserve pages go up to 128.
BLOCK_SIZES = (32, 64, 128)
ACTIVATION_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}
# vLLM's cache_dtype names -> slimserve's KV dtype (None: the activation dtype).
KV_CACHE_DTYPES = {"auto": None, "bfloat16": "bfloat16", "float16": "float16",
                   "fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2", "nvfp4": "nvfp4"}
# NVFP4 head vectors (D/2 code bytes + D/16 scale bytes) are whole 4-byte words at these.
NVFP4_HEAD_SIZES = (64, 128, 192, 256)


class UnsupportedConfiguration(ValueError):
    """The model or cache configuration is outside what the backend computes."""


def _refuse(what: str, got, supported) -> None:
    raise UnsupportedConfiguration(f"slimserve vLLM backend: {what} {got!r} is not supported "
                                   f"(supported: {supported})")


def nvfp4_tensor_scale(vllm_scale: torch.Tensor) -> torch.Tensor:
    """NVFP4's per-tensor scale from vLLM's k_scale / v_scale, keeping the FP8 meaning of that
    scale: the largest value stored is 448 * scale (E2M1's 6 times E4M3's 448 times the tensor
    scale), so the tensor scale is scale / 6. With vLLM's default 1.0, block scales are E4M3
    normals for every block whose largest magnitude is at least 2^-6."""
    return (vllm_scale.reshape(1).to(torch.float32) / _NVFP4_E2M1_MAX).contiguous()


def kernel_kv_scales(k_scale: torch.Tensor, v_scale: torch.Tensor, kv_dtype: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-tensor scales slimserve's kernels read, from a layer's vLLM k_scale / v_scale
    (FP8 meaning): float32 tensors of one element, divided by 6 for NVFP4
    (nvfp4_tensor_scale). Each is refused, with ValueError naming it, by the same check as the
    host-given scales of slimserve's own API (not finite and positive as float32; for NVFP4 a
    tensor scale above the format's largest, which the kernels would read as NaN rows)."""
    k32, v32 = k_scale.reshape(1).to(torch.float32), v_scale.reshape(1).to(torch.float32)
    for name, scale in (("k_scale", k32), ("v_scale", v32)):
        _check_scale_value(scale.item(), f"vLLM {name}")
    if kv_dtype != "nvfp4":
        return k32, v32
    k4, v4 = nvfp4_tensor_scale(k32), nvfp4_tensor_scale(v32)
    for name, scale in (("k_scale", k4), ("v_scale", v4)):
        _check_scale_value(scale.item(), f"nvfp4 tensor scale (vLLM {name} / 6)", kv_dtype)
    return k4, v4


def check_layer(*, num_heads: int, num_kv_heads: int, head_size: int, kv_cache_dtype: str,
                sliding_window: Optional[int], alibi_slopes, logits_soft_cap: Optional[float],
                attn_type: str, sinks, kv_sharing_target_layer_name: Optional[str]) -> str:
    """Checks one attention layer's configuration; returns slimserve's KV dtype name (or
    "auto" for the activation dtype)."""
    if head_size not in HEAD_SIZES:
        _refuse("head size", head_size, HEAD_SIZES)
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        _refuse("kv_cache_dtype", kv_cache_dtype, tuple(KV_CACHE_DTYPES))
    if kv_cache_dtype == "nvfp4" and head_size not in NVFP4_HEAD_SIZES:
        _refuse("head size with kv_cache_dtype nvfp4:", head_size, NVFP4_HEAD_SIZES)
    if num_kv_heads <= 0 or num_heads % num_kv_heads:
        _refuse("query/KV head ratio", f"{num_heads}/{num_kv_heads}", "a whole number")
    if sliding_window is not None and sliding_window > 0:
        _refuse("sliding window", sliding_window, "none (full attention only, not yet wired)")
    if alibi_slopes is not None:
        _refuse("ALiBi slopes", "given", "none")
    if logits_soft_cap:
        _refuse("logits soft cap", logits_soft_cap, "none (not yet wired)")
    if sinks is not None:
        _refuse("attention sinks", "given", "none (not yet wired)")
    if str(getattr(attn_type, "value", attn_type)) != "decoder":
        _refuse("attention type", attn_type, "decoder")
    if kv_sharing_target_layer_name is not None:
        _refuse("KV sharing across layers", kv_sharing_target_layer_name, "none")
    return KV_CACHE_DTYPES[kv_cache_dtype] or "auto"


def check_model(*, dtype: torch.dtype, block_size: int, head_size: int) -> str:
    """Checks the engine-wide choices; returns the activation dtype's slimserve name."""
    if dtype not in ACTIVATION_DTYPES:
        _refuse("model dtype", dtype, tuple(str(d) for d in ACTIVATION_DTYPES))
    if block_size not in BLOCK_SIZES:
        _refuse("block size", block_size, BLOCK_SIZES)
    if head_size not in HEAD_SIZES:
        _refuse("head size", head_size, HEAD_SIZES)
    return ACTIVATION_DTYPES[dtype]
