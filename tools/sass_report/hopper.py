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
                            # also occupies this datapath (FMA-heavy half), so it counts here too
    "imad": 64 / 32,        # IMAD/IMUL/IDP and IMAD's MOV/IADD/SHL forms: only the FMA-heavy
                            # half of the datapath runs them: half the FP32 rate (guide: 32-bit
                            # integer multiply 64)
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


# ---- ranges: constants nobody has measured for this project yet ----------------------------
# Every prediction is made twice, once with each end; the budget judges the pessimistic end
# (docs/perf/h200-model.md, "Ranges"). scripts/gpu-check measures each (its calibration
# kernels) and tools/sass_report/fit.py turns the measurements into new ends.
CLOCK_RANGE_HZ = (1.60e9, 1.98e9)   # SM clock under load: ~1.6 GHz power-capped / throttled on
                                    # tensor-heavy work (public H800 and H100 reports) up to the
                                    # 1.98 GHz maximum boost; sm__cycles_elapsed.avg.per_second
# Dense BF16 wgmma peak: 989.4 TFLOP/s at 1.83 GHz = 2048 FMA/clk/SM (TENSOR_FMA_PER_CLOCK);
# a tensor fraction is of this peak, so at clock f the pipe-limited ceiling is f / 1.83 GHz.
TENSOR_PEAK_CLOCK_HZ = 1.83e9
TENSOR_PEAK_FLOPS = 2 * 2048 * SMS * TENSOR_PEAK_CLOCK_HZ
LATENCY_RANGE_S = (1.0e-6, 0.7e-6)  # loaded DRAM latency (pessimistic, optimistic): 0.7 µs
                                    # at moderate load, past 1 µs near peak bandwidth
# Issue per scheduler (SM sub-partition) from the warps it holds and the steady path's
# instruction-level parallelism: a warp issues its next instruction once its operands are
# ready, so one warp alone sustains instructions / max(instructions, dependent-chain cycles)
# per clock. Pessimistic: dependent arithmetic takes DEPENDENT_LATENCY[0] clocks and the
# scheduler never sustains more than ISSUE_CAP_PER_SMSP[0]; optimistic the other ends.
# (Without ILP: 1 / 2 / 4 warps = 0.25 / 0.5 / 1 per clock at 4-clock latency.)
DEPENDENT_LATENCY = (6.0, 4.0)      # clocks, FP32/integer result to dependent issue
ISSUE_CAP_PER_SMSP = (0.75, 1.0)    # sustained at many warps (3 of 4 per SM) .. ideal
SMSPS = 4
# Shared-memory reads of wgmma operands (each m64nNk16 reads A, 64 x k, when A is in shared
# memory, and B, N x k, always) share the L1/shared bandwidth with LDS/STS/LDSM.
# Pessimistic: A and B both charged at SHARED_BYTES_PER_CLOCK; optimistic: only A (B shared
# across the SM's sub-cores or fetched on a path of its own: unknown).
WGMMA_B_FROM_SHARED_CHARGED = (True, False)
# Phases: in a CTA whose steady path waits at a barrier or on wgmma between the tensor work
# and the CUDA-core work, those phases overlap only across CTAs: the pessimistic end adds
# (1 - 1 / resident CTAs) less of them; the optimistic end takes the maximum.
# Fixed costs (pessimistic, optimistic): launch and ramp of the grid; each CTA's pipeline fill
# (one DRAM latency) and a persistent CTA's drain and refill per segment; the prologue and
# epilogue issue of non-persistent CTAs. Wave quantization at the pessimistic end.
LAUNCH_RAMP_S = (3.0e-6, 1.0e-6)
L2_LATENCY_RANGE_S = (0.4e-6, 0.2e-6)  # loaded L2 hit latency (unloaded ≈ 270 clocks)
SLOW_LATENCY = (20.0, 12.0)         # clocks: MUFU, conversions, shuffles (variable latency)
SHARED_LATENCY = (33.0, 23.0)       # clocks: LDS/LDSM result to dependent issue
NOMINAL_LATENCY_S = DRAM_LATENCY_S  # the single figure of the model before ranges
NOMINAL_SUSTAINED_ISSUE = SUSTAINED_ISSUE_PER_CLOCK
