"""The manifest: which kernel instantiations are judged, on which problem, by which formula.

docs/perf/sass-manifest.toml holds [[entry]] tables (kernel glob, formula, problem or problems,
label) and [[ignore]] tables (kernel glob, reason). Kernel globs match the simplified name:
the demangled name without namespaces or parameter list, e.g.
`decode_kernel<fp8_e4m3, bf16, 128>` or `w4a16_gemm_kernel<bf16, GemmTileConfig<16, 128, 1, 4, 4>>`.
"""

from __future__ import annotations

import fnmatch
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from .formulas import FORMULAS

_QUALIFIER = re.compile(r"(?:\(anonymous namespace\)|[A-Za-z_]\w*)::")


def simplify(demangled: str) -> str:
    """`void ns::kernel<ns::T, 128>(ns::P)` -> `kernel<T, 128>`."""
    text = _QUALIFIER.sub("", demangled)
    text = re.sub(r"^void\s+", "", text)
    depth = 0
    for i, ch in enumerate(text):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            text = text[:i]
            break
    return text.replace("> >", ">>").strip()


def template_args(simple: str) -> list[str]:
    start = simple.find("<")
    if start < 0:
        return []
    args, depth, current = [], 0, ""
    for ch in simple[start + 1:]:
        if ch == "<":
            depth += 1
        elif ch == ">":
            if depth == 0:
                break
            depth -= 1
        if ch == "," and depth == 0:
            args.append(current.strip())
            current = ""
        else:
            current += ch
    if current.strip():
        args.append(current.strip())
    return args


@dataclass
class Entry:
    kernel: str  # glob on the simplified name
    formula: str
    problem: dict
    label: str
    group: str  # section of the report
    expect_bound: str | None = None  # calibration: the bound the model must find
    expect_min_fraction: float | None = None  # calibration: the least predicted fraction

    def matches(self, simple: str) -> bool:
        return fnmatch.fnmatchcase(simple, self.kernel)


@dataclass
class Ignore:
    kernel: str
    reason: str


@dataclass
class Manifest:
    entries: list[Entry]
    ignores: list[Ignore]

    def ignored(self, simple: str) -> Ignore | None:
        return next((i for i in self.ignores if fnmatch.fnmatchcase(simple, i.kernel)), None)


class ManifestError(ValueError):
    pass


def load(path: Path) -> Manifest:
    data = tomllib.loads(path.read_text())
    entries: list[Entry] = []
    for n, table in enumerate(data.get("entry", []), 1):
        where = f"{path.name}, entry {n} ({table.get('kernel', '?')})"
        for key in ("kernel", "formula"):
            if key not in table:
                raise ManifestError(f"{where}: missing '{key}'")
        if table["formula"] not in FORMULAS:
            raise ManifestError(f"{where}: unknown formula '{table['formula']}' "
                                f"(known: {', '.join(sorted(FORMULAS))})")
        problems = table.get("problems") or [table.get("problem", {})]
        for problem in problems:
            problem = dict(problem)
            label = problem.pop("label", table.get("label", ""))
            if not label:
                raise ManifestError(f"{where}: every problem needs a 'label'")
            entries.append(Entry(table["kernel"], table["formula"], problem, label,
                                 table.get("group", "other"), table.get("expect_bound"),
                                 table.get("expect_min_fraction")))
    ignores = [Ignore(t["kernel"], t.get("reason", "")) for t in data.get("ignore", [])]
    return Manifest(entries, ignores)
