"""slimserve's W4A16 GEMM as vLLM's mixed-precision linear kernel (INT4 weights, BF16/FP16
activations) for compressed-tensors pack-quantized and GPTQ checkpoints (symmetric, no act
order), selected with SLIMSERVE_INT4_LINEAR=1; see docs/vllm.md.

vLLM has no public registry for these kernels: `choose_mp_linear_kernel` walks a per-platform
list in vllm.model_executor.kernels.linear (`_POSSIBLE_KERNELS`, internal) and takes the first
whose can_implement accepts the layer. `install()` (called by the plugin's entry point, in every
vLLM process, before any model is built) puts this kernel first on the running platform's list.
On vLLM's CPU platform the kernel it replaces, CPUWNA16LinearKernel, calls the op
`_C.cpu_gemm_wna16`, which vLLM 0.32's AVX2 build of its CPU extension does not contain: on a
CPU without AVX-512 INT4 checkpoints otherwise load and then fail at the first forward.

After loading, each layer's codes are repacked unchanged into the GEMM's tiled layout
(docs/int4-gemm-layout.md) and its scales kept in the activation dtype, which the GEMM
multiplies in (the tool's compressed-tensors scales already are; GPTQ's FP16 scales in a BF16
model are rounded to BF16 here); `apply_weights` runs the GEMM (emulated on the CPU build, CUDA
on a GPU build).
"""
from __future__ import annotations

import os

import numpy as np
import torch

ENV = "SLIMSERVE_INT4_LINEAR"


def _code_position_table():
    """(row, column) inside a 16x16 tile of each (lane, nibble) of a packed word: the
    layout's code_position (include/slimserve/int4/gemm_layout.hpp)."""
    rows = np.empty((32, 8), np.int64)
    cols = np.empty((32, 8), np.int64)
    for lane in range(32):
        for nibble in range(8):
            reg, half = nibble % 4, nibble // 4
            rows[lane, nibble] = 2 * (lane % 4) + half + 8 * (reg % 2)
            cols[lane, nibble] = lane // 4 + 8 * (reg // 2)
    return rows, cols


_ROWS, _COLS = _code_position_table()


def pack_for_gemm(q: np.ndarray) -> np.ndarray:
    """Unsigned codes q [K, N] (0..15, zero point 8 for symmetric weights) -> the GEMM's
    packed words [K/16, N/16, 32] (uint32), flat."""
    k, n = q.shape
    if k % 16 or n % 16:
        raise ValueError(f"slimserve INT4 linear: K = {k} and N = {n} must be multiples of 16")
    tiles = q.reshape(k // 16, 16, n // 16, 16).transpose(0, 2, 1, 3)  # [K/16, N/16, 16, 16]
    codes = tiles[:, :, _ROWS, _COLS].astype(np.uint32)  # [K/16, N/16, 32 lanes, 8 nibbles]
    words = np.zeros(codes.shape[:3], np.uint32)
    for nibble in range(8):
        words |= codes[..., nibble] << np.uint32(4 * nibble)
    return words.reshape(-1)


def unpack_along(packed: torch.Tensor, axis: int) -> torch.Tensor:
    """int32 words holding 8 nibbles (lowest first) along `axis` -> the nibbles (0..15)."""
    words = packed.to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(0, 32, 4, dtype=torch.int64)
    moved = words.movedim(axis, -1)
    nibbles = (moved.unsqueeze(-1) >> shifts) & 0xF  # [..., words, 8]
    return nibbles.reshape(*moved.shape[:-1], -1).movedim(-1, axis)


def _kernel_class():
    from vllm.model_executor.kernels.linear.mixed_precision.MPLinearKernel import (MPLinearKernel,
                                                                                   MPLinearLayerConfig)
    from vllm.scalar_type import scalar_types

    class SlimserveW4A16LinearKernel(MPLinearKernel):
        @classmethod
        def get_min_capability(cls) -> int:
            return -1

        @classmethod
        def can_implement(cls, c: MPLinearLayerConfig):
            k, n = c.partition_weight_shape
            if c.weight_type != scalar_types.uint4b8:
                return False, f"weight type {c.weight_type} (slimserve: symmetric 4-bit, uint4b8)"
            if c.zero_points:
                return False, "zero points (slimserve's vLLM kernel: symmetric checkpoints only)"
            if c.act_type not in (torch.bfloat16, torch.float16):
                return False, f"activation {c.act_type} (slimserve: bfloat16 or float16)"
            group = k if c.group_size == -1 else c.group_size
            if k % 16 or n % 16:
                return False, f"K = {k}, N = {n} (slimserve: multiples of 16)"
            if k % group or (group != k and (group < 16 or group & (group - 1))):
                return False, f"group {group} for K = {k} (slimserve: a power of two >= 16 dividing K, or K)"
            return True, None

        def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
            w_q, w_s, _ = self._get_weight_params(layer)
            k, n = self.config.partition_weight_shape
            # The checkpoint's parameter: nibbles packed along K (compressed-tensors [N, K/8],
            # GPTQ [K/8, N]); input_dim says which axis is K.
            codes = unpack_along(w_q.data, w_q.packed_dim)
            if w_q.input_dim == 1:
                codes = codes.t()
            codes = codes[:k].contiguous().numpy()  # [K, N], 0..15, zero point 8
            scales = w_s.data if w_s.output_dim == 1 else w_s.data.t()  # [groups, N]
            packed = torch.from_numpy(pack_for_gemm(codes.astype(np.uint8)).view(np.int32).copy())
            layer.slimserve_packed = torch.nn.Parameter(packed, requires_grad=False)
            layer.slimserve_scales = torch.nn.Parameter(scales.to(self.config.act_type).contiguous(),
                                                        requires_grad=False)
            layer.slimserve_group = k if self.config.group_size == -1 else self.config.group_size
            setattr(layer, self.w_q_name, None)  # the checkpoint's copies are not used again
            setattr(layer, self.w_s_name, None)

        def apply_weights(self, layer: torch.nn.Module, x: torch.Tensor, bias=None) -> torch.Tensor:
            from slimserve import torch_ops

            from . import stats

            stats.count("int4_gemm")
            rows = x.reshape(-1, x.shape[-1])
            out = torch_ops.gemm_w4a16(rows, layer.slimserve_packed, layer.slimserve_scales, None,
                                       None if bias is None else bias.to(rows.dtype), layer.slimserve_group)
            return out.reshape(*x.shape[:-1], out.shape[-1])

    return SlimserveW4A16LinearKernel


def install() -> bool:
    """Puts slimserve's kernel first in vLLM's mixed-precision kernel list of the running
    platform when SLIMSERVE_INT4_LINEAR=1; returns whether it did."""
    if os.environ.get(ENV, "0") in ("", "0"):
        return False
    from vllm.model_executor.kernels import linear
    from vllm.platforms import current_platform

    kernels = linear._POSSIBLE_KERNELS.setdefault(current_platform._enum, [])
    if not any(k.__name__ == "SlimserveW4A16LinearKernel" for k in kernels):
        kernels.insert(0, _kernel_class())
    return True
