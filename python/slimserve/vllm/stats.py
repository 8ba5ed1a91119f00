"""Per-process counters of what the backend ran: evidence that vLLM called slimserve (each
layer's forward and cache update per step) and the tag guard's verdicts. Read in-process with
`snapshot()`, or from vLLM's workers through `WorkerStats` (a worker extension:
`LLM(..., worker_extension_cls="slimserve.vllm.stats.WorkerStats")`, then
`llm.collective_rpc("slimserve_stats")`)."""
from __future__ import annotations

from collections import Counter

COUNTS: Counter = Counter()


def count(name: str, n: int = 1) -> None:
    COUNTS[name] += n


def snapshot() -> dict:
    return dict(COUNTS)


def reset() -> None:
    COUNTS.clear()


class WorkerStats:
    """Mixed into vLLM's worker class by `worker_extension_cls`."""

    def slimserve_stats(self) -> dict:
        return snapshot()

    def slimserve_stats_reset(self) -> None:
        reset()
