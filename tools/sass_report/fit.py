"""Predicted vs measured, and the model constants the measurements imply.

Usage: python3 -m sass_report.fit SASS_REPORT_JSON NCU_CSV [NCU_CSV ...]
       python3 -m sass_report.fit --metrics NCU_QUERY_METRICS_OUTPUT  (the --metrics list)
NCU_CSV: `ncu --csv --page details --print-units base --metrics ...` output (scripts/gpu-check
writes one per benchmark binary). Prints one row per kernel profiled that the report predicts
(matched by the kernel's simplified name; the median over its launches), then the constants:
the SM clock range under load, the sustained issue per scheduler, the copy bandwidth share,
shared-memory bandwidth of SS wgmma (from the ss_wgmma_loop calibration rows).
Copy the output into docs/perf/YYYY-MM-DD-h200-calibration.md and the new ends into
tools/sass_report/hopper.py.
"""

from __future__ import annotations

import csv
import json
import re
import statistics
import sys
from collections import defaultdict

from . import hopper

METRICS = {
    "dram": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "dram_rate": "dram__bytes.sum.per_second",
    "clock": "sm__cycles_elapsed.avg.per_second",
    "banks": "l1tex__data_bank_reads.avg.pct_of_peak_sustained_elapsed",
    "gmma": "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_elapsed",
    "issue": "smsp__issue_active.avg.per_cycle_active",
    # share of the active warps' cycles stalled on a global/local load (long scoreboard), or
    # at a barrier
    "long_scoreboard": "smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct",
    "barrier": "smsp__warp_issue_stalled_barrier_per_warp_active.pct",
    "duration": "gpu__time_duration.sum",
}
NCU_METRICS = ",".join(METRICS.values())


def available_metrics(query_output: str) -> str:
    """The METRICS that `ncu --query-metrics` lists (by base name, before the roll-up suffix),
    comma-separated: ncu refuses a whole run over one unknown name. All of them when the
    query printed nothing recognisable."""
    listed = set(re.findall(r"^\s*([a-z0-9_]+__[A-Za-z0-9_]+)", query_output, re.MULTILINE))
    if not listed:
        return NCU_METRICS
    return ",".join(m for m in METRICS.values() if m.split(".")[0] in listed)


def _simple(kernel_name: str) -> str:
    """ncu's demangled name -> the report's simplified name (no namespaces, no parameters)."""
    text = re.sub(r"(?:\(anonymous namespace\)|[A-Za-z_]\w*)::", "", kernel_name)
    text = re.sub(r"^void\s+", "", text)
    depth = 0
    for i, ch in enumerate(text):
        depth += ch == "<"
        depth -= ch == ">"
        if ch == "(" and depth == 0:
            text = text[:i]
            break
    return text.replace("> >", ">>").strip()


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def read_ncu(paths: list[str]) -> dict[str, dict[str, float]]:
    """kernel (simplified) -> metric key -> median over launches."""
    values: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    by_name = {v: k for k, v in METRICS.items()}
    for path in paths:
        with open(path, newline="") as handle:
            lines = [line for line in handle if line.startswith('"')]  # skip ncu's ==PROF== lines
        for record in csv.DictReader(lines):
            key = by_name.get(record.get("Metric Name", ""))
            value = _number(record.get("Metric Value", ""))
            if key is None or value is None:
                continue
            values[_simple(record.get("Kernel Name", ""))][key].append(value)
    return {kernel: {k: statistics.median(v) for k, v in metrics.items()}
            for kernel, metrics in values.items()}


def fit(rows: list[dict], measured: dict[str, dict[str, float]]) -> list[str]:
    out = ["Measured on the benchmarks' own problems (their shapes can differ from the row's "
           "label: compare the bounds, and the fractions where the shapes agree).", "",
           "| row | predicted (copy BW) | measured | tensor predicted | gmma % | bound | DRAM % "
           "of peak | SM GHz | issue/clk/SMSP | smem banks % | long-sb / barrier stall | µs |",
           "|---|--:|--:|--:|--:|---|--:|--:|--:|--:|--:|--:|"]
    clocks, issue_caps, smem = [], [], []
    for row in rows:
        m = measured.get(row["kernel"])
        if m is None:
            continue

        def get(key: str, scale: float = 1.0, digits: int = 0) -> str:
            return f"{m[key] * scale:.{digits}f}" if key in m else "—"
        measured_fraction = (f"{100 * m['dram_rate'] / hopper.COPY_BANDWIDTH:.0f}%"
                             if "dram_rate" in m else "—")
        out.append(
            f"| `{row['key']}` | {100 * row['predicted_copy_bw_fraction']:.0f}–"
            f"{100 * row['predicted_copy_bw_fraction_optimistic']:.0f}% | {measured_fraction} | "
            f"{100 * row['predicted_tensor_fraction']:.0f}–"
            f"{100 * row['predicted_tensor_fraction_optimistic']:.0f}% | {get('gmma')} | "
            f"{row['bound_by']} | {get('dram')} | {get('clock', 1e-9, 2)} | {get('issue', 1.0, 2)} | "
            f"{get('banks')} | {get('long_scoreboard', 1.0, 1)} / {get('barrier', 1.0, 1)} | "
            f"{get('duration', 1e-3, 1)} |")
        if "clock" in m:
            clocks.append(m["clock"])
        if row["kernel"].startswith("alu_copy16") and "issue" in m:
            issue_caps.append(m["issue"])
        if row["kernel"].startswith("ss_wgmma_loop_kernel<16>") and "banks" in m:
            smem.append(m["banks"])
    out.append("")
    if clocks:
        out.append(f"SM clock under load: {min(clocks) / 1e9:.2f}–{max(clocks) / 1e9:.2f} GHz "
                   f"(CLOCK_RANGE_HZ)")
    if issue_caps:
        out.append(f"sustained issue per scheduler (alu_copy16): {max(issue_caps):.2f} "
                   f"(ISSUE_CAP_PER_SMSP)")
    if smem:
        out.append(f"shared-memory banks busy in the N=16 SS wgmma loop: {max(smem):.0f}% "
                   f"(near 100%: the operand term binds, as WGMMA_B_FROM_SHARED_CHARGED says)")
    return out


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[1] == "--metrics":
        with open(argv[2]) as handle:
            print(available_metrics(handle.read()))
        return 0
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1]) as handle:
        rows = json.load(handle)
    measured = read_ncu(argv[2:])
    if not measured:
        print("fit: no Nsight Compute metrics in the given files", file=sys.stderr)
        return 1
    print("\n".join(fit(rows, measured)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
