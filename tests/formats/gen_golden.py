#!/usr/bin/env python3
"""Generates the golden conversion tables for slimserve's numeric-format tests.

The reference is ml_dtypes (bfloat16, float8_e4m3fn, float8_e5m2, float4_e2m1fn) and numpy
(float16), an implementation written independently of slimserve. Requirements:

    pip install ml_dtypes numpy

Run from anywhere; the tables are written next to this script, in golden/, as raw
little-endian arrays (the tests read them without Python):

    bf16_to_f32.u32   65,536 x uint32: float32 bits of every BF16 bit pattern
    fp16_to_f32.u32   65,536 x uint32: float32 bits of every FP16 bit pattern
    e4m3_to_f32.u32   256 x uint32: float32 bits of every FP8 e4m3fn code
    e5m2_to_f32.u32   256 x uint32: float32 bits of every FP8 e5m2 code
    e2m1_to_f32.u32   16 x uint32: float32 bits of every FP4 e2m1fn code (NVFP4's elements)
    f32_inputs.u32    N x uint32: float32 inputs for the encoders (ties, subnormals,
                      saturation boundaries, specials, random values)
    f32_to_bf16.u16   N x uint16: ml_dtypes' BF16 of each input
    f32_to_fp16.u16   N x uint16: numpy's FP16 of each input
    f32_to_e4m3.u8    N x uint8:  ml_dtypes' e4m3fn code of each input
    f32_to_e5m2.u8    N x uint8:  ml_dtypes' e5m2 code of each input
    f32_to_e2m1.u8    N x uint8:  ml_dtypes' e2m1fn code of each input (low nibble)
    MANIFEST.txt      versions, counts and SHA-256 of each file

The encoders' rounding is ml_dtypes' (round to nearest, ties to even). ml_dtypes does not
saturate FP8 and keeps NaN signs; slimserve follows the GPU's cvt.rn.satfinite instead. The
tests apply that documented policy where the two differ and compare everything else bit for
bit. E2M1 has no infinity or NaN: ml_dtypes saturates it and writes a NaN as a signed zero.
The E2M1 tables reuse the same inputs (every E2M1 tie point, 0.25 ... 7, is an e4m3 value, so it
and its float32 neighbours are already in the set), so adding them left the other files as they
were. The input set is deterministic (fixed seed), so rerunning reproduces the files.
"""

import hashlib
import pathlib
import sys

import ml_dtypes
import numpy as np

OUT = pathlib.Path(__file__).resolve().parent / "golden"
SEED = 20261129

FORMATS = {
    # name: (dtype, bits)
    "bf16": (ml_dtypes.bfloat16, 16),
    "fp16": (np.float16, 16),
    "e4m3": (ml_dtypes.float8_e4m3fn, 8),
    "e5m2": (ml_dtypes.float8_e5m2, 8),
}
# Sub-byte formats (one code per byte in the tables, in the low bits). Kept apart from FORMATS
# so the input set, which FORMATS' boundaries shape, stays what it was before E2M1 was added.
SUB_BYTE_FORMATS = {
    "e2m1": (ml_dtypes.float4_e2m1fn, 4),
}


def decode_all(dtype, bits):
    codes = np.arange(1 << bits, dtype=np.uint32).astype(np.uint16 if bits == 16 else np.uint8)
    # ml_dtypes stores a 4-bit code in the low bits of one byte, so the same view works.
    with np.errstate(invalid="ignore"):
        return codes.view(dtype).astype(np.float32).view(np.uint32)


def positive_finite_values(dtype, bits):
    """float32 values of every positive finite code (including +0), ascending."""
    values = decode_all(dtype, bits).view(np.float32)[: 1 << (bits - 1)]
    values = values[np.isfinite(values)]
    return np.unique(values.astype(np.float64))


def next_up(x):
    return np.nextafter(x.astype(np.float32), np.float32(np.inf))


def next_down(x):
    return np.nextafter(x.astype(np.float32), np.float32(-np.inf))


def neighbourhood(values_f64):
    """Each value as float32 and its two float32 neighbours."""
    with np.errstate(over="ignore"):  # BF16's 2 x max is beyond float32: inf, kept
        v = values_f64.astype(np.float32)
    return [v, next_up(v), next_down(v)]


def boundary_inputs(dtype, bits, rng):
    """Codes, midpoints between adjacent codes (exact ties) and their float32 neighbours,
    plus the saturation boundary just above the largest finite value."""
    values = positive_finite_values(dtype, bits)
    mids = (values[:-1] + values[1:]) / 2.0  # exact in float64, and in float32 (<= 12 bits)
    if bits == 16:
        # Every subnormal/lowest-binade pair, the top binades, and a random sample of the
        # rest keep the table small; the C++ tests sweep the rest against their own reference.
        idx = np.arange(len(mids))
        keep = (idx < 2048) | (idx >= len(mids) - 2048) | (rng.random(len(mids)) < 0.05)
        values_kept = np.concatenate([values[:-1][keep], values[-1:]])
        mids = mids[keep]
        values = values_kept
    top = values[-1]
    ulp_top = values[-1] - values[-2]
    beyond = np.array([top + ulp_top / 2, top + ulp_top, top * 2, top + ulp_top * 1.5])
    parts = neighbourhood(values) + neighbourhood(mids) + neighbourhood(beyond)
    positive = np.concatenate(parts)
    return np.concatenate([positive, -positive])


def special_inputs():
    bits = np.array(
        [
            0x00000000, 0x80000000,  # +-0
            0x00000001, 0x80000001, 0x007FFFFF, 0x00400000,  # float32 subnormals
            0x00800000, 0x80800000,  # FLT_MIN
            0x7F7FFFFF, 0xFF7FFFFF,  # FLT_MAX
            0x7F800000, 0xFF800000,  # +-inf
            0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF, 0xFFFFFFFF,
            0x7FA00000, 0x7FC00001, 0x7FBFFFFF,  # NaNs: quiet, signalling, payloads
            0x477FEFFF, 0x477FF000, 0x477FF001,  # FP16 overflow threshold (65520)
            0x7F7F7FFF, 0x7F7F8000, 0x7F7F8001,  # BF16 overflow threshold
            0x43E80000, 0x43E7FFFF, 0x43E80001,  # e4m3: 464 = 448 + half ulp
            0x47700000, 0x476FFFFF, 0x47700001,  # e5m2: 61440 = 57344 + half ulp
            0x33000000, 0x33000001, 0xB3000000,  # FP16: half the smallest subnormal
            0x3A800000, 0x3A800001, 0x3A7FFFFF,  # e4m3: 2^-10 = half the smallest subnormal
            0x37000000, 0x37000001, 0x36FFFFFF,  # e5m2: 2^-17
        ],
        dtype=np.uint32,
    )
    return bits.view(np.float32)


def random_inputs(rng):
    all_bits = rng.integers(0, 1 << 32, size=20000, dtype=np.uint64).astype(np.uint32)
    # Log-uniform over the range where the formats live, both signs.
    exponents = rng.uniform(-30.0, 20.0, size=20000)
    magnitudes = np.exp2(exponents).astype(np.float32)
    signs = np.where(rng.random(20000) < 0.5, -1.0, 1.0).astype(np.float32)
    normal = (rng.standard_normal(8000) * 4.0).astype(np.float32)
    return np.concatenate([all_bits.view(np.float32), magnitudes * signs, normal])


def write(name, array):
    path = OUT / name
    array.astype(array.dtype.newbyteorder("<")).tofile(path)
    return path


def main():
    rng = np.random.default_rng(SEED)
    OUT.mkdir(exist_ok=True)
    written = []

    for name, (dtype, bits) in FORMATS.items():
        written.append(write(f"{name}_to_f32.u32", decode_all(dtype, bits)))
    for name, (dtype, bits) in SUB_BYTE_FORMATS.items():
        written.append(write(f"{name}_to_f32.u32", decode_all(dtype, bits)))

    inputs = [special_inputs(), random_inputs(rng)]
    for _, (dtype, bits) in FORMATS.items():
        inputs.append(boundary_inputs(dtype, bits, rng))
    inputs = np.concatenate([x.astype(np.float32) for x in inputs])
    # Deduplicate on bit patterns (keeps -0 and every NaN payload) in a stable order.
    _, first = np.unique(inputs.view(np.uint32), return_index=True)
    inputs = inputs[np.sort(first)]
    written.append(write("f32_inputs.u32", inputs.view(np.uint32)))

    with np.errstate(over="ignore", invalid="ignore"):
        for name, (dtype, bits) in FORMATS.items():
            storage = np.uint16 if bits == 16 else np.uint8
            suffix = "u16" if bits == 16 else "u8"
            written.append(write(f"f32_to_{name}.{suffix}", inputs.astype(dtype).view(storage)))
        for name, (dtype, bits) in SUB_BYTE_FORMATS.items():
            written.append(write(f"f32_to_{name}.u8", inputs.astype(dtype).view(np.uint8)))

    lines = [
        "slimserve numeric-format golden tables (generated by tests/formats/gen_golden.py)",
        f"ml_dtypes {ml_dtypes.__version__}, numpy {np.__version__}, python {sys.version.split()[0]}",
        f"seed {SEED}; {len(inputs)} float32 encoder inputs",
        "",
    ]
    for path in written:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        lines.append(f"{digest}  {path.name}  ({path.stat().st_size} bytes)")
    (OUT / "MANIFEST.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
