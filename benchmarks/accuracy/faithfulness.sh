#!/usr/bin/env bash
# How faithful the host attention mode (SLIMSERVE_ATTENTION=host, which run.sh uses) is to
# slimserve's paged-attention kernel: for each KV format of the table, the first windows of the
# text run once with the kernel (on the CPU emulator) and once in host mode, both with
# slimserve's quantize-and-append writing the pages; accuracy.py then measures the host run
# against the kernel run exactly as run.sh measures a row against the reference (mean and p99
# KL divergence, same top token, ΔPPL). Prints one table per format and the runtime.
# Usage: benchmarks/accuracy/faithfulness.sh [--tokens N] [--context C] [--formats LIST] [--results DIR]
#   --tokens   scored positions per format (default 512: two windows of 512)
#   --formats  comma-separated: bf16, fp8_e4m3, fp8_e4m3_token, fp8_e5m2 (default all four)
# Expects run.sh's text (build/accuracy/text); the kernel runs take minutes per window here.
set -euo pipefail
cd "$(dirname "$0")/../.."
tokens=512 context=512 formats=bf16,fp8_e4m3,fp8_e4m3_token,fp8_e5m2 results=build/accuracy/faithfulness
while [[ $# -gt 0 ]]; do
  case $1 in
    --tokens) tokens=$2; shift 2 ;;
    --context) context=$2; shift 2 ;;
    --formats) formats=$2; shift 2 ;;
    --results) results=$2; shift 2 ;;
    *) echo "faithfulness.sh: unknown argument $1 (see the usage at the top of this file)" >&2; exit 2 ;;
  esac
done
start=$SECONDS
python=$(scripts/vllm-env)
text=build/accuracy/text/hamlet_gut.txt
[[ -f $text ]] || { echo "faithfulness.sh: $text is missing (benchmarks/accuracy/run.sh downloads it)" >&2; exit 1; }
for format in ${formats//,/ }; do
  dir=$results/$format kv=${format%_token} per_token=()
  [[ $format == *_token ]] && per_token=(--per-token)
  [[ $kv == bf16 ]] && kv=auto
  mkdir -p "$dir"
  # "reference" is the name under which accuracy.py keeps a run's full logits.
  for run in reference:kernel host:host; do
    name=${run%%:*} attention=${run##*:}
    [[ -f $dir/$name.json ]] && continue
    nice -n 10 "$python" benchmarks/accuracy/accuracy.py row --name "$name" --model build/vllm-models/smollm2 \
      --kv "$kv" "${per_token[@]}" --attention "$attention" --results "$dir" --text "$text" \
      --context "$context" --tokens "$tokens" >"$dir/$name.log" 2>&1 || { tail -40 "$dir/$name.log" >&2; exit 1; }
    grep "^row $name: [0-9]* positions" "$dir/$name.log" >&2
  done
  echo "## $format: host mode against the kernel"
  "$python" benchmarks/accuracy/accuracy.py table --results "$dir" --rows reference,host
done
echo "faithfulness: $((SECONDS - start)) s (this invocation)"
