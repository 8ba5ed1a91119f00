"""The vLLM plugin's NVFP4 arithmetic, without vLLM: the per-head content it gives vLLM's KV
spec (a K and a V head vector per token) and the tensor scale it derives from vLLM's
FP8-meaning k_scale / v_scale."""
import math

import numpy as np
import pytest

import slimserve as ss

PAGE, HKV = 16, 2


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_nvfp4_head_content_bytes_match_the_format(head_dim):
    # The format: 4-bit E2M1 codes (two a byte), then one 1-byte E4M3 scale per 16-element block.
    codes, block_scales = head_dim * 4 // 8, head_dim // 16
    assert ss.nvfp4_head_vector_bytes(head_dim) == codes + block_scales == 9 * head_dim // 16
    assert 2 * ss.nvfp4_head_vector_bytes(head_dim) == 2 * 9 * head_dim // 16  # vLLM's K + V bytes
    # The library reads pages of that last extent as this head_dim.
    pages = np.zeros((4, PAGE, HKV, ss.nvfp4_head_vector_bytes(head_dim)), np.uint8)
    cache = ss.PagedKVCache(pages, pages.copy(), dtype="nvfp4", k_scale=1.0, v_scale=1.0)
    assert cache.view.head_dim == head_dim


@pytest.mark.parametrize("head_dim", [0, -16, 72])
def test_nvfp4_head_vector_bytes_refuses_partial_blocks(head_dim):
    with pytest.raises(ss.SlimserveValueError, match="head_dim"):
        ss.nvfp4_head_vector_bytes(head_dim)


@pytest.mark.parametrize("scale", [1.0, 0.5, 3.0, 2.0 ** -10, 1234.5])
def test_nvfp4_tensor_scale_is_the_fp8_scale_over_six(scale):
    tensor_scale = ss.nvfp4_tensor_scale(scale)
    assert tensor_scale * 6.0 == pytest.approx(scale, rel=1e-15)
    assert 6.0 * 448.0 * tensor_scale == pytest.approx(448.0 * scale, rel=1e-15)  # same largest value


@pytest.mark.parametrize("scale", [0.0, -1.0, math.inf, -math.inf, math.nan])
def test_nvfp4_tensor_scale_refuses_non_finite_or_non_positive(scale):
    with pytest.raises(ss.SlimserveValueError, match="fp8_scale"):
        ss.nvfp4_tensor_scale(scale)


def test_plugin_tensor_scale_agrees_without_vllm():
    """slimserve.vllm.support imports torch but not vLLM: its tensor form agrees."""
    torch = pytest.importorskip("torch")
    from slimserve.vllm import support
    for scale in (1.0, 0.75, 5.0):
        got = support.nvfp4_tensor_scale(torch.tensor(scale, dtype=torch.float32))
        assert got.shape == (1,) and got.dtype == torch.float32
        assert float(got[0]) == pytest.approx(np.float32(ss.nvfp4_tensor_scale(scale)), rel=1e-7)


@pytest.mark.parametrize("kv_dtype", ["fp8_e4m3", "nvfp4"])
def test_plugin_kernel_scales_refuse_what_the_kernels_cannot_read(kv_dtype):
    """The plugin's check of a layer's scales (support.kernel_kv_scales): what the kernels
    read, or ValueError naming the scale, before any cache is made."""
    torch = pytest.importorskip("torch")
    from slimserve.vllm import support
    good = torch.tensor(0.75, dtype=torch.float64)
    k, v = support.kernel_kv_scales(good, torch.tensor([2.0]), kv_dtype)
    divisor = 6.0 if kv_dtype == "nvfp4" else 1.0
    assert k.shape == v.shape == (1,) and k.dtype == v.dtype == torch.float32
    assert float(k[0]) == np.float32(0.75 / divisor) and float(v[0]) == np.float32(2.0 / divisor)
    for bad in (0.0, -1.0, math.inf, math.nan, 1e39):  # 1e39 is inf as float32
        for which, pair in (("k", (bad, 1.0)), ("v", (1.0, bad))):
            with pytest.raises(ValueError, match=f"vLLM {which}_scale must be finite and > 0 as a float32"):
                support.kernel_kv_scales(torch.tensor(pair[0], dtype=torch.float64),
                                         torch.tensor(pair[1], dtype=torch.float64), kv_dtype)
    # Twice and half the vLLM scale whose sixth is the largest NVFP4 tensor scale.
    above, below = 12.0 * support.NVFP4_MAX_TENSOR_SCALE, 3.0 * support.NVFP4_MAX_TENSOR_SCALE
    if kv_dtype == "nvfp4":
        k, _ = support.kernel_kv_scales(torch.tensor(below), good, kv_dtype)
        assert float(k[0]) <= support.NVFP4_MAX_TENSOR_SCALE
        with pytest.raises(ValueError, match=r"nvfp4 tensor scale \(vLLM v_scale / 6\) .* above"):
            support.kernel_kv_scales(good, torch.tensor(above), kv_dtype)
    else:
        # FP8 readers take any finite scale, unchanged
        k, v = support.kernel_kv_scales(torch.tensor(above), good, kv_dtype)
        assert float(k[0]) == np.float32(above) and float(v[0]) == np.float32(0.75)
