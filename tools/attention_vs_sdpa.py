"""Tensor-core paged attention against torch SDPA on the same GPU (run by scripts/gpu-check).

Reads the Google Benchmark JSON of paged_attention_bench_gpu, times
torch.nn.functional.scaled_dot_product_attention on the same shapes (dense BF16 K/V, GQA by
enable_gqa, causal prefill), and prints / writes a Markdown table. Exit 77 (skipped) when torch
or a CUDA device is missing.

  python3 tools/attention_vs_sdpa.py BENCH_JSON OUT_MD
"""
import json
import re
import sys

HEAD_DIM, KV_HEADS = 128, 8


def our_times(path):
    """{(kind, batch, context, mode): seconds} from the benchmark JSON."""
    scale = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
    out = {}
    with open(path) as f:
        data = json.load(f)
    for b in data.get("benchmarks", []):
        if b.get("error_occurred"):
            continue
        name = b["name"]
        t = b["real_time"] * scale[b.get("time_unit", "ns")]
        m = re.match(r"BM_PagedDecode/batch:(\d+)/context:(\d+)/mode:(\d)", name)
        if m:
            out[("decode", int(m[1]), int(m[2]), int(m[3]))] = t
        m = re.match(r"BM_PagedPrefill/tokens:(\d+)/mode:(\d)", name)
        if m:
            out[("prefill", 1, int(m[1]), int(m[2]))] = t
    return out


def sdpa_seconds(torch, batch, q_heads, q_len, context, causal, iters=20):
    f = torch.nn.functional.scaled_dot_product_attention
    q = torch.randn(batch, q_heads, q_len, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(batch, KV_HEADS, context, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    v = torch.randn_like(k)
    run = lambda: f(q, k, v, is_causal=causal, enable_gqa=True)
    run()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(iters):
        start.record()
        run()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e-3)
    times.sort()
    return times[len(times) // 2]


def main(argv):
    if len(argv) != 3:
        print(__doc__)
        return 2
    try:
        import torch
    except ImportError:
        print("skipped: torch is not installed")
        return 77
    if not torch.cuda.is_available():
        print("skipped: no CUDA device for torch")
        return 77
    ours = our_times(argv[1])
    modes = {0: "bf16 pages", 1: "fp8 e4m3 pages", 2: "fp8 e4m3 pages, fused append"}
    rows = ["| shape | slimserve | ms | torch SDPA (dense bf16) ms | SDPA / slimserve |",
            "|---|---|---|---|---|"]
    sdpa_cache = {}
    for (kind, batch, context, mode), seconds in sorted(ours.items()):
        if kind == "decode":
            key, label = (kind, batch, context), f"decode B{batch} ctx{context} Hq64 Hkv8 D128"
            if key not in sdpa_cache:
                sdpa_cache[key] = sdpa_seconds(torch, batch, 64, 1, context, False)
        else:
            key, label = (kind, batch, context), f"prefill {context} causal Hq32 Hkv8 D128"
            if key not in sdpa_cache:
                sdpa_cache[key] = sdpa_seconds(torch, 1, 32, context, context, True)
        theirs = sdpa_cache[key]
        rows.append(f"| {label} | {modes[mode]} | {seconds * 1e3:.3f} | {theirs * 1e3:.3f} | "
                    f"{theirs / seconds:.2f} |")
    if len(rows) == 2:
        print("no paged attention benchmark rows in", argv[1])
        return 1
    table = "\n".join(rows)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}\n{table}")
    with open(argv[2], "w") as f:
        f.write(f"torch {torch.__version__}, {torch.cuda.get_device_name()}\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
