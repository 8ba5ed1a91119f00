#!/usr/bin/env bash
# CTest driver: runs the commands of docs/int4.md's "Quantize a model for vLLM/SGLang" block
# (the ```sh block after the docs-test marker) on a synthetic MoE model folder, then checks
# each folder they wrote.
#   run_docs_test.sh TOOL CHECK DOC WORK_DIR
set -euo pipefail
tool=$1 check=$2 doc=$3 work=$4
rm -rf "$work" && mkdir -p "$work/bin" "$work/out"
ln -s "$tool" "$work/bin/slimserve_quantize_int4"
awk '/<!-- docs-test: quantize-for-engines -->/ {found = 1; next}
     found && /^```sh/ {inside = 1; next}
     inside && /^```/ {exit}
     inside {print}' "$doc" > "$work/commands.sh"
[[ -s $work/commands.sh ]] || { echo "no command block found in $doc"; exit 1; }
cat "$work/commands.sh"
"$check" write-moe "$work/model" --shards 2 --seed 31
(export PATH="$work/bin:$PATH" MODEL="$work/model" OUT="$work/out"; bash -euo pipefail "$work/commands.sh")
"$check" verify "$work/model" "$work/out/model-w4a16" --expect-quantized 28
"$check" verify "$work/model" "$work/out/model-gptq" --expect-quantized 28
"$check" verify "$work/model" "$work/out/model-mlp-only" --expect-quantized 20
"$check" verify "$work/model" "$work/out/model-from-gptq" --expect-quantized 28
echo "docs commands: 4 folders verified"
