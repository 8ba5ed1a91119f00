"""Per-process counters of what the backend ran: evidence that vLLM called slimserve (each
layer's forward and cache update per step) and the tag guard's verdicts. Read in-process with
`snapshot()`, or from vLLM's workers through `WorkerStats` (a worker extension:
`LLM(..., worker_extension_cls="slimserve.vllm.stats.WorkerStats")`, then
`llm.collective_rpc("slimserve_stats")`)."""
from __future__ import annotations

from collections import Counter

COUNTS: Counter = Counter()
# The layers' cache tensors as the backend saw them: data pointer -> (shape, dtype, nbytes).
CACHES: dict = {}


def count(name: str, n: int = 1) -> None:
    COUNTS[name] += n


def snapshot() -> dict:
    return dict(COUNTS)


def note_cache(tensor) -> None:
    CACHES[tensor.data_ptr()] = (tuple(tensor.shape), str(tensor.dtype), tensor.nbytes)


def kv_cache_summary() -> dict:
    """The real cache: layers, blocks, block size, bytes per token (K + V, all layers)."""
    if not CACHES:
        return {}
    shapes = list(CACHES.values())
    num_blocks, kv_heads, block_size, twice_head = shapes[0][0]
    total = sum(nbytes for _, _, nbytes in shapes)
    return {"layers": len(shapes), "num_blocks": num_blocks, "block_size": block_size, "kv_heads": kv_heads,
            "head_size": twice_head // 2, "dtype": shapes[0][1], "bytes": total,
            "bytes_per_token": total // (num_blocks * block_size)}


def reset() -> None:
    COUNTS.clear()


class WorkerStats:
    """Mixed into vLLM's worker class by `worker_extension_cls`."""

    def slimserve_stats(self) -> dict:
        return snapshot()

    def slimserve_stats_reset(self) -> None:
        reset()

    def slimserve_kv_cache(self) -> dict:
        return kv_cache_summary()

    def slimserve_guard(self) -> dict:
        from .guard import ACTIVE

        return ACTIVE["guard"].summary() if ACTIVE["guard"] is not None else {}
