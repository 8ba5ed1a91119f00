"""The H200 (sm_90) constants of the throughput model. Each carries its source; the derivations
and caveats are in docs/perf/h200-model.md. Change a value there and here together."""

from __future__ import annotations

# ---- chip ------------------------------------------------------------------------------------
SMS = 132                   # H200 SXM: 132 SMs (NVIDIA H200 datasheet; same die as H100 SXM5)
SM_CLOCK_HZ = 1.98e9        # max boost clock, 1980 MHz (nvidia-smi -q "Max Clocks" on H100/H200 SXM)
COPY_BANDWIDTH = 4.3e12     # B/s, device-to-device copy counting read + write, as reported for an
                            # H200 (≈90% of the 4.8 TB/s datasheet figure); replace with the
                            # figure scripts/gpu-check measures (calibration copy kernel)
DRAM_LATENCY_S = 700e-9     # loaded DRAM latency, middle of 600–800 ns (unloaded ≈ 0.3 µs in
                            # public Hopper microbenchmarks; queueing near saturation ≈ doubles it)

# Bytes one SM must take in per clock for the chip to run at copy bandwidth: ≈16.45.
BYTES_PER_CLOCK_PER_SM = COPY_BANDWIDTH / SMS / SM_CLOCK_HZ
# Little's law: bytes an SM must keep in flight to sustain that: ≈22.8 KB.
LATENCY_CYCLES = DRAM_LATENCY_S * SM_CLOCK_HZ
BYTES_IN_FLIGHT_NEEDED = BYTES_PER_CLOCK_PER_SM * LATENCY_CYCLES

# ---- issue and pipes: warp-instructions per clock per SM -------------------------------------
# 4 SM sub-partitions, one warp-instruction issued per clock each (NVIDIA H100 Tensor Core GPU
# Architecture whitepaper, "H100 SM architecture").
ISSUE_PER_CLOCK = 4.0
# Sustained issue: dependent-instruction and memory stalls leave slots empty even with many
# warps. ASSUMED 3 of 4 (75%); the alu_copy16 calibration kernel measures it on a GPU. The
# prediction uses this; the ideal (4) gives the upper bound reported beside it.
SUSTAINED_ISSUE_PER_CLOCK = 3.0
# Results per clock per SM from the CUDA C++ Programming Guide, "Arithmetic Instructions"
# throughput table, compute capability 9.0, divided by 32 lanes.
PIPE_RATE = {
    "fma": 128 / 32,        # FP32 add/mul/fma (128); FP16x2 (256 results = 128 lanes); IMAD
                            # shares the FMA datapath on sm_90 (assumed; guide: int mul 64 ->
                            # counted at the FMA rate, conservative is 2)
    "alu": 64 / 32,         # 32-bit integer add/logic/shift/compare/min/max (64)
    "conversion": 16 / 32,  # "all other type conversions" (16)
    "special": 16 / 32,     # MUFU: exp2, rcp, rsqrt, log2, sin, cos (16)
    "shuffle": 32 / 32,     # warp shuffle (32)
}
SHARED_BYTES_PER_CLOCK = 128  # L1/shared memory: 32 banks x 4 B per clock per SM (guide)
# Tensor cores: dense FP16/BF16 with FP32 accumulation, 989.4 TFLOP/s at 1.83 GHz on 132 SMs
# (H100 SXM5 datasheet/whitepaper) = 2048 multiply-adds per clock per SM, for wgmma (HGMMA).
TENSOR_FMA_PER_CLOCK = {"HGMMA": 2048, "QGMMA": 4096, "IGMMA": 4096,
                        # mma.sync on sm_90: ASSUMED half the wgmma rate (the A100 per-SM
                        # rate); the tensor calibration kernel measures it.
                        "HMMA": 1024, "IMMA": 2048, "DMMA": 64, "BMMA": 8192}

# ---- occupancy (CUDA C++ Programming Guide, "Technical Specifications per Compute Capability",
# 9.0) -----------------------------------------------------------------------------------------
MAX_CTAS_PER_SM = 32
MAX_WARPS_PER_SM = 64
REGISTERS_PER_SM = 65536
REGISTER_ALLOCATION_UNIT = 256     # registers, per warp
MAX_REGISTERS_PER_THREAD = 255
SHARED_PER_SM = 228 * 1024
SHARED_PER_CTA_MAX = 227 * 1024
SHARED_RESERVED_PER_CTA = 1024     # system use, counted for every CTA that uses shared memory
