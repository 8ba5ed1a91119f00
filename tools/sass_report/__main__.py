"""Command line: python3 -m sass_report (scripts/sass-report wraps it). See --help."""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import sys
from pathlib import Path

from . import budget as budget_file
from . import manifest as manifest_file
from .formulas import FORMULAS
from .model import analyse, explain
from .render import markdown, write_json
from .sass import parse_nvdisasm
from .toolchain import ToolError, Tools, demangle, load_objects

SKIP = 77  # CTest SKIP_RETURN_CODE: tools missing outside CI


def _arguments() -> argparse.Namespace:
    root = Path(__file__).resolve().parents[2]
    parser = argparse.ArgumentParser(
        prog="sass-report",
        description="Static SASS report and budget check of slimserve's sm_90a kernels.")
    parser.add_argument("--objects", nargs="*", type=Path, default=[],
                        help="object files (.cu.o) to read")
    parser.add_argument("--objects-file", type=Path,
                        help="file listing object files, one per line "
                             "(default build: build/default/sass-objects.txt)")
    parser.add_argument("--manifest", type=Path, default=root / "docs/perf/sass-manifest.toml")
    parser.add_argument("--budget", type=Path, default=root / "docs/perf/sass-budget.toml")
    parser.add_argument("--json", type=Path, help="write sass-report.json here")
    parser.add_argument("--markdown", type=Path, help="write the Markdown report here")
    parser.add_argument("--tools-dir", type=Path, action="append", default=[],
                        help="directory holding cuobjdump and nvdisasm (repeatable)")
    parser.add_argument("--cache-dir", type=Path, help="cache of disassembly, keyed by content")
    parser.add_argument("--check", action="store_true", help="fail when a budget is exceeded")
    parser.add_argument("--update-budget", action="store_true",
                        help="add budgets for rows that have none (keeps existing ones)")
    parser.add_argument("--explain", metavar="GLOB",
                        help="print the counted steady-state path (SASS with source lines) of "
                             "the rows whose key matches GLOB")
    parser.add_argument("--compare", type=Path, metavar="OLD_JSON",
                        help="print the rows that changed against an earlier sass-report.json")
    parser.add_argument("--prune-budget", action="store_true",
                        help="delete budget tables whose row no longer exists (after a rename: "
                             "review the printed list; the renamed rows need --update-budget)")
    parser.add_argument("--rebaseline", metavar="GLOB",
                        help="reset the budgets of rows whose key matches GLOB to today's values "
                             "(with --reason: recorded as each reset budget's reason)")
    parser.add_argument("--lower-floors", metavar="GLOB",
                        help="after a model change: lower the predicted-fraction floor of rows "
                             "matching GLOB that are now below it to today's pessimistic end, "
                             "keeping ceilings and spills, with --reason (printed for review)")
    parser.add_argument("--reason", default=None,
                        help="why, recorded with each floor --lower-floors lowers (default "
                             "'model change') or each budget --rebaseline resets")
    args = parser.parse_args()
    if not args.objects and args.objects_file is None:
        args.objects_file = root / "build/default/sass-objects.txt"
    if not args.tools_dir:
        args.tools_dir = [root / "build/tools/cuda-binutils"]
    if args.cache_dir is None:
        args.cache_dir = (args.objects_file.parent if args.objects_file else root / "build") \
            / "sass-cache"
    return args


def _tool_dirs(dirs: list[Path]) -> list[Path]:
    """pip --target trees keep the binaries in nvidia/cu*/bin."""
    out = []
    for directory in dirs:
        out.append(directory)
        out.extend(sorted(directory.glob("nvidia/cu*/bin")))
        out.extend(sorted(directory.glob("bin")))
    return out


def compare(old_rows: list[dict], rows: list[dict]) -> str:
    """Rows whose warp-instructions per 16 B or predicted fraction moved, new and gone rows."""
    old = {row["key"]: row for row in old_rows}
    new = {row["key"]: row for row in rows}
    lines = ["| row | w-i/16B before | after | predicted before | after | classes that moved |",
             "|---|--:|--:|--:|--:|---|"]
    for key in sorted(old.keys() | new.keys()):
        a, b = old.get(key), new.get(key)
        if a is None or b is None:
            lines.append(f"| `{key}` | {'—' if a is None else a['warp_instr_per_16B']} | "
                         f"{'—' if b is None else b['warp_instr_per_16B']} | | | "
                         f"{'new' if a is None else 'gone'} |")
            continue
        if (abs(a["warp_instr_per_16B"] - b["warp_instr_per_16B"]) < 0.005 and
                abs(a["predicted_copy_bw_fraction"] - b["predicted_copy_bw_fraction"]) < 0.0005):
            continue
        moved = ", ".join(
            f"{cls} {a['instr_by_class'].get(cls, 0):.2f} -> {value:.2f}"
            for cls, value in b["instr_by_class"].items()
            if abs(value - a["instr_by_class"].get(cls, 0)) >= 0.005)
        lines.append(f"| `{key}` | {a['warp_instr_per_16B']:.2f} | {b['warp_instr_per_16B']:.2f} | "
                     f"{100 * a['predicted_copy_bw_fraction']:.0f}% | "
                     f"{100 * b['predicted_copy_bw_fraction']:.0f}% | {moved} |")
    return "\n".join(lines)


def main() -> int:
    args = _arguments()
    try:
        tools = Tools.locate(_tool_dirs(args.tools_dir))
    except ToolError as error:
        print(f"sass-report: {error}", file=sys.stderr)
        return 2 if os.environ.get("CI") else SKIP

    objects = list(args.objects)
    if args.objects_file is not None:
        if not args.objects_file.exists():
            print(f"sass-report: {args.objects_file} not found: configure and build the default "
                  f"preset first", file=sys.stderr)
            return 2
        objects += [Path(line.strip()) for line in args.objects_file.read_text().splitlines()
                    if line.strip()]
    missing = [str(p) for p in objects if not p.exists()]
    if missing:
        print(f"sass-report: objects not built yet: {', '.join(missing[:5])}", file=sys.stderr)
        return 2

    try:
        manifest = manifest_file.load(args.manifest)
        loaded = load_objects(tools, objects, args.cache_dir)
    except (ToolError, manifest_file.ManifestError) as error:
        print(f"sass-report: {error}", file=sys.stderr)
        return 2

    # Every sm_90a kernel in the objects, by simplified demangled name.
    kernels = {}
    for obj in loaded:
        functions = parse_nvdisasm(obj.sass)
        names = demangle(list(functions))
        for mangled, function in functions.items():
            if mangled not in obj.resources:
                continue  # not a kernel entry (a device subroutine)
            simple = manifest_file.simplify(names[mangled])
            kernels[simple] = (function, obj.resources.get(mangled), obj.path, mangled)

    rows, problems, covered = [], [], set()
    for entry in manifest.entries:
        matched = sorted(name for name in kernels if entry.matches(name))
        if not matched:
            problems.append(f"manifest entry '{entry.kernel}' @ {entry.label} matches no kernel "
                            f"in the build: renamed or removed? Fix its kernel glob.")
            continue
        for name in matched:
            covered.add(name)
            function, resources, path, mangled = kernels[name]
            try:
                work = FORMULAS[entry.formula](manifest_file.template_args(name), entry.problem)
            except (ValueError, IndexError) as error:
                problems.append(f"{name} @ {entry.label}: formula {entry.formula}: {error}")
                continue
            row = {"key": f"{name} @ {entry.label}", "kernel": name, "group": entry.group,
                   "problem_label": entry.label, "problem": entry.problem,
                   "formula": entry.formula, "mangled": mangled, "object": path.name}
            row.update(analyse(function, resources, work))
            if args.explain and fnmatch.fnmatchcase(row["key"], args.explain):
                print(explain(function, row))
            del row["_path"]
            rows.append(row)
            if entry.expect_bound and row["bound_by"] != entry.expect_bound:
                problems.append(f"{row['key']}: calibration expects bound_by "
                                f"'{entry.expect_bound}', the model says '{row['bound_by']}'")
            if (entry.expect_min_fraction is not None and
                    row["predicted_copy_bw_fraction"] < entry.expect_min_fraction):
                problems.append(f"{row['key']}: calibration expects at least "
                                f"{entry.expect_min_fraction:.2f} of copy bandwidth, the model "
                                f"says {row['predicted_copy_bw_fraction']:.3f}")

    uncovered = sorted(name for name in kernels
                       if name not in covered and manifest.ignored(name) is None)
    toolchain = f"{tools.cuobjdump.name} + {tools.nvdisasm.name}"
    if args.json:
        write_json(args.json, rows)
    if args.markdown:
        args.markdown.write_text(markdown(rows, uncovered, toolchain))

    budgets = budget_file.load(args.budget)
    if args.prune_budget:
        present = {row["key"] for row in rows}
        for key in sorted(k for k in budgets if k not in present):
            print(f"sass-report: removing the budget of '{key}' (no such row any more)")
            del budgets[key]
    if args.update_budget or args.rebaseline or args.prune_budget or args.lower_floors:
        for row in rows:
            reset = args.rebaseline and fnmatch.fnmatchcase(row["key"], args.rebaseline)
            if row["key"] not in budgets or reset:
                budgets[row["key"]] = budget_file.budget_for(row)
                if reset and args.reason:
                    budgets[row["key"]]["reason"] = args.reason
            elif args.lower_floors and fnmatch.fnmatchcase(row["key"], args.lower_floors):
                budget_file.add_tensor_floor(budgets[row["key"]], row)
                before = budgets[row["key"]]["min_predicted_copy_bw_fraction"]
                if budget_file.lower_floor(budgets[row["key"]], row, args.reason or "model change"):
                    print(f"sass-report: floor of '{row['key']}' {before} -> "
                          f"{budgets[row['key']]['min_predicted_copy_bw_fraction']}")
        budget_file.dump(args.budget, budgets)
        print(f"sass-report: wrote {args.budget}")

    if args.compare:
        print(compare(json.loads(args.compare.read_text()), rows))
    for row in rows:
        print(f"{row['warp_instr_per_16B']:7.2f} w-i/16B {100 * row['predicted_copy_bw_fraction']:4.0f}%"
              f" {row['bound_by']:<10} {row['key']}")
    for name in uncovered:
        print(f"sass-report: warning: kernel '{name}' is not in {args.manifest.name} "
              f"(add an [[entry]] or an [[ignore]] with a reason)")
    if args.check:
        failures = problems + budget_file.check(rows, budgets)
        for failure in failures:
            print(f"FAIL: {failure}")
        print(f"sass-report: {len(rows)} rows, {len(failures)} failure(s)")
        return 1 if failures else 0
    for problem in problems:
        print(f"sass-report: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
