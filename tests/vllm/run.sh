#!/usr/bin/env bash
# slimserve inside vLLM (CPU build), SmolLM2-135M: stock vLLM and slimserve's backend on the
# same prompts, BF16 and FP8 KV, in-process and multiprocess; compare.py checks the results.
# Skips (exit 77) only when the vLLM environment cannot be made (no package index reachable).
# Usage: run.sh [LIBRARY]   (the emulated C library; default: build/default's)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
[[ -n ${1:-} ]] && export SLIMSERVE_LIBRARY=$1
start=$SECONDS
if ! python=$("$root/scripts/vllm-env" 2>"${TMPDIR:-/tmp}/vllm-env.$$.log"); then
  cat "${TMPDIR:-/tmp}/vllm-env.$$.log" >&2
  echo "vllm tests: SKIPPED, the vLLM environment could not be made (see above)" >&2
  exit 77
fi
echo "vLLM environment ready in $((SECONDS - start)) s"
model="$root/build/vllm-env/models/smollm2"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
set -e
gen() { "$python" "$here/generate.py" --model "$model" "$@" 2>"$out/log" || { tail -50 "$out/log" >&2; exit 1; }; }
gen --backend stock --out "$out/stock_bf16.json" --forced self
gen --backend slimserve --out "$out/slim_bf16.json"
gen --backend stock --kv-cache-dtype fp8_e4m3 --out "$out/stock_fp8.json" --forced "$out/stock_bf16.json"
gen --backend slimserve --kv-cache-dtype fp8_e4m3 --out "$out/slim_fp8.json" --forced "$out/stock_bf16.json"
gen --backend slimserve --multiprocess --out "$out/slim_bf16_mp.json"
"$python" "$here/compare.py" "$out"
echo "vllm tests: $((SECONDS - start)) s in all"
