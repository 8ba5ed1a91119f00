#!/usr/bin/env bash
# Prefill/decode disaggregation of SmolLM2-135M on slimserve's own API, without vLLM
# (disagg_model.py): three processes on loopback. It runs in the vLLM environment for what that
# already has (PyTorch, NIXL, the tokenizer and the converted model), imports nothing of vLLM.
# Skips (exit 77) only when that environment cannot be made (no package index reachable).
# Usage: disagg_model.sh [LIBRARY]   (the emulated C library; default: build/default's)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
[[ -n ${1:-} ]] && export SLIMSERVE_LIBRARY=$1
if ! python=$("$root/scripts/vllm-env" 2>"${TMPDIR:-/tmp}/vllm-env.$$.log"); then
  cat "${TMPDIR:-/tmp}/vllm-env.$$.log" >&2
  echo "disagg_model: SKIPPED, the vLLM environment could not be made (see above)" >&2
  exit 77
fi
rm -f "${TMPDIR:-/tmp}/vllm-env.$$.log"
exec "$python" "$here/disagg_model.py" --model "$root/build/vllm-models/smollm2" --timeout 400
