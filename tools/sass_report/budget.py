"""The checked-in budget: per report row, a ceiling on warp-instructions per 16 B of DRAM, a
ceiling on spills (zero) and a floor on the predicted fraction of copy bandwidth."""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

HEADER = """\
# SASS budgets, one table per report row ("<kernel> @ <problem label>"), checked by the
# sass_budget test (docs/perf/sass-report.md). Values started at the measured ones; lower a
# ceiling (or raise a floor) when a change improves a kernel. Floors judge the model's
# pessimistic end: of copy bandwidth, and for compute-heavy rows also of the tensor peak. `scripts/sass-report
# --update-budget` adds rows that have none; `--rebaseline GLOB` resets matching rows to today's
# values (a deliberate, reviewed regression). baseline_by_class is the per-class mix the ceiling
# was set from: a failure names the classes that grew since. `reason`, where present, says why
# a floor sits where it does (e.g. lowered to the honest model's pessimistic end, short of the
# kernel's target: docs/perf/h200-model.md lists those rows).
"""


def _ceil2(x: float) -> float:
    return math.ceil(x * 100 - 1e-9) / 100


def _floor3(x: float) -> float:
    return math.floor(x * 1000 + 1e-9) / 1000


# Rows whose tensor pipe is this busy (pessimistic end) also get a floor on the tensor
# fraction: for compute-bound kernels the copy-bandwidth floor says little.
TENSOR_FLOOR_FROM = 0.05


def budget_for(row: dict) -> dict:
    out = {
        "max_warp_instr_per_16B": _ceil2(row["warp_instr_per_16B"]),
        "max_spills": row["spills"],
        "min_predicted_copy_bw_fraction": _floor3(row["predicted_copy_bw_fraction"]),
        "baseline_by_class": {k: v for k, v in row["instr_by_class"].items() if v},
    }
    tensor = row.get("predicted_tensor_fraction", 0.0)
    if tensor >= TENSOR_FLOOR_FROM:
        out["min_predicted_tensor_fraction"] = _floor3(tensor)
    return out


def load(path: Path) -> dict[str, dict]:
    if not path.exists():
        return {}
    return tomllib.loads(path.read_text())


def _quote(key: str) -> str:
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _comments(path: Path) -> dict[str, tuple[list[str], list[str]]]:
    """The comment lines of a budget file, by table: those above its header (after the file's
    HEADER or a blank line) and those inside it (below its header, before a blank line)."""
    if not path.exists():
        return {}
    header = set(HEADER.splitlines())
    out: dict[str, tuple[list[str], list[str]]] = {}
    above: list[str] = []
    table = None  # the key of the table whose body this line is in
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not stripped:
            table = None
        elif stripped.startswith("#"):
            if table is not None:
                out[table][1].append(line)
            elif line not in header or out:
                above.append(line)
        elif stripped.startswith("["):
            (table,) = tomllib.loads(stripped + "\n").keys()
            out[table] = (above, [])
            above = []
    return out


def dump(path: Path, budgets: dict[str, dict]) -> None:
    """Writes `budgets`, keeping the comment lines the file already has around each table that
    stays (a rebaselined table keeps its comments; a pruned one loses them)."""
    comments = _comments(path)
    out = [HEADER]
    for key in sorted(budgets):
        b = budgets[key]
        above, inside = comments.get(key, ([], []))
        out.append("")
        out.extend(above)
        out.append(f"[{_quote(key)}]")
        out.extend(inside)
        out.append(f"max_warp_instr_per_16B = {b['max_warp_instr_per_16B']}")
        out.append(f"max_spills = {b['max_spills']}")
        out.append(f"min_predicted_copy_bw_fraction = {b['min_predicted_copy_bw_fraction']}")
        if "min_predicted_tensor_fraction" in b:
            out.append(f"min_predicted_tensor_fraction = {b['min_predicted_tensor_fraction']}")
        classes = ", ".join(f"{k} = {v}" for k, v in b.get("baseline_by_class", {}).items())
        out.append(f"baseline_by_class = {{ {classes} }}")
        if b.get("reason"):
            out.append(f"reason = {_quote(b['reason'])}")
    path.write_text("\n".join(out) + "\n")


def check(rows: list[dict], budgets: dict[str, dict]) -> list[str]:
    """Failure messages; empty when every row is within budget and every budget has a row."""
    failures = []
    by_key = {row["key"]: row for row in rows}
    for key, b in sorted(budgets.items()):
        row = by_key.get(key)
        if row is None:
            failures.append(
                f"budget '{key}': no such kernel/problem in this build. Was the kernel renamed "
                f"or removed? Fix the manifest entry's kernel glob, then rename or delete this "
                f"budget table (a renamed kernel must not drop out of the budget silently).")
            continue
        grew = []
        baseline = b.get("baseline_by_class", {})
        for cls, value in row["instr_by_class"].items():
            delta = value - baseline.get(cls, 0.0)
            if delta > 0.005:
                grew.append((delta, f"{cls} {baseline.get(cls, 0.0):.2f} -> {value:.2f}"))
        grew_text = ", ".join(text for _, text in sorted(grew, reverse=True)) or "none by class"
        if row["warp_instr_per_16B"] > b["max_warp_instr_per_16B"] + 1e-9:
            failures.append(
                f"{key}: {row['warp_instr_per_16B']:.2f} warp-instructions per 16 B of DRAM "
                f"> budget {b['max_warp_instr_per_16B']:.2f}; grew: {grew_text}")
        if row["spills"] > b.get("max_spills", 0):
            failures.append(f"{key}: {row['spills']} spill instructions (LDL/STL) > budget "
                            f"{b.get('max_spills', 0)}")
        floor = b.get("min_predicted_copy_bw_fraction", 0.0)
        if row["predicted_copy_bw_fraction"] + 1e-9 < floor:
            failures.append(
                f"{key}: predicted {row['predicted_copy_bw_fraction']:.3f} of copy bandwidth < "
                f"floor {floor:.3f} (bound by {row['bound_by']}); grew: {grew_text}")
        tensor_floor = b.get("min_predicted_tensor_fraction")
        if tensor_floor is not None and \
                row.get("predicted_tensor_fraction", 0.0) + 1e-9 < tensor_floor:
            failures.append(
                f"{key}: predicted {row.get('predicted_tensor_fraction', 0.0):.3f} of the tensor "
                f"peak < floor {tensor_floor:.3f} (bound by {row['bound_by']}); grew: {grew_text}")
    for row in rows:
        if row["key"] not in budgets:
            failures.append(f"{row['key']}: no budget. Run scripts/sass-report --update-budget "
                            f"and commit docs/perf/sass-budget.toml.")
    return failures


def add_tensor_floor(budget: dict, row: dict) -> bool:
    """Adds today's tensor-fraction floor to a compute-heavy row that has none."""
    tensor = row.get("predicted_tensor_fraction", 0.0)
    if "min_predicted_tensor_fraction" in budget or tensor < TENSOR_FLOOR_FROM:
        return False
    budget["min_predicted_tensor_fraction"] = _floor3(tensor)
    return True


def lower_floor(budget: dict, row: dict, why: str) -> bool:
    """Lowers the row's predicted-fraction floor to today's pessimistic end when that is below
    it (ceilings and spills untouched), recording why. False when the floor holds already."""
    floor = budget["min_predicted_copy_bw_fraction"]
    new = _floor3(row["predicted_copy_bw_fraction"])
    if new >= floor:
        return False
    budget["min_predicted_copy_bw_fraction"] = new
    moved = ", ".join(row.get("moved_by", [])) or "several fixes under 2 points each"
    budget["reason"] = f"{why}: the pessimistic end, was {floor}; moved by {moved}"
    return True
