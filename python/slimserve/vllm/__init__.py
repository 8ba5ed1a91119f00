"""slimserve as vLLM's attention backend (vLLM 0.32, CPU platform and CUDA).

`register` is the `vllm.general_plugins` entry point: vLLM calls it in every process it starts
(engine core, workers) before it picks attention backends, and it routes the CPU platform's
only backend name, CPU_ATTN, to `slimserve.vllm.backend.SlimserveAttentionBackend`. Select or
exclude it as any vLLM plugin: `VLLM_PLUGINS=slimserve` (only this one), `VLLM_PLUGINS=`
(none). See docs/vllm.md.

Modules, one concern each:
  support  - what the backend takes (head sizes, block sizes, dtypes); start-up refusals
  layout   - vLLM's per-layer cache tensor viewed as slimserve's paged K/V cache
  metadata - the per-step plan (page table, append slots) built once, shared by all layers
  impl     - do_kv_cache_update (quantize-and-append) and forward (paged attention)
  backend  - the AttentionBackend class vLLM looks up
  stats    - per-process call counters (evidence the backend ran)
"""
from __future__ import annotations

BACKEND_PATH = "slimserve.vllm.backend.SlimserveAttentionBackend"


def register() -> None:
    """Entry point: make vLLM's CPU_ATTN name resolve to slimserve's backend."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    register_backend(AttentionBackendEnum.CPU_ATTN, BACKEND_PATH)
