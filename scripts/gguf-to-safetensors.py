"""Converts a GGUF checkpoint to a float safetensors folder vLLM loads (vLLM's core has no GGUF
loader). transformers reads the GGUF and dequantizes it; the quantizer it attaches is dropped
so that save_pretrained writes plain tensors. Written to OUT.partial, then renamed, so an
interrupted run leaves no half folder behind.
Usage: python gguf-to-safetensors.py GGUF_FILE OUT_DIR [DTYPE]   (DTYPE: bfloat16 | float32)"""
import os
import shutil
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def main(gguf_path: str, out_dir: str, dtype: str = "bfloat16") -> None:
    folder, name = os.path.split(os.path.abspath(gguf_path))
    partial = out_dir.rstrip("/") + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=getattr(torch, dtype))
    model.hf_quantizer = None
    model.config.quantization_config = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(partial, safe_serialization=True)
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(partial)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.rename(partial, out_dir)


if __name__ == "__main__":
    main(*sys.argv[1:])
