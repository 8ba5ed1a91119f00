"""The per-step plan: built once by the metadata builder, shared by every layer of the step.

vLLM calls `build` once per step (per KV cache group) with the batch's query_start_loc,
seq_lens, block table and slot_mapping. The builder plans here, on the host, into buffers
that persist across steps:
  - slimserve's paged attention (`slimserve.torch_ops.PagedAttentionPlan`, sized once for the
    engine's largest batch): the schedule and its device qo_indptr are rewritten in place;
    every layer's run reads vLLM's own device block table and seq_lens;
  - the append needs no plan: `slimserve_kv_append` reads vLLM's int64 slot_mapping on the
    device (slot -1 writes nothing), with the page stride of the combined per-layer cache;
  - the append reads vLLM's key / value in place: strided views of its fused QKV output,
    their token stride passed to the C entry (no staging copy);
  - the tag guard's verdicts (guard.py), when it is on.
The layers' forward and do_kv_cache_update then only launch: no host synchronization, no
host reads of device tensors, nothing allocated."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import torch

from slimserve.torch_ops import PagedAttentionPlan

from . import support


def _host(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor's values without a copy; a CUDA tensor's after a copy (the builder passes
    vLLM's host copies, so this copy is made only where vLLM keeps none: see
    SlimserveMetadataBuilder._host_seq_lens)."""
    return (t if t.device.type == "cpu" else t.cpu()).numpy()


@dataclass
class SlimserveMetadata:
    """What the layers of one step read (vLLM passes it to every layer's forward)."""
    num_actual_tokens: int
    num_reqs: int
    max_query_len: int
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor  # [num_reqs] int32, vLLM's device tensor
    block_table: torch.Tensor  # [num_reqs, max_blocks] int32, vLLM's device tensor
    slot_mapping: torch.Tensor  # [num_actual_tokens] int64: what the append writes (guarded)
    step: int
    attention: PagedAttentionPlan
    planner: Optional[object] = None  # the StepPlanner that made it
    statuses: Optional[torch.Tensor] = None  # the tag guard's verdicts [>= num_reqs, 2] int32
    extra: dict = field(default_factory=dict)


class StepPlanner:
    """One per metadata builder: the persistent plan objects and the step counter. A layer
    given metadata of an older step refuses it (its plan was replaced)."""

    def __init__(self, *, num_heads: int, num_kv_heads: int, head_size: int, block_size: int,
                 kv_dtype: str, activation: str, max_num_seqs: int, max_num_tokens: int,
                 max_model_len: int, device=None):
        self.num_heads, self.num_kv_heads, self.head_size = num_heads, num_kv_heads, head_size
        self.block_size, self.kv_dtype, self.activation = block_size, kv_dtype, activation
        self.max_num_seqs, self.max_num_tokens, self.max_model_len = max_num_seqs, max_num_tokens, max_model_len
        self.device = torch.device("cpu") if device is None else torch.device(device)
        self.attention: Optional[PagedAttentionPlan] = None
        self.step = 0

    def _plan_for(self, width: int) -> PagedAttentionPlan:
        """The attention plan for block tables `width` blocks wide (vLLM's is fixed for the
        engine's life: max_model_len / block_size), made at the first step."""
        if self.attention is None or self.attention.max_pages_per_request != width:
            torch_dtype = {v: k for k, v in support.ACTIVATION_DTYPES.items()}[self.activation]
            self.attention = PagedAttentionPlan(
                self.num_heads, self.num_kv_heads, self.head_size, self.block_size,
                kv_cache_dtype=self.kv_dtype, q_dtype=torch_dtype, max_batch=self.max_num_seqs,
                max_num_tokens=self.max_num_tokens, max_seq_len=max(self.max_model_len, width * self.block_size),
                max_pages_per_request=width, causal=True, use_cuda_graph=False)
        return self.attention

    def plan(self, *, query_start_loc_cpu: torch.Tensor, seq_lens: torch.Tensor,
             block_table: torch.Tensor, num_reqs: int) -> int:
        qo = _host(query_start_loc_cpu[: num_reqs + 1]).astype(np.int32)
        lens = _host(seq_lens[:num_reqs]).astype(np.int32)
        self.last_seq_lens = lens
        self.last_query_start_loc = qo  # host copies, read by the host attention mode only
        self._plan_for(int(block_table.shape[1])).plan(qo, lens)
        self.step += 1
        return self.step
