"""The per-step plan: built once by the metadata builder, shared by every layer of the step.

vLLM calls `build` once per step (per KV cache group) with the batch's query_start_loc,
seq_lens, block table and slot_mapping. The builder validates and plans here, on the host:
slimserve's paged attention plan over vLLM's block table (its workspace persists across
steps) and the append's token -> page table for the step's slots. The layers' forward and
do_kv_cache_update only launch with it: no host synchronization, no host reads of device
tensors, nothing allocated there."""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

import slimserve as _s
from slimserve.attention import PagedAttentionWrapper

from . import support


def _host(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor's values without a copy; a CUDA tensor's after a copy (the builder runs on
    the host before the step's kernels, so this copy is the plan's one synchronization)."""
    return (t if t.device.type == "cpu" else t.cpu()).numpy()


class AppendPlan:
    """Where each of the step's tokens goes: token t is request t of a one-page table whose
    page holds slot_mapping[t] (slot -1: no page, nothing written). Pages are numbered as
    the append view of layout.LayerCache numbers them (block b -> page 2b)."""

    def __init__(self):
        self.num_tokens = 0
        self._arrays = []
        self.table = None
        self.token_request = self.token_position = None

    def plan(self, slots: np.ndarray, block_size: int, stream=None) -> None:
        slots = np.ascontiguousarray(slots, np.int64)
        valid = slots >= 0
        counts = valid.astype(np.int32)
        indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        indices = (2 * (slots[valid] // block_size)).astype(np.int32)
        last = np.where(valid, block_size, 0).astype(np.int32)
        request = np.arange(len(slots), dtype=np.int32)
        position = np.where(valid, slots % block_size, 0).astype(np.int32)
        arrays = [_s.DeviceArray(a, stream) for a in (indptr, indices, last, request, position)]
        self._arrays = arrays  # the previous step's arrays are freed here, after its launches
        self.table = _s._capi.PageTableView(arrays[0].ptr, arrays[1].ptr, arrays[2].ptr, None, len(slots),
                                            block_size)
        self.token_request, self.token_position = arrays[3].ptr.value, arrays[4].ptr.value
        self.num_tokens = len(slots)
        self.max_slot = int(slots.max()) if len(slots) else -1

    def run(self, cache, key: torch.Tensor, value: torch.Tensor, activation: str, stream=None) -> None:
        n = self.num_tokens
        kr = _s._tensor(key[:n], name="key", strided=False)
        vr = _s._tensor(value[:n], name="value", strided=False, shape=kr.shape)
        args = _s._capi.AppendArgs()
        args.k_new, args.v_new = kr.ptr, vr.ptr
        args.input_dtype = _s.ACTIVATION_DTYPES[activation]
        args.num_tokens = n
        args.token_request, args.token_position = self.token_request, self.token_position
        _s._check(_s._lib.slimserve_append_kv(ctypes.byref(cache.view), ctypes.byref(self.table), None,
                                              ctypes.byref(args), _s._stream(stream)))


@dataclass
class SlimserveMetadata:
    """What the layers of one step read (vLLM passes it to every layer's forward)."""
    num_actual_tokens: int
    num_reqs: int
    max_query_len: int
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    step: int
    attention: PagedAttentionWrapper
    append: AppendPlan
    planner: Optional[object] = None  # the StepPlanner that made it
    guard: Optional[object] = None  # slimserve.vllm.guard.StepGuard when the tag guard is on
    extra: dict = field(default_factory=dict)


class StepPlanner:
    """One per metadata builder: the persistent plan objects and the step counter. A layer
    given metadata of an older step refuses it (its plan was replaced)."""

    def __init__(self, *, num_heads: int, num_kv_heads: int, head_size: int, block_size: int,
                 kv_dtype: str, activation: str):
        self.num_heads, self.num_kv_heads, self.head_size = num_heads, num_kv_heads, head_size
        self.block_size, self.kv_dtype, self.activation = block_size, kv_dtype, activation
        self.attention = PagedAttentionWrapper()
        self.append = AppendPlan()
        self.step = 0

    def plan(self, *, query_start_loc_cpu: torch.Tensor, seq_lens: torch.Tensor,
             block_table: torch.Tensor, slot_mapping: torch.Tensor, num_reqs: int,
             num_actual_tokens: int) -> int:
        qo = _host(query_start_loc_cpu[: num_reqs + 1]).astype(np.int32)
        lens = _host(seq_lens[:num_reqs]).astype(np.int32)
        table = _host(block_table[:num_reqs]).astype(np.int32)
        slots = _host(slot_mapping[:num_actual_tokens])
        self.attention.plan(qo, self.num_heads, self.num_kv_heads, self.head_size, self.block_size,
                            block_table=table, seq_lens=lens, kv_dtype=self.kv_dtype,
                            q_dtype=self.activation, causal=True)
        self.append.plan(slots, self.block_size)
        self.step += 1
        return self.step
