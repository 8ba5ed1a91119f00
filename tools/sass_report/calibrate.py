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
          "BM_MmaLoop": "mma_loop_kernel", "BM_Copy16OneWarp": "copy16_one_warp_kernel",
          "BM_Copy16Small": "copy16_small_kernel", "BM_ImadCopy16": "imad_copy16_kernel",
          "BM_SsWgmma<16>": "ss_wgmma_loop_kernel<16>", "BM_SsWgmma<32>": "ss_wgmma_loop_kernel<32>",
          "BM_SsWgmma<64>": "ss_wgmma_loop_kernel<64>", "BM_Phased": "phased_kernel",
          "BM_PingPongPhased": "pingpong_phased_kernel"}
_TENSOR_ROWS = ("ss_wgmma_loop_kernel", "phased_kernel", "pingpong_phased_kernel")


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1]) as handle:
        rows = {row["kernel"]: row for row in json.load(handle)}
    with open(argv[2]) as handle:
        bench = json.load(handle)
    clocks_per_second = hopper.SMS * hopper.SM_CLOCK_HZ  # SM-clocks per second, all SMs
    print("| kernel | predicted | bound | measured GB/s | measured fraction of "
          f"{hopper.COPY_BANDWIDTH / 1e12:.1f} TB/s (tensor rows: of the "
          f"{hopper.TENSOR_PEAK_FLOPS / 1e12:.0f} TFLOP/s peak) | implied |")
    print("|---|--:|---|--:|--:|---|")
    for result in bench.get("benchmarks", []):
        name = result["name"].split("/")[0]
        kernel = _BENCH.get(name)
        if kernel is None or kernel not in rows or "bytes_per_second" not in result:
            continue
        row = rows[kernel]
        rate = result["bytes_per_second"]
        fraction = rate / hopper.COPY_BANDWIDTH
        predicted = (f"{100 * row['predicted_copy_bw_fraction']:.0f}–"
                     f"{100 * row['predicted_copy_bw_fraction_optimistic']:.0f}%")
        implied = ""
        if kernel.startswith(_TENSOR_ROWS) and "fma_per_second" in result:
            fraction = 2 * result["fma_per_second"] / hopper.TENSOR_PEAK_FLOPS
            predicted = (f"{100 * row['predicted_tensor_fraction']:.0f}–"
                         f"{100 * row['predicted_tensor_fraction_optimistic']:.0f}% of peak")
            implied = "tensor fraction (phases add / ping-pong overlap / shared-memory operands)"
        if kernel == "copy16_kernel":
            implied = f"copy bandwidth {rate / 1e12:.2f} TB/s"
        elif kernel == "alu_copy16_kernel":
            issued = row["warp_instr_per_16B"] * rate / 16 / clocks_per_second
            implied = f"sustained issue {issued:.2f} warp-instr/clock/SM"
        elif kernel == "mma_loop_kernel" and "fma_per_second" in result:
            per_clock = result["fma_per_second"] / clocks_per_second
            implied = f"mma.sync {per_clock:.0f} FMA/clock/SM"
        print(f"| `{kernel}` | {predicted} | "
              f"{row['bound_by']} | {rate / 1e9:.0f} | {100 * fraction:.0f}% | {implied} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
