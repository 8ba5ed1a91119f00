"""SmolLM2-135M-Instruct answering chat prompts through vLLM (CPU build) with slimserve as its
attention backend and an FP8 KV cache: slimserve quantizes each new token's K/V into vLLM's
cache blocks and attends over them (on a machine without a GPU, on slimserve's kernel emulator).
Then the KV cache as allocated: bytes per token and tokens per GiB, FP8 against BF16.

    build/vllm-env/bin/python-vllm examples/vllm/chat.py MODEL_DIR [--kv-cache-dtype fp8_e4m3] [--int4]

--int4: MODEL_DIR is an INT4 folder (slimserve_quantize_int4's compressed-tensors or GPTQ
output) and its linear layers run on slimserve's W4A16 GEMM (slimserve.vllm.int4_linear; vLLM's
own INT4 CPU kernel needs AVX-512). On the CPU emulator that GEMM makes this several minutes."""
import argparse
import os
import sys
import time

QUESTIONS = [
    "What is the capital of France?",
    "Give me three tips for staying focused while studying.",
    "Write a haiku about autumn leaves.",
    "Explain in two sentences what a CPU cache is.",
]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--kv-cache-dtype", default="fp8_e4m3")
    parser.add_argument("--max-tokens", type=int, default=None, help="per answer (default 48; 12 with --int4)")
    parser.add_argument("--int4", action="store_true", help="INT4 weights on slimserve's W4A16 GEMM")
    args = parser.parse_args()
    if args.int4:
        os.environ["SLIMSERVE_INT4_LINEAR"] = "1"  # read by slimserve's plugin entry point
    if args.max_tokens is None:  # the emulated W4A16 GEMM: 4 answers x 4 tokens took 172 s on a loaded 2-core machine
        args.max_tokens = 12 if args.int4 else 48
    os.environ.setdefault("VLLM_PLUGINS", "slimserve")  # slimserve's entry point registers the backend
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # the demo's own lines only
    os.environ.setdefault("TQDM_DISABLE", "1")
    from vllm import LLM, SamplingParams

    start = time.time()
    llm = LLM(model=args.model, dtype="bfloat16", enforce_eager=True, max_model_len=512,
              kv_cache_dtype=args.kv_cache_dtype, max_num_seqs=len(QUESTIONS), seed=0,
              worker_extension_cls="slimserve.vllm.stats.WorkerStats")
    print(f"vLLM started in {time.time() - start:.0f} s (KV cache {args.kv_cache_dtype}, attention: slimserve"
          f"{', INT4 linear layers: slimserve W4A16' if args.int4 else ''})")
    start = time.time()
    conversations = [[{"role": "user", "content": q}] for q in QUESTIONS]
    outputs = llm.chat(conversations, SamplingParams(temperature=0.0, max_tokens=args.max_tokens), use_tqdm=False)
    seconds = time.time() - start
    tokens = 0
    for question, out in zip(QUESTIONS, outputs):
        answer = out.outputs[0]
        tokens += len(answer.token_ids)
        print(f"\n> {question}\n{answer.text.strip()}")
    counts = llm.collective_rpc("slimserve_stats")[0]
    cache = llm.collective_rpc("slimserve_kv_cache")[0]
    print(f"\n{tokens} tokens in {seconds:.1f} s; slimserve ran {counts.get('forward', 0)} attention calls and "
          f"{counts.get('kv_update', 0)} KV appends ({cache['layers']} layers per step)"
          + (f", {counts.get('int4_gemm', 0)} W4A16 GEMMs" if args.int4 else "")
          + f"; its tag guard checked {counts.get('guard_checks', 0)} steps' blocks and aborted "
          f"{counts.get('guard_aborted', 0)} requests")
    element = {"torch.uint8": 1, "torch.float8_e4m3fn": 1, "torch.float8_e5m2": 1}.get(cache["dtype"], 2)
    per_token = cache["bytes_per_token"]
    bf16_per_token = per_token * 2 // element
    print(f"KV cache as allocated: {cache['num_blocks']} blocks of {cache['block_size']} tokens x {cache['layers']} "
          f"layers, {cache['kv_heads']} KV heads x {cache['head_size']}, {cache['dtype']}, "
          f"{cache['bytes'] / 2**20:.0f} MiB")
    print(f"  {'KV dtype':<10} {'bytes/token':>12} {'tokens/GiB':>12}")
    print(f"  {'bfloat16':<10} {bf16_per_token:>12,} {2**30 // bf16_per_token:>12,}")
    if element == 1:
        print(f"  {args.kv_cache_dtype:<10} {per_token:>12,} {2**30 // per_token:>12,}   "
              f"({bf16_per_token / per_token:.1f}x the tokens in the same memory)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
