"""Every ctypes struct of the binding (slimserve/_capi_generated.py, generated from the header
by tools/gen_capi.py) has the C header's layout: size, and
each field's offset and size, as a C compiler sees include/slimserve/c/slimserve.h. The test
writes a C99 program from the ctypes declarations themselves, compiles it against the header
and compares what it prints, so a field added to one side only, a wrong type or a misnamed
field fails here (a misnamed field does not compile). Every struct the header defines is
either bound or listed below as deliberately not bound.

The C compiler: $SLIMSERVE_C_COMPILER (the CMake build sets it, and then the test must run),
else cc / gcc on PATH; skipped when there is none.
"""
import ctypes
import os
import re
import shutil
import subprocess

import pytest

from slimserve import _capi

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
HEADER = os.path.join(ROOT, "include", "slimserve", "c", "slimserve.h")
# Structs of the header the Python binding does not declare (the generator declares them all).
NOT_BOUND = set()


def c_name(struct_type) -> str:
    return "slimserve_" + re.sub(r"(?<!^)(?=[A-Z])", "_", struct_type.__name__).lower()


def bound_structs():
    return sorted(_capi.STRUCTS, key=lambda t: t.__name__)


def header_structs():
    with open(HEADER) as header:
        return set(re.findall(r"typedef struct (slimserve_\w+) \{", header.read()))


def compiler():
    explicit = os.environ.get("SLIMSERVE_C_COMPILER")
    if explicit:
        return explicit
    for candidate in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if candidate and shutil.which(candidate):
            return candidate
    pytest.skip("no C compiler to read the header's layout with (set SLIMSERVE_C_COMPILER)")


def test_every_header_struct_is_bound():
    names = {c_name(t) for t in bound_structs()}
    declared = header_structs()
    assert names <= declared, f"ctypes structs with no C counterpart: {sorted(names - declared)}"
    assert declared - names == NOT_BOUND, f"header structs without ctypes declarations: {sorted(declared - names - NOT_BOUND)}"


def test_struct_layouts_match_the_header(tmp_path):
    structs = bound_structs()
    lines = ["#include <stddef.h>", "#include <stdio.h>", "#include <slimserve/c/slimserve.h>", "int main(void) {"]
    expected = []
    for struct_type in structs:
        name = c_name(struct_type)
        lines.append(f'  printf("{name} %zu\\n", sizeof({name}));')
        expected.append(f"{name} {ctypes.sizeof(struct_type)}")
        for field, _ in struct_type._fields_:
            lines.append(f'  printf("{name}.{field} %zu %zu\\n", offsetof({name}, {field}), '
                         f"sizeof((({name}*)0)->{field}));")
            descriptor = getattr(struct_type, field)
            expected.append(f"{name}.{field} {descriptor.offset} {descriptor.size}")
    lines += ["  return 0;", "}"]
    source = tmp_path / "layout.c"
    source.write_text("\n".join(lines) + "\n")
    binary = tmp_path / "layout"
    env = {key: value for key, value in os.environ.items() if key != "LD_PRELOAD"}  # not the ASan runtime
    build = subprocess.run([compiler(), "-std=c99", "-Wall", "-Werror", "-I", os.path.join(ROOT, "include"),
                            str(source), "-o", str(binary)], capture_output=True, text=True, env=env)
    assert build.returncode == 0, f"the layout program does not compile (a misnamed field?):\n{build.stderr}"
    actual = subprocess.run([str(binary)], capture_output=True, text=True, check=True, env=env).stdout.split("\n")[:-1]
    mismatches = [f"C: {c}  ctypes: {p}" for c, p in zip(actual, expected) if c != p]
    assert len(actual) == len(expected) and not mismatches, "\n".join(mismatches)
    assert len(structs) >= 30  # the scan found the binding's structs
