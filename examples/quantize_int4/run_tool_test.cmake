# CTest driver for slimserve_quantize_int4: writes synthetic model folders with tool_check,
# quantizes them in several settings, checks each output folder, and checks that bad input
# gets a clear error and leaves nothing behind. Variables: TOOL, CHECK, WORK_DIR.
file(REMOVE_RECURSE "${WORK_DIR}")
file(MAKE_DIRECTORY "${WORK_DIR}")
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "${out}${err}")
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "failed (${result}): ${ARGN}")
  endif()
endfunction()
# Runs the tool expecting failure with `expected` in its message and no output folder.
function(refuse expected out_dir)
  execute_process(COMMAND "${TOOL}" ${ARGN} RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "refused as expected: ${err}")
  if(result EQUAL 0)
    message(FATAL_ERROR "succeeded, expected an error: ${ARGN}")
  endif()
  string(FIND "${err}" "${expected}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "error message lacks '${expected}': ${err}")
  endif()
  if(EXISTS "${out_dir}" OR EXISTS "${out_dir}.partial")
    message(FATAL_ERROR "a failed run left ${out_dir} behind")
  endif()
endfunction()

set(w "${WORK_DIR}")
# MoE, BF16, sharded input (index), per-expert and stacked experts.
run("${CHECK}" write-moe "${w}/moe" --shards 3 --seed 11)
run("${TOOL}" "${w}/moe" "${w}/moe_ct_g64" --group 64 --jobs 2 --max-shard-size 300000 --progress lines)
run("${CHECK}" verify "${w}/moe" "${w}/moe_ct_g64" --expect-quantized 28)
if(NOT EXISTS "${w}/moe_ct_g64/model.safetensors.index.json")
  message(FATAL_ERROR "expected a sharded output with an index")
endif()
run("${TOOL}" "${w}/moe" "${w}/moe_gptq_asym" --format gptq-v2 --asym --group 128)
run("${CHECK}" verify "${w}/moe" "${w}/moe_gptq_asym" --expect-quantized 28)
run("${TOOL}" "${w}/moe" "${w}/moe_clip" --clip 4 --measure-error)  # clipping moves elements past scale / 2
# Recipes: only the experts, attention ignored by regex.
run("${TOOL}" "${w}/moe" "${w}/moe_recipe" --targets "re:.*experts" --ignore "re:.*layers\\.1\\." --group channel)
run("${CHECK}" verify "${w}/moe" "${w}/moe_recipe" --expect-quantized 12)

# FP8 block-scaled (DeepSeek-style) -> INT4; one FP8 weight left unquantized -> BF16.
run("${CHECK}" write-moe "${w}/moe_fp8" --dtype fp8 --seed 12)
run("${TOOL}" "${w}/moe_fp8" "${w}/moe_fp8_ct" --ignore model.layers.0.self_attn.o_proj --jobs 3)
run("${CHECK}" verify "${w}/moe_fp8" "${w}/moe_fp8_ct" --expect-quantized 27)
run("${TOOL}" "${w}/moe_fp8" "${w}/moe_fp8_gptq" --format gptq --group 32)
run("${CHECK}" verify "${w}/moe_fp8" "${w}/moe_fp8_gptq" --expect-quantized 28)

# Re-quantization: GPTQ -> compressed-tensors (same scheme: lossless) and a new group size.
run("${TOOL}" "${w}/moe_fp8_gptq" "${w}/requant_ct" --group 32)
run("${CHECK}" verify "${w}/moe_fp8" "${w}/requant_ct" --expect-quantized 28)
run("${TOOL}" "${w}/moe_ct_g64" "${w}/requant_gptq" --format gptq --group 128)

# GPT-2 Conv1D weights [K, N] (layout detected from model_type), tied embeddings.
run("${CHECK}" write-gpt2 "${w}/gpt2")
run("${TOOL}" "${w}/gpt2" "${w}/gpt2_ct" --group 32)
run("${CHECK}" verify "${w}/gpt2" "${w}/gpt2_ct" --layout kn --expect-quantized 4)

# --help, and bad input: clear errors, nothing written.
run("${TOOL}" --help)
file(MAKE_DIRECTORY "${w}/empty")
refuse("has no config.json" "${w}/out_missing_config" "${w}/empty" "${w}/out_missing_config")
file(COPY "${w}/moe/" DESTINATION "${w}/moe_missing_shard")
file(REMOVE "${w}/moe_missing_shard/model-00002-of-00003.safetensors")
refuse("is missing" "${w}/out_missing_shard" "${w}/moe_missing_shard" "${w}/out_missing_shard")
refuse("is not a multiple of the group size 96" "${w}/out_group" "${w}/moe" "${w}/out_group" --group 96)
refuse("unknown option --bogus" "${w}/out_bogus" "${w}/moe" "${w}/out_bogus" --bogus)
refuse("tied to the input embeddings" "${w}/out_tied" "${w}/gpt2" "${w}/out_tied" --quantize-lm-head)
refuse("matches no weight" "${w}/out_nomatch" "${w}/moe" "${w}/out_nomatch" --targets re:nothing)
refuse("exists" "${w}/gpt2_ct/x" "${w}/gpt2" "${w}/gpt2_ct")
file(COPY "${w}/gpt2/" DESTINATION "${w}/gpt2_bad_dtype")
execute_process(COMMAND python3 -c "
import sys
p = sys.argv[1]
data = bytearray(open(p, 'rb').read())
i = data.find(b'\"F32\"')
data[i:i+5] = b'\"F39\"'
open(p, 'wb').write(data)" "${w}/gpt2_bad_dtype/model.safetensors")
refuse("unknown dtype 'F39'" "${w}/out_dtype" "${w}/gpt2_bad_dtype" "${w}/out_dtype")
# A linear weight stored as F64 (F8_E5M2 goes the same way): refused when it would be quantized,
# copied and listed in `ignore` when --ignore leaves it out (the folder then loads).
file(COPY "${w}/gpt2/" DESTINATION "${w}/gpt2_f64")
execute_process(COMMAND python3 -c "
import array, json, struct, sys
p = sys.argv[1]
raw = open(p, 'rb').read()
n = struct.unpack('<Q', raw[:8])[0]
header, data = json.loads(raw[8:8 + n]), raw[8 + n:]
name = sorted(k for k, v in header.items() if k != '__metadata__' and v['dtype'] == 'F32' and len(v['shape']) == 2
              and k.startswith('h.0.'))[0]
out, offset = [], 0
for key in sorted((k for k in header if k != '__metadata__'), key=lambda k: header[k]['data_offsets'][0]):
    begin, end = header[key]['data_offsets']
    blob = data[begin:end]
    if key == name:
        blob = array.array('d', array.array('f', blob)).tobytes()
        header[key]['dtype'] = 'F64'
    header[key]['data_offsets'] = [offset, offset + len(blob)]
    out.append(blob)
    offset += len(blob)
text = json.dumps(header).encode()
open(p, 'wb').write(struct.pack('<Q', len(text)) + text + b''.join(out))
print(name[:-len('.weight')])" "${w}/gpt2_f64/model.safetensors" OUTPUT_VARIABLE f64_module OUTPUT_STRIP_TRAILING_WHITESPACE
  RESULT_VARIABLE f64_result)
if(NOT f64_result EQUAL 0 OR f64_module STREQUAL "")
  message(FATAL_ERROR "could not write the F64 fixture")
endif()
refuse("is stored as F64" "${w}/out_f64" "${w}/gpt2_f64" "${w}/out_f64" --group 32)
run("${TOOL}" "${w}/gpt2_f64" "${w}/gpt2_f64_ct" --group 32 --ignore "${f64_module}")
file(READ "${w}/gpt2_f64_ct/config.json" f64_config)
string(FIND "${f64_config}" "\"${f64_module}\"" f64_listed)
if(f64_listed EQUAL -1)
  message(FATAL_ERROR "${f64_module} (F64, --ignore) is not listed in the output's quantization_config")
endif()
# An output folder inside the input folder: the output holds the model's files, not itself
# (it used to copy its own OUT.partial folder into itself).
file(COPY "${w}/gpt2/" DESTINATION "${w}/gpt2_nested")
run("${TOOL}" "${w}/gpt2_nested" "${w}/gpt2_nested/int4" --group 32)
foreach(nested int4/int4.partial int4/int4)
  if(EXISTS "${w}/gpt2_nested/${nested}")
    message(FATAL_ERROR "the output copied itself: ${w}/gpt2_nested/${nested}")
  endif()
endforeach()
run("${CHECK}" verify "${w}/gpt2" "${w}/gpt2_nested/int4" --layout kn --expect-quantized 4)
