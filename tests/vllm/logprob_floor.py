"""Diagnostic (not run by CI): how far three correct BF16 attention backends' prompt logprobs
are apart on the prefix test's 231-token prompt, teacher-forced: stock vLLM's CPU kernel, the
float32 PyTorch reference (reference_backend.py: the same BF16 cache, attention in float32)
and slimserve. Prints, per pair, the largest and typical difference of the top-k logprobs
(by the first backend's ranking) and how it depends on the position in the prompt.

    build/vllm-env/bin/python-vllm tests/vllm/logprob_floor.py build/vllm-models/smollm2

Measured result and its reading: docs/vllm.md (Tests)."""
import os
import sys

os.environ["VLLM_PLUGINS"] = ""
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

BACKENDS = {"stock": None, "reference": "reference_backend.ReferenceBackend",
            "slimserve": "slimserve.vllm.backend.SlimserveAttentionBackend"}


def prompt_logprobs(model: str) -> dict:
    from vllm import LLM, SamplingParams
    from vllm.v1.attention import selector
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    from generate import PREFIX_PROMPTS

    runs = {}
    for name, path in BACKENDS.items():
        if path is not None:
            register_backend(AttentionBackendEnum.CPU_ATTN, path)
            selector._cached_get_attn_backend.cache_clear()
        llm = LLM(model=model, dtype="bfloat16", enforce_eager=True, max_model_len=256, max_num_seqs=8, seed=0,
                  max_logprobs=20, enable_prefix_caching=False)
        out = llm.generate([PREFIX_PROMPTS[1]], SamplingParams(max_tokens=1, prompt_logprobs=20), use_tqdm=False)[0]
        runs[name] = [None if p is None else {t: lp.logprob for t, lp in p.items()} for p in out.prompt_logprobs]
        del llm
    return runs


def worst_of_top(p: dict, q: dict, k: int) -> float:
    top = sorted(p, key=lambda t: -p[t])[:k]
    return max(abs(p[t] - q[t]) for t in top if t in q)


def main() -> int:
    runs = prompt_logprobs(sys.argv[1])
    names = list(runs)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            pairs = [(p, q) for p, q in zip(runs[a], runs[b]) if p is not None and q is not None]
            for k in (1, 5, 20):
                d = sorted(worst_of_top(p, q, k) for p, q in pairs)
                print(f"{a} vs {b}, top-{k}: max {d[-1]:.3f}, mean {sum(d) / len(d):.3f}, median {d[len(d) // 2]:.3f} "
                      f"nats over {len(d)} positions")
            for lo, hi in ((1, 40), (40, 128), (128, len(pairs) + 1)):
                d = [worst_of_top(p, q, 20) for p, q in pairs[lo - 1:hi - 1]]
                print(f"{a} vs {b}, top-20, positions {lo}-{hi - 1}: mean {sum(d) / len(d):.3f}, max {max(d):.3f}")
    sys.stdout.flush()
    os._exit(0)  # as generate.py: leave without vLLM's teardown


if __name__ == "__main__":
    sys.exit(main())
