#!/usr/bin/env bash
# The emulated wheel as a user gets it: scripts/build-wheel packages the library this build
# made, a fresh venv installs the wheel (timed: it compiles nothing), and the package's tests
# (python/tests) run against the installed copy, not the source tree. The tests' own tools
# (pytest, PyTorch for the torch.library tests) are borrowed from scripts/python-env's
# environment through a .pth file; the wheel and its dependency (NumPy, pinned as in
# scripts/python-requirements.txt) are installed into the fresh venv.
# Usage: wheel_install_test.sh LIBRARY WORK_DIR [pytest args...]
set -euo pipefail
library="$1"
work="$2"
shift 2
root="$(cd "$(dirname "$0")/../.." && pwd)"
python="$("$root/scripts/python-env")"
pyenv="$(dirname "$(dirname "$python")")"
rm -rf "$work"
mkdir -p "$work"
wheel="$("$root/scripts/build-wheel" --emulated-library "$library" --out "$work/dist" --python "$python")"
echo "wheel: $(basename "$wheel") ($(du -k "$wheel" | cut -f1) KiB)"

# The same interpreter as scripts/python-env's (the .pth below lends that environment's packages).
"$pyenv/bin/python" -m venv "$work/venv"
grep -E '^numpy==' "$root/scripts/python-requirements.txt" > "$work/constraints.txt"
start=$(date +%s.%N)
"$work/venv/bin/python" -m pip install --quiet --disable-pip-version-check -c "$work/constraints.txt" "$wheel"
end=$(date +%s.%N)
python3 -c "print(f'pip install of the wheel into a fresh venv: {$end - $start:.1f} s')"

site="$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
"$pyenv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$site/zz-test-tools.pth"
# PyTorch's CUDA libraries, as scripts/python-env's wrapper sets them (no GPU is used).
eval "$(grep '^export LD_LIBRARY_PATH=' "$python")"
basetemp="$(mktemp -d "${TMPDIR:-/tmp}/slimserve-wheel-pytest.XXXXXX")"
trap 'rm -rf "$basetemp"' EXIT
cd "$basetemp"  # not the source tree: `python -m` puts the working directory on sys.path
env -u PYTHONPATH -u SLIMSERVE_LIBRARY "$work/venv/bin/python" - "$root/python/tests" "$basetemp/t" "$@" <<'PY'
import sys
import slimserve
# The package and its library are the wheel's, in this venv.
assert slimserve.__file__.startswith(sys.prefix), slimserve.__file__
assert slimserve.library_path.startswith(sys.prefix), slimserve.library_path
print(f"testing {slimserve.__file__} with {slimserve.library_path}")
import os
from importlib import metadata
tests, basetemp, *extra = sys.argv[1:]
# Every module of the source package is installed, subpackages included (the vLLM plugin is
# one), and vLLM's plugin loader finds the entry point that names it.
source = os.path.join(os.path.dirname(tests), "slimserve")
installed = os.path.dirname(slimserve.__file__)
modules = lambda top: {os.path.relpath(os.path.join(d, n), top) for d, _, names in os.walk(top)
                       for n in names if n.endswith(".py")}
missing = sorted(modules(source) - modules(installed))
assert not missing, f"the wheel lacks {missing}"
plugins = {p.name: p.value for p in metadata.entry_points(group="vllm.general_plugins")}
assert plugins.get("slimserve") == "slimserve.vllm:register", plugins
print(f"{len(modules(installed))} modules installed; vllm.general_plugins: {plugins}")
import pytest
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", f"--basetemp={basetemp}", *extra, tests]))
PY
