"""Checks slimserve_quantize_int4's output folders with the formats' own code.

    check_formats.py OUT_DIR REFERENCE.safetensors [OUT_DIR REFERENCE.safetensors ...]

Each REFERENCE holds slimserve's own dequantization of every quantized module (F32 [N, K], written
by `slimserve_quantize_int4_check dequantize`).

compressed-tensors output goes through compressed-tensors' own loading path, the one
transformers' CompressedTensorsHfQuantizer and llm-compressor use: config.json's
quantization_config is parsed into a QuantizationConfig, a model with one nn.Linear per 2-D
weight is built on the meta device, the config is applied to it (so its targets and ignore
list decide which layers carry a scheme), ModelCompressor.compress_model turns those layers
into their compressed form, the folder's tensors are loaded into it with strict shape and
name checks, and ModelCompressor.decompress_model decompresses every layer. Each
decompressed weight must equal slimserve's dequantization, rounded to the same dtype, bit
for bit.

GPTQ output is unpacked with the published GPTQ packing convention (AutoGPTQ's
QuantLinear: qweight [K/8, N] packed along K, qzeros [G, N/8] packed along N, both eight
4-bit fields per int32, lowest bits first; v1 stores zero - 1), dequantized as
scales[g_idx] * (q - zero), compared with the reference, and packed again to the same bytes.
"""
import json
import pathlib
import sys

import torch
from safetensors.torch import load_file


def load_folder(folder):
    index = folder / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = sorted(set(weight_map.values()))
    else:
        weight_map, files = None, ["model.safetensors"]
    tensors = {}
    for name in files:
        part = load_file(folder / name)
        if weight_map is not None:
            assert all(weight_map[t] == name for t in part), f"index disagrees with {name}"
        tensors.update(part)
    if weight_map is not None:
        assert set(weight_map) == set(tensors), "index and shards list different tensors"
    return tensors


def build_linear_model(tensors):
    """One nn.Linear (meta) per module that has a 2-D weight or a packed INT4 weight."""
    model = torch.nn.Module()
    linears = {}
    for name, tensor in tensors.items():
        if name.endswith(".weight_shape"):
            module, (n, k) = name[: -len(".weight_shape")], tensor.tolist()
            dtype = tensors[module + ".weight_scale"].dtype
        elif name.endswith(".weight") and tensor.dim() == 2:
            module, (n, k), dtype = name[: -len(".weight")], tensor.shape, tensor.dtype
        else:
            continue
        parent = model
        *path, leaf = module.split(".")
        for part in path:
            if not hasattr(parent, part):
                parent.add_module(part, torch.nn.Module())
            parent = getattr(parent, part)
        linear = torch.nn.Linear(k, n, bias=module + ".bias" in tensors, device="meta", dtype=dtype)
        parent.add_module(leaf, linear)
        linears[module] = linear
    return model, linears


def check_compressed_tensors(folder, config, tensors, reference):
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config

    qconfig = QuantizationConfig.model_validate(config["quantization_config"])
    assert qconfig.format == "pack-quantized", qconfig.format
    model, linears = build_linear_model(tensors)
    apply_quantization_config(model, qconfig, show_progress=False)
    schemed = {name for name, module in linears.items() if getattr(module, "quantization_scheme", None)}
    packed = {name[: -len(".weight_packed")] for name in tensors if name.endswith(".weight_packed")}
    assert schemed == packed, (
        f"config selects {sorted(schemed ^ packed)[:5]}... differently from the packed tensors")
    for name in schemed:
        weights = linears[name].quantization_scheme.weights
        group = config["quantization_config"]["config_groups"]["group_0"]["weights"]
        assert weights.num_bits == 4 and weights.type == "int", weights
        assert weights.symmetric == group["symmetric"] and weights.strategy == group["strategy"], weights
        assert weights.group_size == group["group_size"], weights

    compressor = ModelCompressor(quantization_config=qconfig)
    compressor.compress_model(model)  # meta: the compressed parameter names and shapes
    state = {}
    for name in linears:
        for key in dict(linears[name].named_parameters(recurse=False)) | dict(linears[name].named_buffers(recurse=False)):
            state[f"{name}.{key}"] = tensors[f"{name}.{key}"]
    expected = {f"{n}.{k}" for n, m in linears.items()
                for k in list(dict(m.named_parameters(recurse=False))) + list(dict(m.named_buffers(recurse=False)))}
    extra = {t for t in tensors if any(t.startswith(n + ".") for n in packed)} - expected
    assert not extra, f"tensors the compressor does not expect: {sorted(extra)[:5]}"
    # The compressor's meta pass keeps zero points unpacked ([N, G]) while the real pass and
    # every checkpoint pack them ([ceil(N/8), G]): assign those directly, the rest strictly.
    for key in [k for k in state if k.endswith(".weight_zero_point")]:
        module_name, _, param = key.rpartition(".")
        setattr(linears[module_name], param, torch.nn.Parameter(state.pop(key), requires_grad=False))
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    missing = [k for k in missing if not k.endswith(".weight_zero_point")]
    assert not missing and not unexpected, (missing[:5], unexpected[:5])
    compressor.decompress_model(model)

    for name in sorted(packed):
        weight = linears[name].weight.data
        ref = reference[name]
        assert weight.shape == ref.shape, (name, weight.shape, ref.shape)
        assert weight.dtype == tensors[name + ".weight_scale"].dtype, (name, weight.dtype)
        expected_weight = ref.to(weight.dtype)
        if not torch.equal(weight.view(torch.int16 if weight.element_size() == 2 else torch.int32),
                           expected_weight.view(torch.int16 if weight.element_size() == 2 else torch.int32)):
            bad = (weight.float() != expected_weight.float()).nonzero()[0].tolist()
            raise AssertionError(f"{name}: compressed-tensors decompresses {weight[tuple(bad)]} at {bad}, "
                                 f"slimserve {expected_weight[tuple(bad)]}")
    # A folder converted from a format package's fixture carries that package's own
    # dequantization (F32 [K, N]): the converted layer must decompress to exactly it.
    if "reference.dequantized" in tensors and "layer" in packed:
        theirs = tensors["reference.dequantized"].t().to(linears["layer"].weight.dtype)
        assert torch.equal(linears["layer"].weight.data, theirs), "converted layer differs from the source package"
    return len(packed)


def unpack_along_rows(packed):
    """[R, C] int32 -> [8R, C]: field j of row r is row 8r + j (GPTQ qweight)."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    fields = (packed.unsqueeze(1) >> shifts.view(1, 8, 1)) & 0xF
    return fields.reshape(packed.shape[0] * 8, packed.shape[1])


def unpack_along_cols(packed):
    """[R, C] int32 -> [R, 8C]: field j of column c is column 8c + j (GPTQ qzeros)."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    fields = (packed.unsqueeze(2) >> shifts.view(1, 1, 8)) & 0xF
    return fields.reshape(packed.shape[0], packed.shape[1] * 8)


def pack_along_rows(values):
    shifts = torch.arange(0, 32, 4, dtype=torch.int64)
    fields = values.to(torch.int64).reshape(-1, 8, values.shape[1]) << shifts.view(1, 8, 1)
    words = fields.sum(dim=1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def check_gptq(folder, config, tensors, reference):
    quantize_config = json.loads((folder / "quantize_config.json").read_text())
    assert quantize_config == config["quantization_config"], "quantize_config.json differs from config.json"
    assert quantize_config["bits"] == 4 and quantize_config["desc_act"] is False
    v1 = quantize_config.get("checkpoint_format", "gptq") == "gptq"
    modules = sorted(name[: -len(".qweight")] for name in tensors if name.endswith(".qweight"))
    for name in modules:
        qweight, qzeros = tensors[name + ".qweight"], tensors[name + ".qzeros"]
        scales, g_idx = tensors[name + ".scales"], tensors[name + ".g_idx"].long()
        n = qweight.shape[1]
        codes = unpack_along_rows(qweight)                       # [K, N]
        zeros = unpack_along_cols(qzeros)[:, :n] + (1 if v1 else 0)  # [G, N]
        if quantize_config["sym"]:
            assert bool((zeros == 8).all()), f"{name}: symmetric zero points must be 8"
        weight = scales.float()[g_idx] * (codes - zeros[g_idx]).float()  # [K, N]
        assert torch.equal(weight.t().contiguous(), reference[name]), f"{name}: GPTQ dequantization differs"
        assert torch.equal(pack_along_rows(codes), qweight), f"{name}: qweight does not re-pack to itself"
    return len(modules)


def check_folder(folder, reference_path):
    config = json.loads((folder / "config.json").read_text())
    tensors = load_folder(folder)
    reference = load_file(reference_path)
    method = config["quantization_config"]["quant_method"]
    if method == "compressed-tensors":
        count = check_compressed_tensors(folder, config, tensors, reference)
    elif method == "gptq":
        count = check_gptq(folder, config, tensors, reference)
    else:
        raise SystemExit(f"unexpected quant_method {method}")
    assert count == len(reference) > 0, f"{count} quantized layers, reference has {len(reference)}"
    print(f"check_formats: {folder.name}: {count} layers ({method}) match slimserve bit for bit", flush=True)


def main():
    args = sys.argv[1:]
    if not args or len(args) % 2:
        raise SystemExit(__doc__)
    for folder, reference in zip(args[0::2], args[1::2]):
        check_folder(pathlib.Path(folder), pathlib.Path(reference))


if __name__ == "__main__":
    sys.exit(main())
