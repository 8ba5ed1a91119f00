"""Host time per call of the paged-attention torch ops on a decode batch (the CPU emulator runs
the kernels too, so the time spent inside the C run call is measured and subtracted): the convenience op
that plans inside every call (torch.ops.slimserve.paged_attention) and, when the package has it,
the capturable run under a plan made once (torch.ops.slimserve.paged_attention_run). Prints
microseconds per call; speed is measured here, never asserted in tests.

Usage: python op_overhead.py [calls]
"""
import sys
import time

import numpy as np
import torch

import slimserve as ss

HQ, HKV, D, PAGE, PAGES, BATCH, WIDTH = 8, 2, 64, 16, 64, 4, 4


inside_run = [0.0]


def _time_the_run_call():
    """Wraps the library's run entry so the time spent inside it (the emulated kernel) is known."""
    run = ss._lib.slimserve_paged_attention_run

    def timed(*args):
        start = time.perf_counter()
        try:
            return run(*args)
        finally:
            inside_run[0] += time.perf_counter() - start
    ss._lib.slimserve_paged_attention_run = timed


def per_call(fn, calls):
    """(microseconds per call, of which outside the C run call)."""
    fn()  # warm up
    inside_run[0] = 0.0
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    total = (time.perf_counter() - start) / calls * 1e6
    return total, total - inside_run[0] / calls * 1e6


def main(calls: int) -> None:
    rng = np.random.default_rng(0)
    k = torch.from_numpy(rng.uniform(-1, 1, (PAGES, PAGE, HKV, D)).astype(np.float16))
    v = torch.from_numpy(rng.uniform(-1, 1, (PAGES, PAGE, HKV, D)).astype(np.float16))
    q = torch.from_numpy(rng.uniform(-1, 1, (BATCH, HQ, D)).astype(np.float16))
    block = torch.from_numpy(rng.permutation(np.arange(1, PAGES))[: BATCH * WIDTH].reshape(BATCH, WIDTH).astype(np.int32))
    lens = torch.tensor([1, 17, 40, 64], dtype=torch.int32)
    qo = torch.arange(BATCH + 1, dtype=torch.int32)
    out = torch.empty_like(q)
    _time_the_run_call()
    total, host = per_call(lambda: torch.ops.slimserve.paged_attention(q, k, v, qo, block, lens, "auto", 0.0, 0, 0.0,
                                                                       None, None, None), calls)
    print(f"paged_attention (plans inside):      {total:8.1f} us/call, {host:8.1f} us outside the kernel call")
    if hasattr(torch.ops.slimserve, "paged_attention_run"):
        from slimserve.torch_ops import PagedAttentionPlan
        plan = PagedAttentionPlan(HQ, HKV, D, PAGE, q_dtype=torch.float16, max_batch=BATCH, max_num_tokens=BATCH,
                                  max_seq_len=WIDTH * PAGE, max_pages_per_request=WIDTH)
        plan.plan(qo.numpy(), lens.numpy())
        total, host = per_call(lambda: torch.ops.slimserve.paged_attention_run(
            q, k, v, block, lens, out, None, plan.id, "auto", "NHD", 0.0, None, None), calls)
        print(f"paged_attention_run (plan once):     {total:8.1f} us/call, {host:8.1f} us outside the kernel call")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
