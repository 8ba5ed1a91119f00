"""vLLM runs for the plugin tests: greedy generation over the test prompts, each written as
JSON (token ids, each step's top logprobs, teacher-forced prompt logprobs, the backend's
counters) to OUT_DIR/<backend>_<kv dtype>[_mp].json.

    python generate.py --model DIR --out-dir DIR --runs stock:auto,slimserve:fp8_e4m3,...
                       [--multiprocess] [--forced FILE]

Several runs share one process (vLLM's imports cost more than a small model's start-up): the
stock runs come first, then the slimserve backend is registered (as its vllm.general_plugins
entry point would) and vLLM's backend choice re-made; "reference" is the plain-PyTorch FP8
reference backend (reference_backend.py) for machines where stock vLLM's FP8 cannot run;
"slimserve_host" is slimserve's backend with SLIMSERVE_ATTENTION=host (attention read from
slimserve's pages by torch, host_attention.py). With --multiprocess the engine core and
worker run in their own processes and find the plugin through the entry point alone.
--forced FILE: also scores FILE's token sequences (a stock run's prompt + continuation) with
prompt logprobs, so two backends' distributions are compared on the same tokens; without it
the first run scores its own and the later runs the first run's."""
import argparse
import gc
import json
import os
import sys
import time

PROMPTS = [
    "The capital of France is",
    "Here is a short poem about the sea:\n",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Water boils at a temperature of",
    "Once upon a time, in a small village,",
    "The three primary colours are",
    "Q: What is 17 plus 25?\nA:",
    "Photosynthesis is the process by which",
]
MAX_TOKENS = 32
# Prefix caching: the second prompt shares the first's first block (more than 128 tokens), so
# vLLM hands its cached blocks to the second request (a prefix hit, counted in num_cached_tokens).
PREFIX = ("You are a helpful assistant. Answer briefly and precisely, in plain English, without lists. " * 12)
PREFIX_PROMPTS = [PREFIX + "Question: what colour is the sky on a clear day?\nAnswer:",
                  PREFIX + "Question: how many legs does a spider have?\nAnswer:"]
TOP_LOGPROBS = 20


def one_run(LLM, SamplingParams, TokensPrompt, args, backend: str, kv: str, forced_from) -> dict:
    start = time.time()
    llm = LLM(model=args.model, dtype="bfloat16", enforce_eager=True, max_model_len=args.max_model_len,
              kv_cache_dtype=kv, max_num_seqs=len(PROMPTS), seed=0, max_logprobs=TOP_LOGPROBS,
              worker_extension_cls="slimserve.vllm.stats.WorkerStats")
    startup = time.time() - start
    llm.collective_rpc("slimserve_stats_reset")
    greedy = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, logprobs=TOP_LOGPROBS, ignore_eos=True)
    start = time.time()
    outputs = llm.generate(PROMPTS, greedy, use_tqdm=False)
    generate_s = time.time() - start
    result = {"backend": backend, "kv_cache_dtype": kv, "multiprocess": args.multiprocess,
              "startup_s": startup, "generate_s": generate_s, "requests": []}
    for out in outputs:
        completion = out.outputs[0]
        steps = [{str(t): lp.logprob for t, lp in step.items()} for step in completion.logprobs]
        result["requests"].append({"prompt": out.prompt, "prompt_token_ids": list(out.prompt_token_ids),
                                   "token_ids": list(completion.token_ids), "top_logprobs": steps})
    result["stats"] = llm.collective_rpc("slimserve_stats")
    if backend == "slimserve":
        result["guard"] = llm.collective_rpc("slimserve_guard")
        result["steps"] = args.max_tokens
    if kv == "auto" and not args.multiprocess:  # BF16 in-process runs only
        prefix_params = SamplingParams(temperature=0.0, max_tokens=8, logprobs=TOP_LOGPROBS, ignore_eos=True)

        def one(prompt):
            out = llm.generate([prompt], prefix_params, use_tqdm=False)[0]
            return {"token_ids": list(out.outputs[0].token_ids), "num_cached_tokens": out.num_cached_tokens or 0,
                    "top_logprobs": [{str(t): lp.logprob for t, lp in step.items()} for step in out.outputs[0].logprobs]}

        llm.reset_prefix_cache()
        fresh = one(PREFIX_PROMPTS[1])  # computed whole
        llm.reset_prefix_cache()
        one(PREFIX_PROMPTS[0])
        result["prefix"] = {"fresh": fresh, "hit": one(PREFIX_PROMPTS[1])}  # its first block cached
    if backend == "slimserve" and kv == "auto" and not args.multiprocess and args.fault_tokens:
        # The guard's fault test on this engine (no start-up of its own): one block handed to two
        # requests by a patched block pool; compared with this run's first tokens by compare.py.
        import fault

        before = llm.collective_rpc("slimserve_stats")[0]
        fault_params = SamplingParams(temperature=0.0, max_tokens=args.fault_tokens, ignore_eos=True)
        result["fault"] = fault.double_handout(llm, PROMPTS, fault_params)
        after = llm.collective_rpc("slimserve_stats")[0]
        result["fault"]["stats"] = {k: after.get(k, 0) - before.get(k, 0) for k in after}
        print(f"run: fault test: block {result['fault']['block']} handed to two requests, "
              f"{args.fault_tokens} tokens in {result['fault']['generate_s']:.1f} s", flush=True)
    reference = forced_from or result
    sequences = [r["prompt_token_ids"] + r["token_ids"] for r in reference["requests"]]
    scoring = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=TOP_LOGPROBS)
    scored = llm.generate([TokensPrompt(prompt_token_ids=s) for s in sequences], scoring, use_tqdm=False)
    result["forced"] = [[None if p is None else {str(t): lp.logprob for t, lp in p.items()}
                         for p in out.prompt_logprobs] for out in scored]
    print(f"run: {backend} kv={kv} mp={int(args.multiprocess)}: start-up {startup:.1f} s, "
          f"{len(PROMPTS)} x {args.max_tokens} tokens in {generate_s:.1f} s", flush=True)
    del llm
    gc.collect()
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", required=True)
    parser.add_argument("--multiprocess", action="store_true")
    parser.add_argument("--model", required=True)
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--forced")
    parser.add_argument("--max-model-len", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    parser.add_argument("--fault-tokens", type=int, default=8,
                        help="tokens of the tag guard's fault test on the in-process slimserve BF16 engine (0: none)")
    args = parser.parse_args()
    runs = [tuple(r.split(":")) for r in args.runs.split(",")]
    # Which plugins vLLM loads is decided per process: none for stock runs; the multiprocess
    # run's engine processes load slimserve's through its entry point.
    os.environ["VLLM_PLUGINS"] = "slimserve" if args.multiprocess else ""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if args.multiprocess else "0"
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # reference_backend, fault
    forced_from = json.load(open(args.forced)) if args.forced else None
    current = "slimserve" if args.multiprocess else "stock"
    for backend, kv in runs:
        if backend != current:
            from vllm.v1.attention import selector
            from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

            if backend == "stock":
                raise SystemExit("generate.py: stock runs must come first")
            path = {"slimserve": "slimserve.vllm.backend.SlimserveAttentionBackend",
                    "slimserve_host": "slimserve.vllm.backend.SlimserveAttentionBackend",
                    "reference": "reference_backend.ReferenceBackend"}[backend]
            register_backend(AttentionBackendEnum.CPU_ATTN, path)
            selector._cached_get_attn_backend.cache_clear()  # chosen again, now this one
            current = backend
        # slimserve_host: the plugin's accuracy-measurement mode (its layers read the mode when made).
        os.environ["SLIMSERVE_ATTENTION"] = "host" if backend == "slimserve_host" else "kernel"
        result = one_run(LLM, SamplingParams, TokensPrompt, args, backend, kv, forced_from)
        forced_from = forced_from or result  # later runs are scored on the first run's tokens
        name = f"{backend}_{kv}{'_mp' if args.multiprocess else ''}.json"
        json.dump(result, open(os.path.join(args.out_dir, name), "w"))
    return 0


if __name__ == "__main__":
    status = main()
    # Every result is on disk. The multiprocess engine's teardown at interpreter exit aborted
    # once in two runs on the 2-core CI machine ("terminate called without an active
    # exception", a C++ thread object destroyed while joinable, after the JSON was written);
    # leave without running it so that the test judges the tokens, not vLLM's shutdown.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
