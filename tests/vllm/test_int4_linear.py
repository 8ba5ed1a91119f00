"""slimserve.vllm.int4_linear's repacking, against the library's own packer: random weights
quantized by slimserve.quantize_int4 (fresh seed, several shapes and groups); the codes read
back from its dequantized weight and packed by pack_for_gemm must give the library's words
bit for bit, and the checkpoint-side unpacking (nibbles along either axis) must invert a
straightforward packing. Runs without vLLM."""
import sys

import numpy as np
import torch

import slimserve as s
from slimserve.vllm.int4_linear import pack_for_gemm, unpack_along


def main() -> int:
    seed = int(np.random.SeedSequence().entropy % 2**32)
    rng = np.random.default_rng(seed)
    checked = 0
    for k, n, group in ((576, 1536, 64), (1536, 576, 128), (64, 48, 32), (96, 32, 32), (128, 16, 128)):
        w = (rng.standard_normal((k, n)) * rng.uniform(0.01, 2)).astype(np.float32)
        ref = s.quantize_int4(w, group_size=group, activation="bfloat16")
        deq = ref.dequantize()  # [k, n]
        scales = ref.scales.view(np.uint16).astype(np.uint32) << 16
        scales = scales.view(np.float32).reshape(k // group, n)
        codes = np.rint(deq / np.repeat(scales, group, axis=0)) + 8
        codes = np.where(np.repeat(scales, group, axis=0) == 0, 8, codes)
        assert codes.min() >= 0 and codes.max() <= 15, (k, n, group)
        ours = pack_for_gemm(codes.astype(np.uint8))
        if not np.array_equal(ours, ref.packed.view(np.uint32)):
            bad = int(np.flatnonzero(ours != ref.packed.view(np.uint32))[0])
            print(f"FAIL seed {seed}: k={k} n={n} group={group}: word {bad} differs", file=sys.stderr)
            return 1
        checked += ours.size
        # Checkpoint side: nibbles packed along K (axis 1 of [N, K/8], or axis 0 of [K/8, N]).
        q = rng.integers(0, 16, size=(n, k))
        words = np.zeros((n, k // 8), np.int64)
        for i in range(8):
            words |= q[:, i::8].astype(np.int64) << (4 * i)
        packed = torch.from_numpy(words.astype(np.uint32).view(np.int32))
        assert torch.equal(unpack_along(packed, 1), torch.from_numpy(q)), (k, n)
        assert torch.equal(unpack_along(packed.t().contiguous(), 0), torch.from_numpy(q).t()), (k, n)
    print(f"int4_linear packing: {checked} words equal the library's (seed {seed})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
