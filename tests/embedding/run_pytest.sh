#!/usr/bin/env bash
# Runs the Python package's tests (python/tests) against the C library this build made,
# in the venv scripts/python-env keeps under build/pyenv.
# Usage: run_pytest.sh LIBRARY [pytest args...]
set -euo pipefail
library="$1"
shift
root="$(cd "$(dirname "$0")/../.." && pwd)"
python="$("$root/scripts/python-env")"
# A temporary root of this run's own: concurrent pytest sessions sharing the default one
# (several build trees tested at once) can clean up each other's tmp_path directories.
basetemp="$(mktemp -d "${TMPDIR:-/tmp}/slimserve-pytest.XXXXXX")"
trap 'rm -rf "$basetemp"' EXIT
cd "$root/python"
SLIMSERVE_LIBRARY="$library" PYTHONPATH="$root/python" "$python" -m pytest -q -p no:cacheprovider \
  --basetemp="$basetemp/t" "$@" tests
