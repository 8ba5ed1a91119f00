#!/usr/bin/env bash
# Runs the Python package's tests (python/tests) against the C library this build made,
# in the venv scripts/python-env keeps under build/pyenv.
# Usage: run_pytest.sh LIBRARY [pytest args...]
set -euo pipefail
library="$1"
shift
root="$(cd "$(dirname "$0")/../.." && pwd)"
python="$("$root/scripts/python-env")"
cd "$root/python"
SLIMSERVE_LIBRARY="$library" PYTHONPATH="$root/python" exec "$python" -m pytest -q -p no:cacheprovider "$@" tests
