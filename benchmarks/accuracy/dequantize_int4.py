"""An INT4 compressed-tensors folder (slimserve_quantize_int4's default output, symmetric,
pack-quantized) as a plain BF16 model folder holding exactly the weights a W4A16 kernel
multiplies by: w = round_bf16(code * scale), code = nibble - 8, the scale as stored.

That is slimserve's W4A16 GEMM's weight bit for bit on its expansion path (m >= 128 rows by
default) and with groups of 32 (docs/int4-gemm.md, `per_weight` = `dequantize_reference`); its
fused tiles with groups >= 64 multiply by (code * scale) unrounded, within one BF16 rounding.

    python dequantize_int4.py INT4_DIR OUT_DIR
"""
import json
import os
import shutil
import sys

import torch
from safetensors.torch import load_file, save_file


def unpack_codes(packed: torch.Tensor, k: int) -> torch.Tensor:
    """[N, ceil(K/8)] int32, 8 nibbles along K per word, lowest first, nibble = code + 8
    -> [N, K] int codes in -8..7."""
    words = packed.to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(0, 32, 4, dtype=torch.int64)
    nibbles = (words.unsqueeze(-1) >> shifts) & 0xF  # [N, K/8, 8]
    return (nibbles.reshape(packed.shape[0], -1)[:, :k] - 8).to(torch.int32)


def dequantize(packed: torch.Tensor, scale: torch.Tensor, shape) -> torch.Tensor:
    n, k = (int(v) for v in shape)
    codes = unpack_codes(packed, k)
    groups = scale.shape[1]
    if k % groups:
        raise ValueError(f"K = {k} is not a whole number of the {groups} groups")
    # code (4 bits) x scale (BF16's 8) is exact in FP32: one rounding, to BF16, as the kernel does.
    per_element = scale.to(torch.float32).repeat_interleave(k // groups, dim=1)
    return (codes.to(torch.float32) * per_element).to(torch.bfloat16)


def main(src: str, dst: str) -> int:
    config = json.load(open(os.path.join(src, "config.json")))
    q = config.pop("quantization_config", None)
    if not q or q.get("quant_method") != "compressed-tensors" or q.get("format") != "pack-quantized":
        raise SystemExit(f"{src}: not a compressed-tensors pack-quantized folder")
    scheme = next(iter(q["config_groups"].values()))["weights"]
    if not scheme.get("symmetric", True):
        raise SystemExit(f"{src}: asymmetric (zero points) folders are not handled here")
    names = sorted(f for f in os.listdir(src) if f.endswith(".safetensors"))
    os.makedirs(dst, exist_ok=True)
    for name in names:
        tensors = load_file(os.path.join(src, name))
        out = {}
        for key, value in tensors.items():
            if key.endswith(".weight_packed"):
                module = key[: -len(".weight_packed")]
                out[module + ".weight"] = dequantize(value, tensors[module + ".weight_scale"],
                                                     tensors[module + ".weight_shape"].tolist())
            elif not key.endswith((".weight_scale", ".weight_shape")):
                out[key] = value
        save_file(out, os.path.join(dst, name), metadata={"format": "pt"})
    for f in os.listdir(src):
        if not f.endswith(".safetensors") and f != "config.json" and os.path.isfile(os.path.join(src, f)):
            shutil.copy(os.path.join(src, f), os.path.join(dst, f))
    config["torch_dtype"] = "bfloat16"
    json.dump(config, open(os.path.join(dst, "config.json"), "w"), indent=2)
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2]))
