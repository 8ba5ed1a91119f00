#!/usr/bin/env bash
# The Python API reference: every public name documented (docstring or docs/python-api.md),
# then rendered by pdoc into OUTPUT_DIR, in scripts/python-env's environment.
# Usage: api_reference_test.sh LIBRARY OUTPUT_DIR
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
python="$("$root/scripts/python-env")"
rm -rf "$2"
cd "$root"
SLIMSERVE_LIBRARY="$1" PYTHONPATH="$root/python" "$python" -B tools/python_api.py --output "$2"
test -s "$2/slimserve.html"
