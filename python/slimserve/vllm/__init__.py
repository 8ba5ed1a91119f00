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
  guard    - slimserve's tags and write owners for vLLM's block ids, the per-step check
  hooks    - where the guard reaches into vLLM's worker and scheduler (internal interfaces)
  backend  - the AttentionBackend class vLLM looks up
  stats    - per-process call counters (evidence the backend ran)
  per_token - FP8 KV with per-token scales (SLIMSERVE_KV_SCALES=per_token)
  int4_linear - slimserve's W4A16 GEMM as vLLM's INT4 linear kernel (SLIMSERVE_INT4_LINEAR=1)
  host_attention - an accuracy-measurement mode, off by default (SLIMSERVE_ATTENTION=host):
              the append kernel writes the pages as always, torch reads them for attention
"""
from __future__ import annotations

import os

BACKEND_PATH = "slimserve.vllm.backend.SlimserveAttentionBackend"
PER_TOKEN_BACKEND_PATH = "slimserve.vllm.per_token.SlimservePerTokenBackend"
KV_SCALES = ("per_tensor", "per_token")


def kv_scales() -> str:
    """The FP8 KV scale granularity SLIMSERVE_KV_SCALES asks for: per_tensor (vLLM's scales,
    the default) or per_token (slimserve's, set by the append; module per_token)."""
    mode = os.environ.get("SLIMSERVE_KV_SCALES") or "per_tensor"
    if mode not in KV_SCALES:
        raise ValueError(f"slimserve vLLM backend: SLIMSERVE_KV_SCALES={mode!r} is not supported "
                         f"(supported: {', '.join(KV_SCALES)})")
    return mode


def register() -> None:
    """Entry point: make vLLM's CPU_ATTN name resolve to slimserve's backend."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    from . import host_attention

    host_attention.mode()  # a misspelt SLIMSERVE_ATTENTION stops the engine here, with the choices
    register_backend(AttentionBackendEnum.CPU_ATTN, PER_TOKEN_BACKEND_PATH if kv_scales() == "per_token" else BACKEND_PATH)
    from . import guard, hooks

    if guard.enabled():  # the engine core's side of the guard (the abort of a refused request)
        hooks.install_engine_hooks()
    if os.environ.get("SLIMSERVE_INT4_LINEAR", "0") not in ("", "0"):
        from . import int4_linear

        int4_linear.install()
