"""Host time per call of the paged-attention torch ops on a decode batch: the convenience op
that plans inside every call (torch.ops.slimserve.paged_attention) and, when the package has it,
the capturable run under a plan made once (torch.ops.slimserve.paged_attention_run). The CPU
emulator runs kernels synchronously on the host, so the library's run entry is replaced by a
stub that returns at once: what is left is the host's share of a call (Python, torch dispatch,
argument checks, planning, uploads), measured as this thread's CPU time (which a loaded machine
does not inflate as much as wall time), the best of five rounds. Speed is measured here, never
asserted in tests.

Usage: python op_overhead.py [calls]
"""
import sys
import time

import numpy as np
import torch

import slimserve as ss

HQ, HKV, D, PAGE, PAGES, BATCH, WIDTH = 8, 2, 64, 16, 64, 4, 4


def per_call(fn, calls):
    fn()  # warm up
    best = float("inf")
    for _ in range(5):
        start = time.thread_time()
        for _ in range(calls):
            fn()
        best = min(best, (time.thread_time() - start) / calls * 1e6)
    return best


def main(calls: int) -> None:
    rng = np.random.default_rng(0)
    k = torch.from_numpy(rng.uniform(-1, 1, (PAGES, PAGE, HKV, D)).astype(np.float16))
    v = torch.from_numpy(rng.uniform(-1, 1, (PAGES, PAGE, HKV, D)).astype(np.float16))
    q = torch.from_numpy(rng.uniform(-1, 1, (BATCH, HQ, D)).astype(np.float16))
    block = torch.from_numpy(rng.permutation(np.arange(1, PAGES))[: BATCH * WIDTH].reshape(BATCH, WIDTH).astype(np.int32))
    lens = torch.tensor([1, 17, 40, 64], dtype=torch.int32)
    qo = torch.arange(BATCH + 1, dtype=torch.int32)
    out = torch.empty_like(q)
    ss._lib.slimserve_paged_attention_run = lambda *args: 0  # the launch itself: stubbed out
    inside = per_call(lambda: torch.ops.slimserve.paged_attention(q, k, v, qo, block, lens, "auto", 0.0, 0, 0.0,
                                                                  None, None, None), calls)
    print(f"paged_attention (plans inside every call): {inside:7.1f} us host CPU per call")
    if hasattr(torch.ops.slimserve, "paged_attention_run"):
        from slimserve.torch_ops import PagedAttentionPlan
        plan = PagedAttentionPlan(HQ, HKV, D, PAGE, q_dtype=torch.float16, max_batch=BATCH, max_num_tokens=BATCH,
                                  max_seq_len=WIDTH * PAGE, max_pages_per_request=WIDTH)
        plan.plan(qo.numpy(), lens.numpy())
        run = per_call(lambda: torch.ops.slimserve.paged_attention_run(
            q, k, v, block, lens, out, None, plan.id, "auto", "NHD", 0.0, None, None), calls)
        print(f"paged_attention_run (plan made once):      {run:7.1f} us host CPU per call")
        cache = ss.PagedKVCache(k, v)
        wrapper = per_call(lambda: plan.wrapper.run(q, cache, out=out, block_table=block, seq_lens=lens,
                                                    synchronize=False), calls)
        print(f"  of which PagedAttentionWrapper.run:      {wrapper:7.1f} us (the rest: torch dispatch, the cache view)")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
