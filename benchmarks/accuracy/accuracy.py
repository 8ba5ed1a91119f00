"""Accuracy of FP8 KV and INT4 weights in vLLM on slimserve's attention backend, measured the
way llama.cpp's perplexity tool measures it (docs/accuracy.md).

    python accuracy.py row --name NAME --model DIR --kv DTYPE [--per-token] --results DIR
                           --text FILE [--context 512] [--tokens 20000]
    python accuracy.py table --results DIR [--rows NAME,...]
    python accuracy.py effects --kernel-bf16 DIR --kernel-format DIR --host-results DIR --row NAME

The text is cut into windows of `--context` tokens; as llama.cpp does, each window's first
half is context only and its second half is scored: the next-token distribution at each of
those positions, from vLLM's prompt-logprobs pass. Windows are taken until `--tokens` positions
are scored. The row named "reference" (BF16 KV, unquantized weights) writes its full
distributions (the logits, exactly as vLLM computed them) to RESULTS/reference.logits; every
other row reads them back window by window and keeps, per scored position, its own and the
reference's negative log-likelihood of the true token, the KL divergence
KL(reference || row) over the whole vocabulary and whether the two most likely tokens agree.

How the full distributions come out of vLLM: vLLM computes prompt logprobs from the model's
logits (`model.compute_logits` over the prompt's hidden states, inside the model runner's
`_get_prompt_logprobs_dict`) and keeps only the top k. The engine runs in this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0); `collective_rpc` wraps those two calls of the worker's
model runner so that the logits computed for prompt logprobs are handed to this script as
well (the values vLLM's own prompt logprobs come from; checked: our log-softmax of them gives
vLLM's returned logprob of every scored token). One request at a time (max_num_seqs=1) and a
whole window per step, so each such call is exactly one window's positions.
"""
import argparse
import gc
import json
import os
import sys
import time

import numpy as np

SCORED_HALF = 2  # llama.cpp: the first n_ctx / 2 tokens of a window are context only
KV_CACHE_BYTES = 64 << 20  # 2,900 tokens of BF16 KV for SmolLM2; a run holds one window


def windows(text_file: str, model: str, context: int, tokens: int):
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(model).encode(open(text_file, encoding="utf-8").read(),
                                                      add_special_tokens=False)
    scored = context - context // SCORED_HALF
    count = -(-tokens // scored)
    if count * context > len(ids):
        raise SystemExit(f"{text_file}: {len(ids)} tokens, {count} windows of {context} need {count * context}")
    return [ids[i * context:(i + 1) * context] for i in range(count)], len(ids)


class Capture:
    """Receives, per window, the logits vLLM computed for its prompt positions."""

    def __init__(self):
        self.active = False
        self.calls = []

    def install(self, worker):
        runner = worker.model_runner
        model = runner.model
        original_logits, original_prompt = model.compute_logits, runner._get_prompt_logprobs_dict
        capture = self

        def prompt_logprobs(*args, **kwargs):
            capture.active = True
            try:
                return original_prompt(*args, **kwargs)
            finally:
                capture.active = False

        def compute_logits(hidden_states, *args, **kwargs):
            logits = original_logits(hidden_states, *args, **kwargs)
            if capture.active:
                capture.calls.append(logits.detach().to("cpu", copy=True))
            return logits

        runner._get_prompt_logprobs_dict = prompt_logprobs
        model.compute_logits = compute_logits
        return True


def widen_linear_layers(worker):
    """The model's BF16 linear layers (and the tied lm_head) computed as float32 GEMMs of the
    exactly widened activations and weights, the output rounded back to BF16: what vLLM's CPU
    fallback (torch.nn.functional.linear in BF16, accumulating in float32) computes up to the
    order of the sums, about 7 times faster on a CPU without AVX-512 BF16. Every row, the
    reference included, runs the same GEMMs, so the rows' differences are the KV cache's and
    the weights'. The float32 copies of the weights are made once."""
    import torch

    count = 0
    for module in worker.model_runner.model.modules():
        weight = getattr(module, "weight", None)
        if not hasattr(module, "cpu_linear") or weight is None or weight.dim() != 2 or weight.dtype != torch.bfloat16:
            continue
        w32 = weight.detach().to(torch.float32)
        bias = getattr(module, "bias", None)
        b32 = None if bias is None else bias.detach().to(torch.float32)

        def linear(x, _weight, _bias, w32=w32, b32=b32):
            return torch.nn.functional.linear(x.to(torch.float32), w32, b32).to(x.dtype)

        module.cpu_linear = linear
        count += 1
    return count


def reference_logits(logits_path: str, results: str):
    """The reference's logits, or, while the reference row is still running in another
    process, the file it is writing (a shared mapping: its windows appear as they are done)."""
    if not os.path.exists(logits_path + ".npy") and os.path.exists(logits_path + ".partial.npy"):
        return np.load(logits_path + ".partial.npy", mmap_mode="r")
    return np.load(logits_path + ".npy", mmap_mode="r")


def wait_for_reference(logits_path: str, results: str, window: int) -> None:
    """Returns once the reference has written `window` (its log reports each window after
    writing it; the finished file has them all)."""
    log = os.path.join(results, "reference.log")
    while not os.path.exists(logits_path + ".npy"):
        done = 0
        for line in open(log, encoding="utf-8", errors="replace"):
            if line.startswith("row reference: window "):
                done = int(line.split()[3].split("/")[0])
        if done > window:
            return
        time.sleep(5)


def stored_dtype(dtype):
    """The reference's logits are kept exactly: bfloat16 logits (a bfloat16 model's) as their
    16 bits (numpy has no bfloat16), anything else as float32."""
    import torch

    return np.uint16 if dtype == torch.bfloat16 else np.float32


def to_stored(logits):
    import torch

    if logits.dtype == torch.bfloat16:
        return logits.contiguous().view(torch.int16).numpy().view(np.uint16)
    return logits.to(torch.float32).numpy()


def from_stored(array):
    import torch

    if array.dtype == np.uint16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def log_softmax(logits):
    import torch

    return torch.log_softmax(logits.to(torch.float32), dim=-1)


def run_row(args) -> int:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ["VLLM_PLUGINS"] = ""  # the backend is registered below, in this process
    if args.per_token:
        os.environ["SLIMSERVE_KV_SCALES"] = "per_token"
    if args.rotation != "none":
        os.environ["SLIMSERVE_KV_ROTATION"] = args.rotation
    os.environ["SLIMSERVE_ATTENTION"] = args.attention
    os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)  # sized below: one window needs a few MiB
    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    import slimserve.vllm

    slimserve.vllm.register()
    start = time.time()
    chunks, text_tokens = windows(args.text, args.model, args.context, args.tokens)
    first = args.context // SCORED_HALF  # first scored target position in a window
    llm = LLM(model=args.model, dtype="bfloat16", enforce_eager=True, max_model_len=args.context + 128,
              kv_cache_dtype=args.kv, max_num_seqs=1, max_num_batched_tokens=args.context,
              enable_prefix_caching=False, seed=0, max_logprobs=1, kv_cache_memory_bytes=KV_CACHE_BYTES,
              worker_extension_cls="slimserve.vllm.stats.WorkerStats")
    startup = time.time() - start
    capture = Capture()
    llm.collective_rpc(capture.install)
    widened = llm.collective_rpc(widen_linear_layers)[0] if args.linear == "float32" else 0
    llm.collective_rpc("slimserve_stats_reset")
    reference = args.name == "reference"
    os.makedirs(args.results, exist_ok=True)
    logits_path = os.path.join(args.results, "reference.logits")
    vocab = None
    store = None
    per_position = {k: [] for k in ("nll", "nll_ref", "kld", "same_top")}
    max_check = 0.0
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    run_start = time.time()
    for w, chunk in enumerate(chunks):
        capture.calls.clear()
        out = llm.generate([TokensPrompt(prompt_token_ids=chunk)], params, use_tqdm=False)[0]
        if len(capture.calls) != 1 or capture.calls[0].shape[0] != len(chunk) - 1:
            raise SystemExit(f"window {w}: captured {[tuple(c.shape) for c in capture.calls]}, expected one "
                             f"[{len(chunk) - 1}, vocab] (one request per step, whole window)")
        logits = capture.calls[0][first - 1:]  # position p predicts token p + 1
        targets = torch.tensor(chunk[first:], dtype=torch.int64)
        lp = log_softmax(logits)
        nll = -lp.gather(1, targets[:, None])[:, 0]
        vllm_lp = torch.tensor([p[tok].logprob for p, tok in zip(out.prompt_logprobs[first:], chunk[first:])])
        max_check = max(max_check, float((nll + vllm_lp).abs().max()))
        if vocab is None:
            vocab = logits.shape[1]
        if reference:
            if store is None:
                store = np.lib.format.open_memmap(logits_path + ".partial.npy", mode="w+",
                                                  dtype=stored_dtype(logits.dtype),
                                                  shape=(len(chunks), logits.shape[0], vocab))
            store[w] = to_stored(logits)
            ref_lp = lp
        else:
            if store is None:
                store = reference_logits(logits_path, args.results)
                if store.shape[0] < len(chunks) or store.shape[1:] != (logits.shape[0], vocab):
                    raise SystemExit(f"{logits_path}.npy holds {store.shape}; this run scores "
                                     f"{(len(chunks), logits.shape[0], vocab)}: rerun the reference")
            wait_for_reference(logits_path, args.results, w)
            ref_lp = log_softmax(from_stored(np.array(store[w])))
        nll_ref = -ref_lp.gather(1, targets[:, None])[:, 0]
        kld = (ref_lp.exp() * (ref_lp - lp)).sum(dim=1).clamp_min(0.0)
        same = (ref_lp.argmax(dim=1) == lp.argmax(dim=1))
        for key, value in (("nll", nll), ("nll_ref", nll_ref), ("kld", kld), ("same_top", same)):
            per_position[key].append(value.numpy().astype(np.float64))
        if not reference and (w + 1) % 5 == 0:  # what an interrupted row has measured so far
            np.savez(os.path.join(args.results, f"{args.name}.partial.npz"),
                     **{k: np.concatenate(v) for k, v in per_position.items()})
        print(f"row {args.name}: window {w + 1}/{len(chunks)} {time.time() - run_start:.0f} s, mean KLD so far "
              f"{np.concatenate(per_position['kld']).mean():.3e}", flush=True)
    if reference:
        store.flush()
        del store
        os.replace(logits_path + ".partial.npy", logits_path + ".npy")
    stats = llm.collective_rpc("slimserve_stats")[0]
    if not stats.get("forward"):
        raise SystemExit(f"row {args.name}: slimserve's backend was not called ({stats})")
    arrays = {k: np.concatenate(v) for k, v in per_position.items()}
    np.savez(os.path.join(args.results, f"{args.name}.npz"), **arrays)
    summary = {"name": args.name, "model": args.model, "weights": args.weights, "kv": args.kv,
               "per_token": args.per_token, "rotation": args.rotation, "attention": args.attention, "linear": args.linear,
               "linear_layers_widened": widened, "context": args.context, "windows": len(chunks),
               "scored": int(arrays["nll"].size), "text_tokens_used": len(chunks) * args.context,
               "text_tokens_available": text_tokens, "vocab": vocab, "startup_s": startup,
               "run_s": time.time() - run_start, "max_logprob_check": max_check,
               "backend_calls": {k: v for k, v in stats.items() if isinstance(v, (int, float))}}
    json.dump(summary, open(os.path.join(args.results, f"{args.name}.json"), "w"), indent=1)
    print(f"row {args.name}: {summary['scored']} positions, {summary['run_s']:.0f} s "
          f"(start-up {startup:.0f} s); |our logprob - vLLM's| <= {max_check:.2e}", flush=True)
    del llm
    gc.collect()
    return 0


def row_metrics(a) -> dict:
    nll, nll_ref, kld = a["nll"], a["nll_ref"], a["kld"]
    n = nll.size
    ppl = float(np.exp(nll.mean()))
    ppl_err = ppl * float(nll.std(ddof=1)) / np.sqrt(n)
    diff = nll - nll_ref  # paired: the same positions
    ref_ppl = float(np.exp(nll_ref.mean()))
    d_ppl = ppl - ref_ppl
    d_err = ppl * float(diff.std(ddof=1)) / np.sqrt(n)
    return {"ppl": ppl, "ppl_err": ppl_err, "d_ppl": d_ppl, "d_ppl_err": d_err,
            "kld": float(kld.mean()), "kld_err": float(kld.std(ddof=1)) / np.sqrt(n),
            "kld_p99": float(np.percentile(kld, 99)), "same_top": float(a["same_top"].mean()),
            "same_top_err": float(np.sqrt(a["same_top"].mean() * (1 - a["same_top"].mean()) / n)), "n": n}


WEIGHT_LABELS = {"unquantized": "unquantized (BF16)", "int4_g32": "INT4 g32", "int4_g64": "INT4 g64",
                 "int4_g128": "INT4 g128 (down_proj; K = 576 layers BF16)"}
KV_LABELS = {"auto": "BF16", "fp8_e4m3": "FP8 e4m3, per-tensor scale 1", "fp8_e5m2": "FP8 e5m2, per-tensor scale 1",
             "nvfp4": "NVFP4 (E4M3 scale per 16, tensor scale 1/6)"}
ROTATION_LABELS = {"keys": ", Hadamard-rotated K", "keys_and_values": ", Hadamard-rotated K and V"}


def kv_label(s: dict) -> str:
    if s["per_token"]:
        return "FP8 e4m3, per-token scales"
    return KV_LABELS.get(s["kv"], s["kv"]) + ROTATION_LABELS.get(s.get("rotation", "none"), "")


def stopped_row(results: str, name: str) -> dict:
    """What a row's summary would say, for a row stopped before its end (its partial results
    and log): its configuration from its name, as run.sh maps names, and its time so far."""
    kv, weights = name, "unquantized"
    if "_int4_g" in name:
        kv, weights = name.split("_int4_g")[0], "int4_g" + name.split("_int4_g")[1]
    rotation = "keys_and_values" if kv.endswith("_rot_kv") else "keys" if kv.endswith("_rot") else "none"
    kv = kv.split("_rot")[0]
    per_token = kv.endswith("_token")
    kv = kv[: -len("_token")] if per_token else kv
    kv = "auto" if kv in ("bf16", "reference") else kv
    run_s, windows = 0.0, 0
    for line in open(os.path.join(results, f"{name}.log"), encoding="utf-8", errors="replace"):
        if line.startswith(f"row {name}: window "):
            windows, run_s = int(line.split()[3].split("/")[0]), float(line.split()[4])
    return {"name": name, "kv": kv, "weights": weights, "per_token": per_token, "rotation": rotation,
            "startup_s": 0.0, "run_s": run_s,
            "attention": "host", "linear": "float32", "stopped_after_windows": windows}


def table(args) -> int:
    names = args.rows.split(",") if args.rows else sorted(
        f[:-5] for f in os.listdir(args.results) if f.endswith(".json"))
    names = ["reference"] + [n for n in names if n != "reference"]
    lines = ["| KV cache | weights | PPL | ΔPPL | mean KLD | p99 KLD | same top token | row time |",
             "|---|---|---|---|---|---|---|---|"]
    total = 0.0
    present = [n for n in names if os.path.exists(os.path.join(args.results, f"{n}.json"))
               or (args.positions and os.path.exists(os.path.join(args.results, f"{n}.partial.npz")))]
    if args.positions:  # the first N positions of every row (rows stopped early: see run.sh)
        common = args.positions
    # The reference may have scored more windows than the rows (rows read a prefix of its
    # logits): its own line covers the positions the rows have in common.
    else:
        common = min(json.load(open(os.path.join(args.results, f"{n}.json")))["scored"] for n in present)
    for name in present:
        done = os.path.exists(os.path.join(args.results, f"{name}.json"))
        s = json.load(open(os.path.join(args.results, f"{name}.json"))) if done else stopped_row(args.results, name)
        arrays = {k: v[:common] for k, v in np.load(os.path.join(args.results, f"{name}{'' if done else '.partial'}.npz")).items()}
        if arrays["nll"].size < common:
            raise SystemExit(f"row {name} has {arrays['nll'].size} positions, fewer than {common}")
        m = row_metrics(arrays)
        total += s["startup_s"] + s["run_s"]
        kv = kv_label(s)
        time_s = f"{s['startup_s'] + s['run_s']:.0f} s"
        if name == "reference":
            lines.append(f"| {kv} | {WEIGHT_LABELS.get(s['weights'], s['weights'])} | {m['ppl']:.4f} ± {m['ppl_err']:.4f} | (reference) | "
                         f"(reference) | (reference) | (reference) | {time_s} |")
        else:
            lines.append(f"| {kv} | {WEIGHT_LABELS.get(s['weights'], s['weights'])} | {m['ppl']:.4f} ± {m['ppl_err']:.4f} | "
                         f"{m['d_ppl']:+.4f} ± {m['d_ppl_err']:.4f} | {m['kld']:.2e} ± {m['kld_err']:.1e} | "
                         f"{m['kld_p99']:.2e} | {100 * m['same_top']:.2f} ± {100 * m['same_top_err']:.2f} % | {time_s} |")
    ref = json.load(open(os.path.join(args.results, "reference.json")))
    present_modes = [json.load(open(os.path.join(args.results, f"{n}.json"))) if os.path.exists(
        os.path.join(args.results, f"{n}.json")) else stopped_row(args.results, n) for n in present]
    print("\n".join(lines))
    modes = sorted({(m.get("attention", "kernel"), m.get("linear", "vllm")) for m in present_modes})
    print(f"\n{common} scored positions ({common // (ref['context'] - ref['context'] // SCORED_HALF)} windows of "
          f"{ref['context']} tokens, the second half of each scored); attention / linear layers: "
          f"{', '.join(f'{a} / {l}' for a, l in modes)}; rows' start-up and run: {total:.0f} s in all")
    return 0


def finish_reference(args) -> int:
    """Ends a reference row that was stopped early (its process ended, e.g. killed to free the
    machine for the other rows): keeps its first --windows windows (its log must report them
    done), writes their logits as the reference file and the row's per-position results and
    summary, as a finished reference row would have."""
    import torch

    logits_path = os.path.join(args.results, "reference.logits")
    done = 0
    for line in open(os.path.join(args.results, "reference.log"), encoding="utf-8", errors="replace"):
        if line.startswith("row reference: window "):
            done = int(line.split()[3].split("/")[0])
    if args.windows > done:
        raise SystemExit(f"the reference log reports {done} windows done, not {args.windows}")
    partial = np.load(logits_path + ".partial.npy", mmap_mode="r")
    chunks, text_tokens = windows(args.text, args.model, args.context, args.windows * (args.context // SCORED_HALF))
    first = args.context // SCORED_HALF
    store = np.lib.format.open_memmap(logits_path + ".finishing.npy", mode="w+", dtype=partial.dtype,
                                      shape=(args.windows,) + partial.shape[1:])
    nll = []
    for w, chunk in enumerate(chunks):
        store[w] = partial[w]
        lp = log_softmax(from_stored(np.array(partial[w])))
        targets = torch.tensor(chunk[first:], dtype=torch.int64)
        nll.append((-lp.gather(1, targets[:, None])[:, 0]).numpy().astype(np.float64))
    store.flush()
    del store
    os.replace(logits_path + ".finishing.npy", logits_path + ".npy")
    os.remove(logits_path + ".partial.npy")
    nll = np.concatenate(nll)
    np.savez(os.path.join(args.results, "reference.npz"), nll=nll, nll_ref=nll, kld=np.zeros_like(nll),
             same_top=np.ones(nll.shape, dtype=bool))
    summary = {"name": "reference", "model": args.model, "weights": "unquantized", "kv": "auto", "per_token": False,
               "attention": args.attention, "linear": args.linear, "context": args.context, "windows": args.windows,
               "scored": int(nll.size), "text_tokens_used": args.windows * args.context,
               "text_tokens_available": text_tokens, "vocab": int(partial.shape[2]), "startup_s": 0.0,
               "run_s": args.run_s, "stopped_early": f"after {args.windows} windows (finish-reference)"}
    json.dump(summary, open(os.path.join(args.results, "reference.json"), "w"), indent=1)
    print(f"reference: {nll.size} positions kept ({args.windows} windows)")
    return 0


def effects(args) -> int:
    """A KV format's effect measured both ways on the same windows: KL(BF16 || format) with
    the kernel (two kernel runs' logits, faithfulness.sh's "reference" runs) against the same
    with host attention (the table's row, per position), so that host mode is judged by what
    it is used for: measuring the format's effect."""
    import torch

    base = np.load(os.path.join(args.kernel_bf16, "reference.logits.npy"), mmap_mode="r")
    fmt = np.load(os.path.join(args.kernel_format, "reference.logits.npy"), mmap_mode="r")
    done = os.path.join(args.host_results, f"{args.row}.npz")
    host = np.load(done if os.path.exists(done) else os.path.join(args.host_results, f"{args.row}.partial.npz"))
    n = min(base.shape[0], fmt.shape[0]) * base.shape[1]
    kld, same = [], []
    for w in range(min(base.shape[0], fmt.shape[0])):
        ref_lp = log_softmax(from_stored(np.array(base[w])))
        lp = log_softmax(from_stored(np.array(fmt[w])))
        kld.append((ref_lp.exp() * (ref_lp - lp)).sum(dim=1).clamp_min(0.0).numpy().astype(np.float64))
        same.append((ref_lp.argmax(dim=1) == lp.argmax(dim=1)).numpy())
    kernel = {"kld": np.concatenate(kld), "same_top": np.concatenate(same)}
    hostp = {"kld": host["kld"][:n], "same_top": host["same_top"][:n]}
    for label, a in (("kernel", kernel), ("host", hostp)):
        k, t = a["kld"], a["same_top"].astype(np.float64)
        print(f"{args.row} effect over the first {n} positions, {label}: mean KLD {k.mean():.3e} ± "
              f"{k.std(ddof=1) / np.sqrt(n):.1e}, p99 {np.percentile(k, 99):.3e}, same top {100 * t.mean():.2f} %")
    d = kernel["kld"] - hostp["kld"]
    print(f"{args.row}: kernel - host mean KLD {d.mean():+.3e} ± {d.std(ddof=1) / np.sqrt(n):.1e} (paired)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    row = sub.add_parser("row")
    row.add_argument("--name", required=True)
    row.add_argument("--model", required=True)
    row.add_argument("--weights", default="unquantized", help="the weights' label in the table")
    row.add_argument("--kv", default="auto")
    row.add_argument("--per-token", action="store_true")
    row.add_argument("--rotation", default="none", choices=("none", "keys", "keys_and_values"),
                     help="SLIMSERVE_KV_ROTATION: Hadamard-rotate K (and V) head vectors before they are quantized")
    row.add_argument("--linear", choices=("float32", "vllm"), default="float32",
                     help="float32: the BF16 linear layers as float32 GEMMs (widen_linear_layers); vllm: vLLM's own")
    row.add_argument("--attention", choices=("host", "kernel"), default="host",
                     help="SLIMSERVE_ATTENTION: host (torch over slimserve's pages) or kernel (the emulated kernel)")
    row.add_argument("--results", required=True)
    row.add_argument("--text", required=True)
    row.add_argument("--context", type=int, default=512)
    row.add_argument("--tokens", type=int, default=20000)
    tab = sub.add_parser("table")
    tab.add_argument("--results", required=True)
    tab.add_argument("--rows")
    tab.add_argument("--positions", type=int, help="score the first N positions of every row (default: all they share)")
    fin = sub.add_parser("finish-reference")
    fin.add_argument("--results", required=True)
    fin.add_argument("--model", required=True)
    fin.add_argument("--text", required=True)
    fin.add_argument("--context", type=int, default=512)
    fin.add_argument("--windows", type=int, required=True)
    fin.add_argument("--run-s", type=float, required=True, help="the row's run time so far (its log)")
    fin.add_argument("--attention", default="host")
    fin.add_argument("--linear", default="float32")
    eff = sub.add_parser("effects")
    eff.add_argument("--kernel-bf16", required=True)
    eff.add_argument("--kernel-format", required=True)
    eff.add_argument("--host-results", required=True)
    eff.add_argument("--row", required=True)
    args = parser.parse_args()
    return {"row": run_row, "table": table, "effects": effects, "finish-reference": finish_reference}[args.command](args)


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # every result is on disk; skip vLLM's teardown
