"""Rotated caches: reshape_and_cache / append_kv with rotation, and rotate_heads, against an
FP64 Walsh-Hadamard reference (H x / sqrt(D), H[i][j] = (-1)^popcount(i & j))."""
import numpy as np
import pytest

import slimserve as ss

PAGE, HEADS, PAGES = 16, 2, 12


def hadamard(d):
    i = np.arange(d)
    bits = np.bitwise_and.outer(i, i)
    parity = np.vectorize(lambda x: bin(int(x)).count("1") & 1)(bits)
    return (1.0 - 2.0 * parity) / np.sqrt(d)


@pytest.mark.parametrize("rotation", ["keys", "keys_and_values"])
@pytest.mark.parametrize("dim", [64, 128])
def test_reshape_and_cache_stores_rotated_rows(rng, rotation, dim):
    n = 2 * PAGE + 3
    k = rng.standard_normal((n, HEADS, dim)).astype(np.float16)
    v = rng.standard_normal((n, HEADS, dim)).astype(np.float16)
    k[:, :, 5] *= 20  # an outlier channel
    k_cache = np.full((PAGES, PAGE, HEADS, dim), np.nan, np.float16)
    v_cache = np.full_like(k_cache, np.nan)
    slots = rng.permutation(PAGES * PAGE)[:n].astype(np.int64)
    ss.reshape_and_cache(k, v, k_cache, v_cache, slots, rotation=rotation)
    h = hadamard(dim)
    want_k = k.astype(np.float64) @ h.T
    want_v = v.astype(np.float64) @ h.T if rotation == "keys_and_values" else v.astype(np.float64)
    got_k = k_cache.reshape(-1, HEADS, dim)[slots].astype(np.float64)
    got_v = v_cache.reshape(-1, HEADS, dim)[slots].astype(np.float64)
    # One FP16 rounding (half an ulp, 2^-11 relative) of an FP32 rotation.
    np.testing.assert_allclose(got_k, want_k, rtol=2.0**-10, atol=1e-5)
    np.testing.assert_allclose(got_v, want_v, rtol=2.0**-10, atol=1e-5)
    untouched = np.setdiff1d(np.arange(PAGES * PAGE), slots)
    assert np.isnan(k_cache.reshape(-1, HEADS, dim)[untouched]).all()


def test_append_rotation_refusals_name_the_argument(rng):
    k = rng.standard_normal((2, HEADS, 96)).astype(np.float16)
    k_cache = np.full((PAGES, PAGE, HEADS, 96), np.nan, np.float16)
    v_cache = np.full_like(k_cache, np.nan)
    slots = np.array([0, 1], np.int64)
    with pytest.raises(ss.SlimserveValueError, match="rotation"):
        ss.reshape_and_cache(k, k, k_cache, v_cache, slots, rotation="keys")  # head_dim 96
    k64 = rng.standard_normal((2, HEADS, 64)).astype(np.float16)
    k_cache = np.full((PAGES, PAGE, HEADS, 64), np.nan, np.float16)
    with pytest.raises(ss.SlimserveValueError, match="rotation"):
        ss.reshape_and_cache(k64, k64, k_cache, k_cache.copy(), slots, rotation="values")
    assert np.isnan(k_cache).all()


@pytest.mark.parametrize("dim", [64, 128, 256])
def test_rotate_heads_matches_fp64_and_is_its_own_inverse(rng, dim):
    x = (rng.standard_normal((7, 3, dim)) * 2).astype(np.float16)
    out = np.full_like(x, np.nan)
    assert ss.rotate_heads(x, out) is out
    want = x.astype(np.float64) @ hadamard(dim).T
    np.testing.assert_allclose(out.astype(np.float64), want, rtol=2.0**-10, atol=1e-4)
    # A row-strided view (a Q slice of a fused QKV output), rotated in place, twice: x again.
    fused = np.zeros((7, 3 * dim + 8), np.float16)
    view = fused[:, : 3 * dim].reshape(7, 3, dim)
    view[...] = x
    ss.rotate_heads(view)
    np.testing.assert_array_equal(view, out)
    ss.rotate_heads(view)
    np.testing.assert_allclose(view.astype(np.float64), x.astype(np.float64), rtol=2.0**-8, atol=2e-3)
    assert not fused[:, 3 * dim :].any()  # the gap is untouched


def test_rotate_heads_refusals_name_the_argument(rng):
    x = rng.standard_normal((2, 2, 96)).astype(np.float16)
    with pytest.raises(ss.SlimserveValueError, match="head_dim"):
        ss.rotate_heads(x)
    x = rng.standard_normal((2, 2, 64)).astype(np.float16)
    with pytest.raises(ss.SlimserveValueError, match="out"):
        ss.rotate_heads(x, np.zeros((2, 2, 128), np.float16))
    with pytest.raises(ss.SlimserveTypeError, match="out"):
        ss.rotate_heads(x, np.zeros((2, 2, 64), np.float32))
    with pytest.raises(ss.SlimserveTypeError, match="x"):
        ss.rotate_heads(x.astype(np.float32))
    with pytest.raises(ss.SlimserveValueError, match="x"):
        ss.rotate_heads(x[:, :, None, :])
    with pytest.raises(ss.SlimserveValueError, match="overlaps"):
        ss.rotate_heads(x[:, :1], x[:, 1:])
    before = x.copy()
    assert np.array_equal(x, before)


@pytest.mark.parametrize("rotation", ["keys", "keys_and_values"])
def test_paged_attention_rotation_matches_the_reference_and_refuses_by_name(rng, rotation):
    """A cache written with rotation=..., attended with the same rotation: the unrotated queries
    against the stored rows rotated back in FP64 (H is symmetric and its own inverse)."""
    dim, hq, lengths, qo = 64, 4, [1, PAGE + 1, 3 * PAGE - 1], [1, 1, 5]
    pages = rng.permutation(PAGES)  # shuffled, with holes (unused pages stay NaN)
    k_cache = np.full((PAGES, PAGE, HEADS, dim), np.nan, np.float16)
    v_cache = np.full_like(k_cache, np.nan)
    counts = [-(-n // PAGE) for n in lengths]
    owned = np.split(pages[: sum(counts)], np.cumsum(counts)[:-1])
    slots = np.concatenate([p[np.arange(n) // PAGE] * PAGE + np.arange(n) % PAGE for p, n in zip(owned, lengths)])
    k = rng.standard_normal((len(slots), HEADS, dim)).astype(np.float16)
    v = rng.standard_normal((len(slots), HEADS, dim)).astype(np.float16)
    ss.reshape_and_cache(k, v, k_cache, v_cache, slots.astype(np.int64), rotation=rotation)
    h = hadamard(dim)
    flat_k = k_cache.reshape(-1, HEADS, dim).astype(np.float64) @ h
    flat_v = v_cache.reshape(-1, HEADS, dim).astype(np.float64)
    if rotation == "keys_and_values":
        flat_v = flat_v @ h
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    last = np.array([n - (c - 1) * PAGE for n, c in zip(lengths, counts)], np.int32)
    qo_indptr = np.concatenate([[0], np.cumsum(qo)]).astype(np.int32)
    q = rng.standard_normal((int(qo_indptr[-1]), hq, dim)).astype(np.float16)
    wrapper = ss.PagedAttentionWrapper()
    wrapper.plan(qo_indptr, hq, HEADS, dim, PAGE, kv_indptr=indptr, kv_indices=np.concatenate(owned).astype(np.int32),
                 last_page_len=last, kv_dtype="float16", num_sms=4)
    out = np.full(q.shape, np.nan, np.float16)
    wrapper.run(q, ss.PagedKVCache(k_cache, v_cache, dtype="float16"), out=out, rotation=rotation)
    start = 0
    for b, n in enumerate(lengths):
        rows = slots[start : start + n]
        start += n
        for i in range(qo[b]):
            t = qo_indptr[b] + i
            visible = n - qo[b] + i + 1
            for head in range(hq):
                kv = head // (hq // HEADS)
                s = flat_k[rows[:visible], kv] @ q[t, head].astype(np.float64) / np.sqrt(dim)
                w = np.exp(s - s.max())
                want = w @ flat_v[rows[:visible], kv] / w.sum()
                # FP16 output and P, and the rotated query rounded to FP16 (each score moves by
                # at most 2^-11 |q| |k| / sqrt(D)).
                shift = 2.0**-11 * np.linalg.norm(q[t, head]) * np.linalg.norm(flat_k[rows[:visible], kv], axis=1).max()
                v_max = np.abs(flat_v[rows[:visible], kv]).max()
                tolerance = 2.0**-11 * np.abs(want) + (2 * 2.0**-12 + 2.2 * shift / np.sqrt(dim) + 1e-4) * v_max + 1e-6
                assert (np.abs(out[t, head].astype(np.float64) - want) <= tolerance).all()
    out[:] = np.nan
    with pytest.raises(ss.SlimserveValueError, match="rotation"):
        wrapper.run(q, ss.PagedKVCache(k_cache, v_cache, dtype="float16"), out=out, rotation="values")
    assert np.isnan(out).all()
