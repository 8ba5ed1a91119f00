"""Predicted vs measured for the calibration kernels (run by scripts/gpu-check on a GPU).

Usage: python3 -m sass_report.calibrate SASS_REPORT_JSON BENCHMARK_JSON
Prints, per calibration kernel, the predicted fraction and bound next to what the GPU did, and
the model constants the measurement implies (copy bandwidth, sustained issue rate, mma.sync
rate). Copy the output into docs/perf/YYYY-MM-DD-h200-calibration.md.
"""

from __future__ import annotations

import json
import sys

from . import hopper

_BENCH = {"BM_Copy16": "copy16_kernel", "BM_AluCopy16": "alu_copy16_kernel",
          "BM_MmaLoop": "mma_loop_kernel"}


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    rows = {row["kernel"]: row for row in json.load(open(argv[1]))}
    bench = json.load(open(argv[2]))
    clocks_per_second = hopper.SMS * hopper.SM_CLOCK_HZ  # SM-clocks per second, all SMs
    print("| kernel | predicted | bound | measured GB/s | measured fraction of "
          f"{hopper.COPY_BANDWIDTH / 1e12:.1f} TB/s | implied |")
    print("|---|--:|---|--:|--:|---|")
    for result in bench.get("benchmarks", []):
        name = result["name"].split("/")[0]
        kernel = _BENCH.get(name)
        if kernel is None or kernel not in rows or "bytes_per_second" not in result:
            continue
        row = rows[kernel]
        rate = result["bytes_per_second"]
        fraction = rate / hopper.COPY_BANDWIDTH
        implied = ""
        if kernel == "copy16_kernel":
            implied = f"copy bandwidth {rate / 1e12:.2f} TB/s"
        elif kernel == "alu_copy16_kernel":
            issued = row["warp_instr_per_16B"] * rate / 16 / clocks_per_second
            implied = f"sustained issue {issued:.2f} warp-instr/clock/SM"
        elif kernel == "mma_loop_kernel" and "fma_per_second" in result:
            per_clock = result["fma_per_second"] / clocks_per_second
            implied = f"mma.sync {per_clock:.0f} FMA/clock/SM"
        print(f"| `{kernel}` | {100 * row['predicted_copy_bw_fraction']:.0f}% | "
              f"{row['bound_by']} | {rate / 1e9:.0f} | {100 * fraction:.0f}% | {implied} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
