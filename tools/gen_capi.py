#!/usr/bin/env python3
"""Generates the Python package's ctypes declarations from the C header.

    python3 tools/gen_capi.py            # rewrites python/slimserve/_capi_generated.py
    python3 tools/gen_capi.py --check    # fails (exit 1) when that file is not what the header gives
    python3 tools/gen_capi.py --check --library libslimserve_c_emulated.so
                                         # ... and when an exported slimserve_* symbol has no
                                         #     signature, or a declared function is not exported

include/slimserve/c/slimserve.h is the one definition of the boundary: every struct becomes a
ctypes.Structure with the same fields in the same order, every SLIMSERVE_C_API function a
(restype, argtypes) entry, every enum constant and the ABI version a module constant. The header
is written in a small, regular subset of C99 (typedef'd structs, int32_t enums, no arrays, no
function pointers, no bit fields); anything outside that subset is an error here, not a silently
wrong binding.

How C types become ctypes types:
  * fixed-width integers, size_t, float, double: the matching ctypes scalar; the typedef'd enums
    (slimserve_status, slimserve_kv_dtype, ...) are int32_t;
  * a struct by value: its Structure; a pointer to a struct: POINTER(Structure), so passing the
    wrong struct is a TypeError; except the records kept in device memory (DEVICE_RECORDS: the
    tag check's verdicts, page copy and swap lists, swap identities, the MoE status word),
    whose pointers are device addresses like any tensor's and so c_void_p;
  * `const char*`: c_char_p; an opaque handle (`slimserve_page_pool*`) or a stream: c_void_p;
    a pointer to a pointer (`void**`, `slimserve_page_pool**`): POINTER(c_void_p);
  * any other data pointer (`const int32_t*`, `void*`, ...): c_void_p, which takes an address as
    a Python int (DLPack data pointers, NumPy's ctypes.data), a ctypes array or byref(). ctypes
    cannot check what an integer address points to, so a typed pointer would only refuse the
    ints every tensor call passes;
  * except in the structs only the library writes (every function takes them through a
    non-const pointer, e.g. slimserve_int4_weights_info): there a `T*` field is POINTER(T), so
    Python can view the library's arrays with numpy.ctypeslib.as_array.
Standard library only.
"""
from __future__ import annotations

import argparse
import difflib
import os
import re
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
HEADER = os.path.join(ROOT, "include", "slimserve", "c", "slimserve.h")
OUTPUT = os.path.join(ROOT, "python", "slimserve", "_capi_generated.py")

SCALARS = {
    "int8_t": "c_int8", "uint8_t": "c_uint8", "int16_t": "c_int16", "uint16_t": "c_uint16",
    "int32_t": "c_int32", "uint32_t": "c_uint32", "int64_t": "c_int64", "uint64_t": "c_uint64",
    "size_t": "c_size_t", "float": "c_float", "double": "c_double", "char": "c_char",
}

# Structs that live in device arrays (their pointers are device addresses, passed as ints). A
# struct missing here that Python passes by address fails loudly: ctypes raises TypeError.
DEVICE_RECORDS = {"slimserve_request_status", "slimserve_page_copy", "slimserve_page_swap",
                  "slimserve_record_identity", "slimserve_moe_routing_status"}


class HeaderError(Exception):
    pass


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def class_name(c_name: str) -> str:
    """slimserve_kv_cache -> KvCache (the names the package has always used)."""
    return "".join(part[:1].upper() + part[1:] for part in c_name[len("slimserve_"):].split("_"))


class Declarator:
    """One declared name: `const uint32_t* packed` -> base uint32_t, depth 1, name packed."""

    def __init__(self, base: str, depth: int, name: str, const: bool):
        self.base, self.depth, self.name, self.const = base, depth, name, const


def split_declaration(text: str, allow_many: bool):
    """`const int64_t q_token_stride, q_head_stride` -> declarators sharing the base type."""
    text = " ".join(text.replace("*", " * ").split())
    if "[" in text or "(" in text or ":" in text:
        raise HeaderError(f"unsupported declaration (array, function pointer or bit field): {text}")
    first, *rest = [part.strip() for part in text.split(",")]
    if rest and not allow_many:
        raise HeaderError(f"one name per parameter: {text}")
    tokens = first.split()
    const = "const" in tokens
    tokens = [t for t in tokens if t not in ("const", "struct")]
    if len(tokens) < 2:
        raise HeaderError(f"a declaration without a name: {text}")
    base = tokens[0]
    declarators = []
    for spec in [" ".join(tokens[1:])] + rest:
        parts = [t for t in spec.split() if t != "const"]
        depth = parts.count("*")
        names = [t for t in parts if t != "*"]
        if len(names) != 1 or not re.fullmatch(r"[A-Za-z_]\w*", names[0]):
            raise HeaderError(f"cannot read declarator {spec!r} in: {text}")
        declarators.append(Declarator(base, depth, names[0], const))
    return declarators


class Header:
    def __init__(self, text: str):
        self.abi_version = None
        self.scalar_aliases = {}   # slimserve_status -> int32_t
        self.pointer_aliases = set()  # slimserve_stream
        self.opaque = set()        # slimserve_page_pool
        self.structs = []          # (c name, [Declarator])
        self.constants = []        # (NAME, value)
        self.functions = []        # (name, Declarator of the result, [Declarator])
        version = re.search(r"#define\s+SLIMSERVE_C_ABI_VERSION\s+(\d+)", text)
        if not version:
            raise HeaderError("no SLIMSERVE_C_ABI_VERSION")
        self.abi_version = int(version.group(1))
        body = strip_comments(text)
        body = "\n".join(line for line in body.split("\n") if not line.lstrip().startswith("#"))
        body = re.sub(r'extern\s+"C"\s*\{|^\s*\}\s*$', " ", body, flags=re.M)
        for statement in self._statements(body):
            self._read(statement)

    @staticmethod
    def _statements(body: str):
        """Top-level statements, each ending at a ';' outside braces."""
        depth, start = 0, 0
        for i, ch in enumerate(body):
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            elif ch == ";" and depth == 0:
                statement = " ".join(body[start:i].split())
                start = i + 1
                if statement:
                    yield statement
        if body[start:].strip():
            raise HeaderError(f"text after the last statement: {body[start:].strip()[:80]}")

    def _read(self, s: str) -> None:
        m = re.fullmatch(r"typedef struct (\w+) \{(.*)\} (\w+)", s)
        if m:
            if m.group(1) != m.group(3):
                raise HeaderError(f"struct tag and typedef differ: {s[:80]}")
            fields = []
            for member in filter(None, (part.strip() for part in m.group(2).split(";"))):
                fields.extend(split_declaration(member, allow_many=True))
            self.structs.append((m.group(1), fields))
            return
        m = re.fullmatch(r"typedef struct (\w+) (\w+)", s)
        if m and m.group(1) == m.group(2):
            self.opaque.add(m.group(1))
            return
        m = re.fullmatch(r"typedef struct \w+ ?\* ?(\w+)", s)
        if m:
            self.pointer_aliases.add(m.group(1))
            return
        m = re.fullmatch(r"typedef (\w+) (\w+)", s)
        if m:
            if m.group(1) not in SCALARS:
                raise HeaderError(f"typedef of a non-scalar: {s}")
            self.scalar_aliases[m.group(2)] = m.group(1)
            return
        m = re.fullmatch(r"enum \{(.*)\}", s)
        if m:
            for item in filter(None, (part.strip() for part in m.group(1).split(","))):
                name, _, value = (x.strip() for x in item.partition("="))
                if not re.fullmatch(r"-?\d+", value):
                    raise HeaderError(f"enum constants need explicit values: {item}")
                self.constants.append((name, int(value)))
            return
        m = re.fullmatch(r"SLIMSERVE_C_API (.+?)\((.*)\)", s)
        if m:
            result = split_declaration(m.group(1), allow_many=False)[0]
            params = [] if m.group(2).strip() in ("", "void") else [
                split_declaration(p, allow_many=False)[0] for p in m.group(2).split(",")]
            self.functions.append((result.name, result, params))
            return
        raise HeaderError(f"unrecognized statement: {s[:120]}")


class Emitter:
    def __init__(self, header: Header):
        self.h = header
        self.struct_names = {name for name, _ in header.structs}
        if DEVICE_RECORDS - self.struct_names:
            raise HeaderError(f"DEVICE_RECORDS names no struct of the header: {sorted(DEVICE_RECORDS - self.struct_names)}")
        # Structs every function takes through a non-const pointer: only the library writes them.
        taken_const, taken_mutable = set(), set()
        for _, _, params in header.functions:
            for p in params:
                if p.base in self.struct_names and p.depth == 1:
                    (taken_const if p.const else taken_mutable).add(p.base)
        self.library_written = taken_mutable - taken_const

    def resolve(self, base: str) -> str:
        return self.h.scalar_aliases.get(base, base)

    def ctype(self, d: Declarator, *, result=False, library_written=False, defined=()) -> str:
        base = self.resolve(d.base)
        if d.depth == 0:
            if base == "void":
                if result:
                    return "None"
                raise HeaderError(f"void value: {d.name}")
            if base in SCALARS:
                return SCALARS[base]
            if base in self.h.pointer_aliases:
                return "c_void_p"
            if base in self.struct_names:
                self._need(base, defined)
                return class_name(base)
            raise HeaderError(f"unknown type {d.base} of {d.name}")
        if d.depth >= 2:
            return "POINTER(c_void_p)"
        if base == "char":
            return "c_char_p"
        if base in self.struct_names and base not in DEVICE_RECORDS:
            self._need(base, defined)
            return f"POINTER({class_name(base)})"
        if base in DEVICE_RECORDS:
            return "c_void_p"
        if base in self.h.opaque or base == "void":
            return "c_void_p"
        if base in SCALARS:
            return f"POINTER({SCALARS[base]})" if library_written else "c_void_p"
        raise HeaderError(f"unknown type {d.base} of {d.name}")

    @staticmethod
    def _need(base: str, defined) -> None:
        if defined is not None and base not in defined:
            raise HeaderError(f"{base} is used before the header defines it")

    def emit(self) -> str:
        out = [
            '"""ctypes declarations of slimserve\'s C ABI, generated from include/slimserve/c/slimserve.h',
            "by tools/gen_capi.py: do not edit; run `python3 tools/gen_capi.py` after changing the header",
            '(a test fails while this file and the header disagree)."""',
            "from ctypes import (POINTER, Structure, c_char, c_char_p, c_double, c_float, c_int8, c_int16,",
            "                    c_int32, c_int64, c_size_t, c_uint8, c_uint16, c_uint32, c_uint64, c_void_p)",
            "",
            f"ABI_VERSION = {self.h.abi_version}",
            "",
            "# ---- Enum constants -------------------------------------------------------------",
            "",
        ]
        out += [f"{name} = {value}" for name, value in self.h.constants]
        out += ["", "# ---- Structs (header order) ------------------------------------------------------"]
        defined = set()
        for name, fields in self.h.structs:
            written = name in self.library_written
            out += ["", "", f"class {class_name(name)}(Structure):", f'    """{name}"""', "    _fields_ = ["]
            for field in fields:
                ctype = self.ctype(field, library_written=written, defined=defined | {name})
                out.append(f'        ("{field.name}", {ctype}),')
            out.append("    ]")
            defined.add(name)
        out += ["", "", "# ---- Functions: name -> (restype, argtypes), header order ---------------------", "",
                "SIGNATURES = {"]
        for name, result, params in self.h.functions:
            restype = self.ctype(result, result=True, defined=None)
            argtypes = ", ".join(self.ctype(p, defined=None) for p in params)
            out.append(f'    "{name}": ({restype}, [{argtypes}]),')
        out += ["}", "", "STRUCTS = ("]
        out += [f"    {class_name(name)}," for name, _ in self.h.structs]
        out += [")", "", "__all__ = ["]
        out += [f'    "{class_name(name)}",' for name, _ in self.h.structs]
        out += [f'    "{name}",' for name, _ in self.h.constants]
        out += ["]", ""]
        return "\n".join(out)


def generate(header_path: str = HEADER) -> str:
    with open(header_path) as f:
        return Emitter(Header(f.read())).emit()


# Not C ABI entry points: the emulator's fiber switch (inline assembly in
# include/slimserve/emu/fiber.hpp) defines weak slimserve_emu_* symbols, which the version
# script's `slimserve_*` pattern exports from the emulated library too.
NOT_ENTRY_POINTS = re.compile(r"slimserve_emu_\w+")


def exported_symbols(library: str):
    """The slimserve_* functions the shared library defines (readelf --dyn-syms)."""
    listing = subprocess.run(["readelf", "--dyn-syms", "--wide", library], capture_output=True,
                             text=True, check=True).stdout
    names = set()
    for line in listing.splitlines():
        fields = line.split()
        if len(fields) >= 8 and fields[3] == "FUNC" and fields[6] != "UND":
            names.add(fields[7].split("@")[0])
    return {n for n in names if n.startswith("slimserve_") and not NOT_ENTRY_POINTS.fullmatch(n)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    parser.add_argument("--library", help="also compare the library's exports with the signatures")
    parser.add_argument("--header", default=HEADER)
    parser.add_argument("--output", default=OUTPUT)
    args = parser.parse_args(argv)
    try:
        text = generate(args.header)
    except HeaderError as error:
        print(f"gen_capi: {args.header}: {error}", file=sys.stderr)
        return 1
    failures = []
    if args.check:
        current = open(args.output).read() if os.path.exists(args.output) else ""
        if current != text:
            diff = "".join(difflib.unified_diff(current.splitlines(True), text.splitlines(True),
                                                args.output, "generated from the header", n=1))
            failures.append(f"{args.output} is out of date with the header; run "
                            f"`python3 tools/gen_capi.py`:\n{diff[:6000]}")
    else:
        with open(args.output, "w") as f:
            f.write(text)
    if args.library:
        declared = set(re.findall(r'^    "(slimserve_\w+)": ', text, flags=re.M))
        exported = exported_symbols(args.library)
        if len(exported) < 40:
            failures.append(f"{args.library}: only {len(exported)} slimserve_* exports found")
        if exported - declared:
            failures.append(f"exported without a signature: {sorted(exported - declared)}")
        if declared - exported:
            failures.append(f"declared in the header but not exported: {sorted(declared - exported)}")
    for failure in failures:
        print(f"gen_capi: {failure}", file=sys.stderr)
    if not failures:
        summary = text.count("(Structure):"), text.count('": (')
        print(f"gen_capi: {'checked' if args.check else 'wrote'} {os.path.relpath(args.output, ROOT)}: "
              f"{summary[0]} structs, {summary[1]} functions"
              + (f", every export of {os.path.basename(args.library)} declared" if args.library else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
