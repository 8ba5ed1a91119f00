#!/usr/bin/env bash
# slimserve inside vLLM (CPU build), SmolLM2-135M: stock vLLM and slimserve's backend on the
# same prompts, BF16 and FP8 KV, in-process and multiprocess, the tag guard's fault test (on the
# in-process slimserve BF16 engine) and prefill/decode disaggregation over vLLM's NixlConnector
# (disagg.py); compare.py checks the results.
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
model="$root/build/vllm-models/smollm2"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
set -e
# vLLM logs to stdout and stderr; the runs' own summary lines start with "run:".
gen() {
  "$python" "$here/generate.py" --model "$model" --out-dir "$out" "$@" >"$out/log" 2>&1 || { tail -60 "$out/log" >&2; exit 1; }
  grep '^run:' "$out/log"
}
"$python" "$here/test_layout.py"
"$python" "$here/test_per_token.py"  # per-token FP8 scales: the layer's append and attention (seconds)
"$python" "$here/test_builder.py"    # the metadata builder: host lengths, the capture path (seconds)
stage=$SECONDS
"$python" "$here/test_guard.py"
echo "test_guard: $((SECONDS - stage)) s"
"$python" "$here/test_int4_linear.py"  # the INT4 linear kernel's repacking (no vLLM, a few seconds)
# Stock vLLM's CPU FP8 kernels need AVX-512 (or AMX); elsewhere the PyTorch reference stands in.
if grep -qw avx512f /proc/cpuinfo; then fp8_reference=stock; else fp8_reference=reference; fi
gen --runs "stock:auto,$fp8_reference:fp8_e4m3,slimserve:auto,slimserve:fp8_e4m3,slimserve_host:fp8_e4m3"
# Prefill/decode disaggregation: two API servers (multiprocess vLLM) with vLLM's NixlConnector and
# slimserve on both; the single server's 8 tokens are also the multiprocess-mode run that
# compare.py checks against the in-process run's first 8.
stage=$SECONDS
"$python" "$here/disagg.py" --model "$model" --max-tokens 8 --out-dir "$out" >"$out/disagg.log" 2>&1 ||
  { tail -150 "$out/disagg.log" >&2; exit 1; }
grep -E '^(run|disagg):' "$out/disagg.log"
echo "disagg: $((SECONDS - stage)) s"
"$python" "$here/compare.py" "$out"
echo "vllm tests: $((SECONDS - start)) s in all"
