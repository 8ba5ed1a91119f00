import numpy as np
import pytest

import slimserve as ss


@pytest.mark.parametrize("symmetric,group_size", [(True, 32), (False, 64)])
def test_quantize_and_gemm_match_numpy(rng, symmetric, group_size):
    k, n, m = 128, 64, 5
    weight = rng.uniform(-1, 1, (k, n)).astype(np.float32)
    w = ss.quantize_int4(weight, group_size=group_size, symmetric=symmetric, activation="float16")
    assert (w.k, w.n, w.group_size) == (k, n, group_size)
    assert (w.zeros is None) == symmetric
    dequantized = w.dequantize()
    assert np.abs(dequantized - weight).max() <= 0.1  # half a step of 1/7 or 2/15, plus rounding
    a = rng.standard_normal((m, k)).astype(np.float16)
    out = np.full((m, n), np.nan, np.float16)
    ss.gemm_w4a16(a, w.packed, w.scales, w.zeros, group_size, out=out)
    terms = a.astype(np.float64)[:, :, None] * dequantized.astype(np.float64)[None, :, :]
    expected = terms.sum(axis=1)
    # FP16 output rounding, plus the FP16 rounding of each dequantized weight: where the plan
    # applies group scales to the FP32 group sums, the GEMM multiplies by the exact (q - z) * s.
    bound = np.abs(terms).sum(axis=1) / 1024 + np.abs(expected) / 1024 + 1e-6
    assert (np.abs(out.astype(np.float64) - expected) <= bound).all()


def test_nn_linear_layout_is_the_transpose(rng):
    weight = rng.uniform(-1, 1, (64, 128)).astype(np.float32)  # [n, k] as nn.Linear stores it
    a = ss.quantize_int4(weight, group_size=32, layout="n_by_k").dequantize()
    b = ss.quantize_int4(np.ascontiguousarray(weight.T), group_size=32).dequantize()
    np.testing.assert_array_equal(a, b)


def test_bad_shapes_are_refused():
    with pytest.raises(ss.SlimserveError) as error:
        ss.quantize_int4(np.ones((12, 16), np.float32), group_size=32)
    assert error.value.code in ("invalid_argument", "unsupported")
