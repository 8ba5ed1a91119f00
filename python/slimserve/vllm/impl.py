"""The attention layer's two calls: do_kv_cache_update (slimserve's quantize-and-append over
vLLM's slot_mapping) and forward (slimserve's paged attention over vLLM's block table:
chunked prefill, decode and mixed batches alike, causal within each request's new tokens)."""
from __future__ import annotations

from typing import Optional

import torch

import slimserve as _s
from vllm.v1.attention.backend import AttentionImpl, AttentionType

from . import host_attention, rotation, stats, support
from .layout import LayerCache
from .metadata import SlimserveMetadata

# The plan of the step being run, found by do_kv_cache_update (vLLM does not pass it the
# metadata): the slot_mapping tensor it was planned for -> (metadata).
_CURRENT = {}


def _stream_of(t: torch.Tensor):
    """The current CUDA stream for CUDA tensors (launches then do not synchronize); None on
    the CPU, where the emulated kernels run synchronously anyway."""
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else None


def _rows(x: torch.Tensor, heads: int, head_size: int) -> torch.Tensor:
    """[tokens, heads, head_size] of vLLM's [tokens, heads * head_size] (or already 3-D) key /
    value, as a view: the token stride kept (a slice of the fused QKV output), no copy."""
    if x.dim() == 3:
        return x
    return x.unflatten(-1, (heads, head_size))


def current_step_for(slot_mapping: torch.Tensor) -> Optional[SlimserveMetadata]:
    meta = _CURRENT.get("metadata")
    if meta is None or meta.extra["vllm_slot_mapping"].data_ptr() != slot_mapping.data_ptr():
        return None
    return meta


def set_current(meta: SlimserveMetadata) -> None:
    _CURRENT["metadata"] = meta


class SlimserveAttentionImpl(AttentionImpl):
    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int,
                 alibi_slopes, sliding_window, kv_cache_dtype: str, logits_soft_cap=None,
                 attn_type: str = AttentionType.DECODER, kv_sharing_target_layer_name=None,
                 sinks=None) -> None:
        self.kv_dtype = support.check_layer(
            num_heads=num_heads, num_kv_heads=num_kv_heads, head_size=head_size,
            kv_cache_dtype=kv_cache_dtype, sliding_window=sliding_window, alibi_slopes=alibi_slopes,
            logits_soft_cap=logits_soft_cap, attn_type=attn_type, sinks=sinks,
            kv_sharing_target_layer_name=kv_sharing_target_layer_name)
        self.num_heads, self.head_size, self.num_kv_heads = num_heads, head_size, num_kv_heads
        self.scale = float(scale)
        self.kv_cache_dtype = kv_cache_dtype
        self.sliding_window = -1
        self.kv_sharing_target_layer_name = None
        self.attn_type = attn_type
        self.sinks = None
        self._cache: Optional[LayerCache] = None
        self.host_attention = host_attention.mode() == "host"  # refused here if misspelt
        self.rotation = rotation.mode(head_size)  # SLIMSERVE_KV_ROTATION (rotation.py)

    def _layer_cache(self, layer, kv_cache: torch.Tensor, activation: str) -> LayerCache:
        """The slimserve views of this layer's cache, made once (vLLM keeps the tensor and the
        scale tensors for the engine's life; the kernels read the scales when they run)."""
        c = self._cache
        if c is None or c.data_ptr != kv_cache.data_ptr() or c.tensor.shape != kv_cache.shape:
            kv_dtype = activation if self.kv_dtype == "auto" else self.kv_dtype
            k_scale = v_scale = None
            if kv_dtype.startswith("fp8") or kv_dtype == "nvfp4":  # checked once, at the first step
                k_scale, v_scale = support.kernel_kv_scales(layer._k_scale, layer._v_scale, kv_dtype)
            c = self._cache = LayerCache(kv_cache, kv_dtype=kv_dtype, k_scale=k_scale, v_scale=v_scale)
            stats.note_cache(kv_cache)
        return c

    def do_kv_cache_update(self, layer, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                           slot_mapping: torch.Tensor) -> None:
        activation = support.ACTIVATION_DTYPES[key.dtype]
        cache = self._layer_cache(layer, kv_cache, activation)
        meta = current_step_for(slot_mapping)
        if meta is not None:
            n = meta.num_actual_tokens
            slots = meta.slot_mapping  # the guard's: -1 for the tokens of aborted requests
        else:  # not the step's own slot_mapping: written as given, unguarded
            n = slot_mapping.shape[0]
            slots = slot_mapping
            stats.count("append_unplanned")
        # vLLM's key / value are strided views of its fused QKV output ([tokens, kv_heads *
        # head_size] rows, q_size + 2 * kv_size apart): the append reads them in place.
        kr, vr = cache.attention.check_rows(_rows(key[:n], self.num_kv_heads, self.head_size),
                                            _rows(value[:n], self.num_kv_heads, self.head_size),
                                            "key", "value", strided=True)
        sr = _s._tensor(slots[:n], name="slot_mapping", dtypes={"int64"}, shape=(n,))
        _s._kv_append(cache.attention, kr, vr, _s.ACTIVATION_DTYPES[activation], slot_mapping=sr.ptr,
                      stream=_stream_of(key), names=("key", "value"), rotation=self.rotation)
        stats.count("kv_update")
        stats.count("kv_update_tokens", n)

    def forward(self, layer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, attn_metadata: Optional[SlimserveMetadata], output: torch.Tensor,
                output_scale=None, output_block_scale=None) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("slimserve vLLM backend: fused output quantization is not supported")
        if attn_metadata is None:  # profiling / warm-up run
            return output
        meta = attn_metadata
        if meta.step != meta.planner.step:
            raise RuntimeError(f"slimserve vLLM backend: metadata of step {meta.step} used after step "
                               f"{meta.planner.step} was planned")
        activation = support.ACTIVATION_DTYPES[query.dtype]
        cache = self._layer_cache(layer, kv_cache, activation)
        n = meta.num_actual_tokens
        q = query[:n].view(n, self.num_heads, self.head_size)
        out = output[:n].view(n, self.num_heads, self.head_size)
        if self.host_attention:  # SLIMSERVE_ATTENTION=host: the same pages, read by torch
            if self.rotation != "none":  # the pages hold rotated keys: rotate the queries alike
                q = _s.rotate_heads(q, torch.empty_like(q), stream=_stream_of(query))
            planner = meta.planner
            per_token = getattr(cache, "k_scales", None) is not None
            host_attention.attend(q=q, out=out, pages=cache.pages, kv_dtype=cache.kv_dtype,
                                  k_scale=None if per_token else cache.k_scale,
                                  v_scale=None if per_token else cache.v_scale,
                                  k_token_scales=cache.k_scales if per_token else None,
                                  v_token_scales=cache.v_scales if per_token else None,
                                  query_start_loc=planner.last_query_start_loc, seq_lens=planner.last_seq_lens,
                                  block_table=meta.block_table, num_reqs=meta.num_reqs, sm_scale=self.scale,
                                  statuses=meta.statuses)
            self._rotate_output_back(out, query)
            stats.count("forward_host")
            stats.count("forward")
            stats.count("forward_tokens", n)
            return output
        # Launches only: the plan's persistent buffers, vLLM's device block table and lengths,
        # the guard's device verdicts (aborted requests read no page; their rows are NaN).
        if cache.attention.view.scale_mode == 2:  # per-token scales: the op takes per-tensor ones only
            meta.attention.wrapper.run(q, cache.attention, out=out, sm_scale=self.scale, statuses=meta.statuses,
                                       block_table=meta.block_table, seq_lens=meta.seq_lens,
                                       stream=_stream_of(query), synchronize=False, rotation=self.rotation)
        else:
            # The kernel rotates q, and the output back for keys_and_values, itself (rotation.py).
            torch.ops.slimserve.paged_attention_run(q, cache.pages, None, meta.block_table, meta.seq_lens, out,
                                                    meta.statuses, meta.attention.id, cache.kv_dtype, "NHD",
                                                    self.scale, cache.k_scale, cache.v_scale, self.rotation)
        stats.count("forward")
        stats.count("forward_tokens", n)
        return output

    def _rotate_output_back(self, out: torch.Tensor, query: torch.Tensor) -> None:
        """With rotated values the output is in the rotated basis; the transform is its own
        inverse, so one more rotation (in place) gives the model's output."""
        if self.rotation == "keys_and_values":
            _s.rotate_heads(out, stream=_stream_of(query))
