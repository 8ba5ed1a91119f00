"""The AttentionBackend vLLM looks up (registered as CPU_ATTN by slimserve.vllm.register) and
its metadata builder."""
from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

import numpy as np
import torch

from vllm.v1.attention.backend import (AttentionBackend, AttentionCGSupport, AttentionMetadataBuilder,
                                       AttentionType, CommonAttentionMetadata, MultipleOf)
from vllm.v1.kv_cache_interface import KVCacheLayout

import slimserve as _slimserve

from . import guard, hooks, host_attention, stats, support
from .impl import SlimserveAttentionImpl, _stream_of, set_current
from .metadata import SlimserveMetadata, StepPlanner


class SlimserveAttentionBackend(AttentionBackend):
    # vLLM calls do_kv_cache_update before forward, with the step's slot_mapping.
    forward_includes_kv_cache_update: bool = False
    supported_dtypes: ClassVar[list[torch.dtype]] = list(support.ACTIVATION_DTYPES)
    supported_kv_cache_dtypes: ClassVar[list[str]] = list(support.KV_CACHE_DTYPES)

    @classmethod
    def customize_spec(cls, spec):
        """NVFP4: a head's content per token is its K and its V head vector, 9 * head_size / 16
        bytes each (codes, then block scales; layout.py), instead of vLLM's 2 * head_size."""
        mode = getattr(spec, "kv_quant_mode", None)
        if getattr(spec, "state_content_bytes", None) is not None or not getattr(mode, "is_nvfp4", False):
            return spec
        return replace(spec, state_content_bytes=2 * _slimserve.nvfp4_head_vector_bytes(spec.head_size))

    @staticmethod
    def get_name() -> str:
        return "CPU_ATTN"  # the name it is registered under (the CPU platform takes no other)

    @staticmethod
    def get_impl_cls():
        return SlimserveAttentionImpl

    @staticmethod
    def get_builder_cls():
        return SlimserveMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None):
        return list(support.BLOCK_SIZES)

    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return list(support.HEAD_SIZES)

    @classmethod
    def supported_kv_cache_layouts(cls):
        # Blocks outermost and contiguous: each block's bytes hold its K and V pages (layout.py).
        return (KVCacheLayout.LBHNC,)

    @classmethod
    def supports_non_causal(cls) -> bool:
        return False

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return False

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER


class SlimserveMetadataBuilder(AttentionMetadataBuilder[SlimserveMetadata]):
    # NEVER (vLLM then runs attention eagerly between piecewise graphs): the kernels are
    # capturable, but a full graph would replay one plan's grid over another step's schedule
    # and would capture the tag guard off (docs/vllm.md, "CUDA graphs"; test_builder.py).
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.NEVER

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        model = vllm_config.model_config
        self.activation = support.check_model(dtype=model.dtype, block_size=kv_cache_spec.block_size,
                                              head_size=kv_cache_spec.head_size)
        kv_dtype = support.KV_CACHE_DTYPES.get(vllm_config.cache_config.cache_dtype) or self.activation
        scheduler = vllm_config.scheduler_config
        self.max_num_seqs = scheduler.max_num_seqs
        self.planner = StepPlanner(
            num_heads=model.get_num_attention_heads(vllm_config.parallel_config),
            num_kv_heads=kv_cache_spec.num_kv_heads, head_size=kv_cache_spec.head_size,
            block_size=kv_cache_spec.block_size, kv_dtype=kv_dtype, activation=self.activation,
            max_num_seqs=scheduler.max_num_seqs, max_num_tokens=scheduler.max_num_batched_tokens,
            max_model_len=model.max_model_len, device=device)
        # Only the host attention mode needs the exact lengths on the host (_host_seq_lens).
        self.exact_host_lengths = host_attention.mode() == "host"
        self.guard = None
        guard.ACTIVE["guard"] = None
        if guard.enabled():
            hooks.install_worker_hooks()
            hooks.install_engine_hooks()  # the in-process engine core (register() does it elsewhere)
            # vLLM has sized the cache before it makes the builders; the block table is
            # max_model_len / block_size blocks wide. From here on the worker's hook feeds the
            # guard every step's deltas, the first step's admissions included.
            block = kv_cache_spec.block_size
            self.guard = guard.BlockGuard(num_blocks=vllm_config.cache_config.num_gpu_blocks, block_size=block,
                                          max_num_seqs=self.max_num_seqs,
                                          max_blocks_per_req=-(-model.max_model_len // block), device=device)
            guard.ACTIVE["guard"] = self.guard

    def _host_seq_lens(self, cm: CommonAttentionMetadata, num_reqs: int) -> torch.Tensor:
        """The lengths the plan schedules for, without a device-to-host copy: vLLM's own host
        figure, `seq_lens_cpu_upper_bound` (num_computed_tokens + the step's scheduled tokens,
        kept on the host by the model runner; exact except for decode rows under asynchronous
        speculative decoding, where it assumes every draft accepted). An upper bound is what
        the plan may take: the run reads vLLM's device seq_lens for each row's real length,
        and the guard clips a row's expected tags to the blocks the request holds. The host
        attention mode (a measurement mode) attends over the host lengths themselves, so it
        reads the exact device values (a copy on a GPU)."""
        bound = getattr(cm, "seq_lens_cpu_upper_bound", None)
        if bound is not None and bound.device.type == "cpu" and not self.exact_host_lengths:
            return bound[:num_reqs]
        stats.count("plan_seq_lens_copies")
        return cm.seq_lens[:num_reqs]

    def build(self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata,
              fast_build: bool = False) -> SlimserveMetadata:
        cm = common_attn_metadata
        if isinstance(cm.causal, torch.Tensor) or not cm.causal:
            raise NotImplementedError("slimserve vLLM backend: only causal decoder attention")
        n, num_reqs = cm.num_actual_tokens, cm.num_reqs
        block_table, seq_lens = cm.block_table_tensor[:num_reqs], cm.seq_lens[:num_reqs]
        step = self.planner.plan(query_start_loc_cpu=cm.query_start_loc_cpu,
                                 seq_lens=self._host_seq_lens(cm, num_reqs),
                                 block_table=block_table, num_reqs=num_reqs)
        slots, statuses = cm.slot_mapping[:n], None
        g = self.guard
        req_ids = hooks.current_req_ids() if g is not None else None
        if g is not None and req_ids is not None and len(req_ids) >= num_reqs:
            slots = g.check(list(req_ids[:num_reqs]), num_reqs=num_reqs,
                            seq_lens=np.asarray(self.planner.last_seq_lens), block_table=block_table,
                            seq_lens_device=seq_lens, query_start_loc=cm.query_start_loc, slot_mapping=cm.slot_mapping,
                            num_tokens=n, stream=_stream_of(block_table))
            statuses = g.statuses
        elif g is not None:  # a warm-up or profiling batch: no request of the scheduler's
            stats.count("guard_unchecked_steps")
        meta = SlimserveMetadata(num_actual_tokens=n, num_reqs=num_reqs, max_query_len=cm.max_query_len,
                                 query_start_loc=cm.query_start_loc, seq_lens=seq_lens, block_table=block_table,
                                 slot_mapping=slots, step=step, attention=self.planner.attention,
                                 planner=self.planner, statuses=statuses,
                                 extra={"vllm_slot_mapping": cm.slot_mapping})
        set_current(meta)
        stats.count("build")
        return meta
