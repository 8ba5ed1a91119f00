"""The metadata builder without vLLM running (seconds): vLLM's CommonAttentionMetadata handed
to SlimserveMetadataBuilder as vLLM 0.32's model runner makes it.
  - the plan's lengths come from vLLM's host copy (`seq_lens_cpu_upper_bound`), never from the
    device `seq_lens`: the test hands seq_lens as a tensor on PyTorch's "meta" device, which
    holds no values, so any read of it on the host would raise; without the host copy the
    builder falls back to reading seq_lens (counted: plan_seq_lens_copies);
Run by run.sh in build/vllm-env:  python test_builder.py"""
import os
import sys
from types import SimpleNamespace as NS

import numpy as np
import torch

from vllm.v1.attention.backend import CommonAttentionMetadata

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


def main() -> int:
    saved = os.environ.get(guard.ENV_SWITCH)
    try:
        host_lengths()
    finally:
        if saved is None:
            os.environ.pop(guard.ENV_SWITCH, None)
        else:
            os.environ[guard.ENV_SWITCH] = saved
    return 0


if __name__ == "__main__":
    sys.exit(main())
