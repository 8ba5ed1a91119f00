"""An INT4 checkpoint generating in vLLM's CPU build through slimserve: attention on slimserve's
backend and every quantized linear layer on slimserve's W4A16 GEMM (SLIMSERVE_INT4_LINEAR=1,
slimserve.vllm.int4_linear), greedy, compared with the same weights dequantized to BF16
(benchmarks/accuracy/dequantize_int4.py) run through vLLM's own BF16 linear layers.

    python int4_generate.py INT4_DIR DEQUANTIZED_DIR [--max-tokens 8]

Not part of ctest: the emulated GEMM runs in 210 layers per step (minutes on 2 cores).
Exit 1 when the kernel was not used or the tokens part before a near-tie of the BF16 run's
top two logprobs (within 0.05 nats: the GEMM's decode path applies group scales to FP32
sums, one BF16 rounding away from the dequantized weights)."""
import argparse
import json
import os
import sys
import time

PROMPTS = ["The capital of France is", "Once upon a time, in a small village,"]


def kernels_in_use(worker) -> list:
    """Names of the linear kernels the model's layers hold (compressed-tensors keeps it on the
    layer's scheme, GPTQ on its quant method)."""
    names = set()
    for module in worker.model_runner.model.modules():
        for holder in (getattr(module, "scheme", None), getattr(module, "quant_method", None)):
            kernel = getattr(holder, "kernel", None)
            if kernel is not None:
                names.add(type(kernel).__name__)
    return sorted(names)


def generate(model: str, max_tokens: int, int4_kernel: bool) -> dict:
    os.environ["SLIMSERVE_INT4_LINEAR"] = "1" if int4_kernel else "0"
    from vllm import LLM, SamplingParams

    import slimserve.vllm

    slimserve.vllm.register()
    start = time.time()
    llm = LLM(model=model, dtype="bfloat16", enforce_eager=True, max_model_len=256, max_num_seqs=len(PROMPTS),
              seed=0, max_logprobs=2)
    startup = time.time() - start
    linear = llm.collective_rpc(kernels_in_use)[0]
    start = time.time()
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=2, ignore_eos=True),
                        use_tqdm=False)
    seconds = time.time() - start
    del llm
    return {"linear_methods": linear, "startup_s": startup, "generate_s": seconds,
            "tokens": [list(o.outputs[0].token_ids) for o in outs],
            "text": [o.outputs[0].text for o in outs],
            "top2": [[sorted((lp.logprob for lp in step.values()), reverse=True)[:2] for step in o.outputs[0].logprobs]
                     for o in outs]}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("int4")
    parser.add_argument("dequantized")
    parser.add_argument("--max-tokens", type=int, default=8)
    args = parser.parse_args()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["VLLM_PLUGINS"] = ""
    int4 = generate(args.int4, args.max_tokens, True)
    bf16 = generate(args.dequantized, args.max_tokens, False)
    print(json.dumps({"int4": int4, "dequantized": bf16}, indent=1))
    if not any("SlimserveW4A16LinearKernel" in m for m in int4["linear_methods"]):
        print(f"FAIL: slimserve's W4A16 kernel not used: {int4['linear_methods']}", file=sys.stderr)
        return 1
    for i, (a, b) in enumerate(zip(int4["tokens"], bf16["tokens"])):
        for t, (x, y) in enumerate(zip(a, b)):
            if x != y:
                gap = bf16["top2"][i][t][0] - bf16["top2"][i][t][1]
                verdict = "near-tie" if gap <= 0.05 else "FAIL"
                print(f"{verdict}: prompt {i} parts at token {t} (BF16 top-2 gap {gap:.3f} nats)", file=sys.stderr)
                if verdict == "FAIL":
                    return 1
                break
    print(f"int4 via slimserve W4A16: {int4['text']!r} in {int4['generate_s']:.0f} s; "
          f"dequantized BF16: {bf16['text']!r} in {bf16['generate_s']:.0f} s")
    return 0


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    os._exit(status)
