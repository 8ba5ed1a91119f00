"""INT4 mixture-of-experts GEMM over the C ABI (ABI 2): one alignment of the router's output per
layer (`MoeRouter.run` -> `MoeRouting`), shared by the layer's two grouped W4A16 GEMMs
(`MoeGemm("gate_up_silu", ...)`: mid[pair] = silu(x W_gate) * (x W_up); `MoeGemm(
"down_weighted_sum", ...)`: out[token] = sum over slots of router weight * (mid[pair] W_down)).

Sizes are bounded once by `max_tokens` (the plan and its workspace serve every step up to it,
CUDA graphs included); each run only launches. Expert ids outside 0 .. E - 1 are skipped on
the device and reported by `MoeRouting.read_status()` (it synchronizes). Errors raise
`slimserve.SlimserveError` with the library's message.
"""
from __future__ import annotations

import sys
from ctypes import addressof, byref, c_size_t, c_void_p
from typing import Optional, Sequence

import numpy as np

from . import _activation, _capi, _check, _empty_like, _lib, _stream, _tensor, DeviceArray, Int4Weights
from ._errors import type_error, value_error

__all__ = ["MoeRouter", "MoeRouting", "MoeGemm", "stack_experts", "validate_moe_routing",
           "MOE_EPILOGUES", "MOE_ALIGN_METHODS"]

MOE_EPILOGUES = {"gate_up_silu": 0, "down_weighted_sum": 1}
MOE_ALIGN_METHODS = {"automatic": 0, "serial": 1, "device": 2}
GROUP_SCALINGS = {0: "per_weight", 1: "per_group_sum"}


def validate_moe_routing(topk_ids, num_experts: int) -> None:
    """Host check of host ids [T, top_k]: every id in 0 .. num_experts - 1 (out_of_range names
    the first bad token, slot and id)."""
    ids = np.ascontiguousarray(np.asarray(topk_ids.cpu() if hasattr(topk_ids, "cpu") else topk_ids), np.int32)
    if ids.ndim != 2:
        raise value_error(f"slimserve: topk_ids must be [tokens, top_k], got shape {ids.shape}")
    _check(_lib.slimserve_moe_validate_routing(ids.ctypes.data, ids.shape[0], ids.shape[1], num_experts))


def stack_experts(experts: Sequence[Int4Weights]):
    """(packed, scales, zeros) of E experts quantized alike, laid end to end as the grouped GEMM
    reads them ([E][k/16, n/16, 32], [E][k/g, n], [E][k/g, n] or None)."""
    if not experts:
        raise value_error("slimserve: stack_experts needs at least one expert")
    first = experts[0]
    for w in experts:
        if (w.k, w.n, w.group_size, w.activation, w.zeros is None) != (
                first.k, first.n, first.group_size, first.activation, first.zeros is None):
            raise value_error("slimserve: experts must share k, n, group_size, activation and symmetry")
    packed = np.concatenate([w.packed for w in experts])
    scales = np.concatenate([w.scales for w in experts])
    zeros = None if first.zeros is None else np.concatenate([w.zeros for w in experts])
    return packed, scales, zeros


class MoeRouting:
    """One step's aligned routing (device pointers into its router's workspace): valid until the
    router runs again or the ids change. Pass it to both GEMMs of the layer."""

    def __init__(self, router: "MoeRouter", routing: _capi.MoeRouting, ids):
        self._router, self._routing, self._ids = router, routing, ids  # keep the memory alive
        self.num_tokens, self.top_k, self.num_experts = routing.num_tokens, routing.top_k, routing.num_experts

    def read_status(self, stream=None) -> None:
        """After the step (synchronizes): raises out_of_range naming the first bad token, slot
        and id and the number of skipped pairs; returns when every id was in range."""
        _check(_lib.slimserve_moe_routing_read_status(byref(self._routing), _stream(stream)))

    def status_word(self, stream=None) -> dict:
        """The device-side id check as it is (what an engine copies with its other outputs)."""
        word = _capi.MoeRoutingStatus()
        _check(_lib.slimserve_memcpy_async(addressof(word), self._routing.status, 16, 1, _stream(stream)))
        _check(_lib.slimserve_stream_synchronize(_stream(stream)))
        return {"invalid_pairs": word.invalid_pairs, "first_invalid": word.first_invalid, "first_id": word.first_id}


class MoeRouter:
    """The alignment of a layer's routing: sorts the T * top_k (token, slot) pairs by expert and
    checks the ids on the device. Planned (and its workspace allocated) once for max_tokens, at
    the first run."""

    def __init__(self, num_experts: int, top_k: int, max_tokens: int, *, align: str = "automatic"):
        if align not in MOE_ALIGN_METHODS:
            raise value_error(f"slimserve: align must be one of {sorted(MOE_ALIGN_METHODS)}, got {align!r}")
        self.num_experts, self.top_k, self.max_tokens = num_experts, top_k, max_tokens
        self._align = MOE_ALIGN_METHODS[align]
        self._plan = c_void_p()
        self._workspace: Optional[DeviceArray] = None
        self.workspace_bytes = 0

    def _args(self, ids, num_tokens: int) -> _capi.MoeRoutingArgs:
        args = _capi.versioned(_capi.MoeRoutingArgs)
        args.num_tokens, args.top_k, args.num_experts = num_tokens, self.top_k, self.num_experts
        args.topk_ids = ids.ptr
        args.max_tokens, args.align = self.max_tokens, self._align
        return args

    def run(self, topk_ids, stream=None) -> MoeRouting:
        """Aligns the router's ids [T, top_k] (int32, device memory; host arrays on the emulated
        library). Launches only."""
        ids = _tensor(topk_ids, name="topk_ids", dtypes={"int32"})
        if len(ids.shape) != 2 or ids.shape[1] != self.top_k:
            raise value_error(f"slimserve: topk_ids must be [tokens, {self.top_k}], got shape {ids.shape}")
        args = self._args(ids, ids.shape[0])
        if not self._plan:
            size = c_size_t()
            _check(_lib.slimserve_moe_routing_workspace_size(byref(args), byref(size)))
            plan = c_void_p()
            _check(_lib.slimserve_moe_routing_plan_create(byref(args), byref(plan)))
            self._plan, self.workspace_bytes = plan, size.value
            self._workspace = DeviceArray.empty(size.value)
        routing = _capi.MoeRouting()
        _check(_lib.slimserve_moe_routing_run(self._plan, byref(args), self._workspace.ptr, self.workspace_bytes,
                                              _stream(stream), byref(routing)))
        return MoeRouting(self, routing, topk_ids)

    def _destroy_plan(self) -> None:
        if getattr(self, "_plan", None):
            _lib.slimserve_moe_routing_plan_destroy(self._plan)
            self._plan = None

    def __del__(self, _exiting=sys.is_finalizing):
        if not _exiting():  # at interpreter exit the module's globals may be gone
            self._destroy_plan()


class MoeGemm:
    """One grouped W4A16 GEMM of a layer over stacked INT4 experts (`stack_experts`): each
    expert k x n (gate_up_silu: n = 2 x intermediate, [gate | up] columns; down_weighted_sum:
    n = hidden). Planned (and its workspace allocated) once for max_tokens, at the first run."""

    def __init__(self, epilogue: str, packed, scales, zeros, *, k: int, n: int, group_size: int,
                 num_experts: int, top_k: int, max_tokens: int):
        if epilogue not in MOE_EPILOGUES:
            raise value_error(f"slimserve: epilogue must be one of {sorted(MOE_EPILOGUES)}, got {epilogue!r}")
        self.epilogue = epilogue
        self.packed, self.scales, self.zeros = packed, scales, zeros
        self.k, self.n, self.group_size = k, n, group_size
        self.num_experts, self.top_k, self.max_tokens = num_experts, top_k, max_tokens
        self._plan = c_void_p()
        self._workspace: Optional[DeviceArray] = None
        self.workspace_bytes = 0
        self.scaling: Optional[str] = None  # the FP64 model the results match, once planned

    def run(self, a, routing: MoeRouting, *, topk_weights=None, out=None, dtype: Optional[str] = None,
            stream=None):
        """gate_up_silu: a [T, k] -> out [T * top_k, n / 2] in pair order (token * top_k + slot);
        down_weighted_sum: a [T * top_k, k] (the gate+up output) and topk_weights [T, top_k]
        float32 -> out [T, n]. Launches only."""
        gate_up = self.epilogue == "gate_up_silu"
        tokens = routing.num_tokens
        rows = tokens if gate_up else tokens * self.top_k
        if not isinstance(routing, MoeRouting):
            raise type_error(f"slimserve: routing must be a MoeRouting, got {type(routing).__name__}")
        ar = _tensor(a, name="a", shape=(rows, self.k))
        out_shape = (tokens * self.top_k, self.n // 2) if gate_up else (tokens, self.n)
        if out is None:
            out = _empty_like(a, shape=out_shape)
        activation = _activation(ar, "a", dtype)
        same = {"bfloat16", "uint16"} if activation == 0 else {"float16"}
        if self.group_size < 1 or self.k % self.group_size or self.k < 16 or self.n < 16:
            raise value_error(f"slimserve: k = {self.k}, n = {self.n}, group_size = {self.group_size}: k and n must "
                              "be >= 16 and group_size must divide k")
        experts, groups = self.num_experts, self.k // self.group_size
        # The expert weights' extents: what the kernels index, checked against the buffers.
        for name, tensor, count, dtypes in (("packed", self.packed, experts * self.k * self.n // 8, {"uint32", "int32"}),
                                            ("scales", self.scales, experts * groups * self.n, same),
                                            ("zeros", self.zeros, experts * groups * self.n, same)):
            if tensor is None:
                continue
            r = _tensor(tensor, name=name, dtypes=dtypes)
            if r.numel != count:
                raise value_error(f"slimserve: {name} holds {r.numel} elements; {experts} experts of k = {self.k}, "
                                  f"n = {self.n}, group_size = {self.group_size} need {count}")
        _tensor(out, name="out", shape=out_shape, dtypes=same)
        args = _capi.versioned(_capi.MoeGemmArgs)
        args.activation = activation
        args.epilogue = MOE_EPILOGUES[self.epilogue]
        args.num_tokens, args.top_k, args.num_experts = tokens, self.top_k, self.num_experts
        args.k, args.n, args.group_size = self.k, self.n, self.group_size
        args.a = ar.ptr
        args.b = _tensor(self.packed, name="packed", dtypes={"uint32", "int32"}).ptr
        args.scales = _tensor(self.scales, name="scales").ptr
        args.zeros = _tensor(self.zeros, name="zeros").ptr if self.zeros is not None else None
        args.topk_ids = routing._routing.topk_ids
        if not gate_up:
            if topk_weights is None:
                raise type_error("slimserve: the down_weighted_sum GEMM needs topk_weights")
            args.topk_weights = _tensor(topk_weights, name="topk_weights", dtypes={"float32"},
                                        shape=(tokens, self.top_k)).ptr
        args.c = _tensor(out, name="out", shape=out_shape).ptr
        args.max_tokens = self.max_tokens
        if not self._plan:
            size = c_size_t()
            _check(_lib.slimserve_moe_gemm_workspace_size(byref(args), byref(size)))
            plan = c_void_p()
            _check(_lib.slimserve_moe_gemm_plan_create(byref(args), byref(plan)))
            info = _capi.versioned(_capi.MoeGemmPlanInfo)
            _check(_lib.slimserve_moe_gemm_plan_get_info(plan, byref(info)))
            self._plan, self.workspace_bytes = plan, size.value
            self.scaling = GROUP_SCALINGS.get(info.scaling, str(info.scaling))
            self._workspace = DeviceArray.empty(size.value) if size.value else None
        _check(_lib.slimserve_moe_gemm_run(self._plan, byref(args), byref(routing._routing),
                                           self._workspace.ptr if self._workspace else None,
                                           self.workspace_bytes, _stream(stream)))
        return out

    def _destroy_plan(self) -> None:
        if getattr(self, "_plan", None):
            _lib.slimserve_moe_gemm_plan_destroy(self._plan)
            self._plan = None

    def __del__(self, _exiting=sys.is_finalizing):
        if not _exiting():  # at interpreter exit the module's globals may be gone
            self._destroy_plan()
