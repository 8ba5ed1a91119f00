"""The metadata builder without vLLM running (seconds): vLLM's CommonAttentionMetadata handed
to SlimserveMetadataBuilder as vLLM 0.32's model runner makes it.
  - the plan's lengths come from vLLM's host copy (`seq_lens_cpu_upper_bound`), never from the
    device `seq_lens`: the test hands seq_lens as a tensor on PyTorch's "meta" device, which
    holds no values, so any read of it on the host would raise; without the host copy the
    builder falls back to reading seq_lens (counted: plan_seq_lens_copies);
  - the CUDA-graph capture path: `build_for_cudagraph_capture` on the metadata vLLM captures
    a FULL decode graph with (B rows, one token each), then `build` on the batch such a graph
    would replay (k < B real decode rows, the rest vLLM's padding: query length 0, seq_len 0,
    slot -1). The checks record why the builder keeps AttentionCGSupport.NEVER
    (docs/vllm.md, "CUDA graphs"): the replayed step's attention schedule is not the captured
    one (the grid would differ), and with the guard on the capture-time metadata carries no
    verdicts and vLLM's own slot_mapping, so a graph captured from it would never apply the
    guard. No GPU here: nothing is captured; this checks the metadata, not a capture.
Run by run.sh in build/vllm-env:  python test_builder.py"""
import os
import sys
from types import SimpleNamespace as NS

import numpy as np
import torch

from vllm.v1.attention.backend import AttentionCGSupport, CommonAttentionMetadata

from slimserve.vllm import guard, stats
from slimserve.vllm.backend import SlimserveMetadataBuilder

HEADS, KV_HEADS, HEAD, BLOCK = 6, 2, 64, 32
MAX_LEN, MAX_SEQS, MAX_TOKENS = 8 * BLOCK, 8, 64


def make_builder() -> SlimserveMetadataBuilder:
    model = NS(dtype=torch.bfloat16, max_model_len=MAX_LEN, get_num_attention_heads=lambda parallel: HEADS)
    config = NS(model_config=model, parallel_config=NS(),
                cache_config=NS(cache_dtype="auto", num_gpu_blocks=64),
                scheduler_config=NS(max_num_seqs=MAX_SEQS, max_num_batched_tokens=MAX_TOKENS))
    spec = NS(block_size=BLOCK, head_size=HEAD, num_kv_heads=KV_HEADS)
    return SlimserveMetadataBuilder(spec, ["model.layers.0.self_attn.attn"], config, torch.device("cpu"))


def metadata(query_lens, seq_lens, *, device_seq_lens=None, host_bound=True, num_tokens=None):
    """CommonAttentionMetadata as vLLM's model runner builds it (padding rows: query length 0,
    seq_len 0, block table row of the null block, slot -1)."""
    qo = torch.tensor(np.concatenate([[0], np.cumsum(query_lens)]), dtype=torch.int32)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    n = int(qo[-1]) if num_tokens is None else num_tokens
    width = MAX_LEN // BLOCK
    table = torch.zeros(len(seq_lens), width, dtype=torch.int32)
    for r, length in enumerate(seq_lens):
        table[r, : -(-length // BLOCK)] = torch.arange(1 + r * width, 1 + r * width + -(-length // BLOCK))
    slots = torch.full((n,), -1, dtype=torch.int64)
    for r, (q, length) in enumerate(zip(query_lens, seq_lens)):
        for i in range(q):
            pos = length - q + i
            slots[int(qo[r]) + i] = int(table[r, pos // BLOCK]) * BLOCK + pos % BLOCK
    return CommonAttentionMetadata(
        query_start_loc=qo.clone(), query_start_loc_cpu=qo,
        seq_lens=lens if device_seq_lens is None else device_seq_lens, num_reqs=len(seq_lens),
        num_actual_tokens=n, max_query_len=max(query_lens), max_seq_len=max(seq_lens),
        block_table_tensor=table, slot_mapping=slots, causal=True,
        seq_lens_cpu_upper_bound=lens.clone() if host_bound else None)


def host_lengths() -> None:
    os.environ[guard.ENV_SWITCH] = "0"
    builder = make_builder()
    stats.reset()
    query_lens, seq_lens = [1, 5, BLOCK + 1, 1], [1, BLOCK - 1, BLOCK + 1, 2 * BLOCK + 3]
    unreadable = torch.empty(len(seq_lens), dtype=torch.int32, device="meta")
    meta = builder.build(0, metadata(query_lens, seq_lens, device_seq_lens=unreadable))
    assert meta.seq_lens.device.type == "meta"  # handed on to the layers as vLLM's tensor
    assert list(builder.planner.last_seq_lens) == seq_lens, builder.planner.last_seq_lens
    assert stats.snapshot().get("plan_seq_lens_copies", 0) == 0
    builder.build(0, metadata(query_lens, seq_lens, host_bound=False))  # no host copy: read seq_lens
    assert stats.snapshot().get("plan_seq_lens_copies", 0) == 1
    print(f"host lengths: planned from seq_lens_cpu_upper_bound {seq_lens} with seq_lens unreadable; "
          "the fallback copy counted")


def capture_path() -> None:
    os.environ[guard.ENV_SWITCH] = "1"
    builder = make_builder()
    support = SlimserveMetadataBuilder.get_cudagraph_support(builder.vllm_config, builder.kv_cache_spec)
    assert support == AttentionCGSupport.NEVER, support
    B, k = 4, 2
    # vLLM's FULL-graph capture of a uniform decode batch: B rows of one token, seq_len 1 (no
    # scheduler requests behind it: the guard has no rows to check).
    captured = builder.build_for_cudagraph_capture(metadata([1] * B, [1] * B))
    captured_key = builder.planner.attention._graph_key
    assert captured.statuses is None  # no verdicts: a graph of it would never read any
    assert captured.slot_mapping.data_ptr() == captured.extra["vllm_slot_mapping"].data_ptr()  # unguarded slots
    # The step that graph would replay: k real decode rows, B - k padding rows.
    replay = builder.build(0, metadata([1] * k + [0] * (B - k), [40, 70] + [0] * (B - k), num_tokens=B))
    replay_key = builder.planner.attention._graph_key
    assert replay.attention is captured.attention  # one persistent plan, rewritten per step ...
    assert replay_key != captured_key, (replay_key, captured_key)  # ... with another schedule
    print(f"capture path: build_for_cudagraph_capture made the metadata of {B} one-token rows; the replayed "
          f"step ({k} real rows + {B - k} padding) plans another schedule (query lengths {captured_key[1]} vs "
          f"{replay_key[1]}, {captured_key[4]} vs {replay_key[4]} work items) in the same buffers, and the "
          "capture-time metadata has no guard verdicts: NEVER kept")


def main() -> int:
    saved = os.environ.get(guard.ENV_SWITCH)
    try:
        host_lengths()
        capture_path()
    finally:
        if saved is None:
            os.environ.pop(guard.ENV_SWITCH, None)
        else:
            os.environ[guard.ENV_SWITCH] = saved
    return 0


if __name__ == "__main__":
    sys.exit(main())
