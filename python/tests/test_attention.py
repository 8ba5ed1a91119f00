import numpy as np
import pytest

import slimserve as ss

PAGE, HEADS, QO, DIM, PAGES = 16, 2, 8, 64, 48


def _fill(rng, lengths, layout="NHD"):
    """Caches written by reshape_and_cache from a shuffled page table with holes."""
    shape = (PAGES, PAGE, HEADS, DIM) if layout == "NHD" else (PAGES, HEADS, PAGE, DIM)
    k_cache = np.full(shape, np.nan, np.float16)  # poison: unwritten slots read as NaN
    v_cache = np.full(shape, np.nan, np.float16)
    free = rng.permutation(np.arange(1, PAGES))[: sum(-(-n // PAGE) for n in lengths)]
    tables, values, start = [], [], 0
    for n in lengths:
        pages = free[start : start + -(-n // PAGE)]
        start += len(pages)
        k = rng.standard_normal((n, HEADS, DIM)).astype(np.float16)
        v = rng.standard_normal((n, HEADS, DIM)).astype(np.float16)
        tables.append(pages)
        values.append((k, v))
    return k_cache, v_cache, tables, values


@pytest.mark.parametrize("layout", ["NHD"])
def test_reshape_and_cache_writes_exactly_its_slots(rng, layout):
    k_cache, v_cache, tables, values = _fill(rng, [1, 15, 16, 17, 40])
    keys = np.concatenate([k for k, _ in values])
    vals = np.concatenate([v for _, v in values])
    slots = np.concatenate([p[np.arange(len(k)) // PAGE] * PAGE + np.arange(len(k)) % PAGE
                            for p, (k, _) in zip(tables, values)]).astype(np.int64)
    slots[3] = -1  # a padding token: skipped
    ss.reshape_and_cache(keys, vals, k_cache, v_cache, slots)
    flat_k = k_cache.reshape(PAGES * PAGE, HEADS, DIM)
    flat_v = v_cache.reshape(PAGES * PAGE, HEADS, DIM)
    valid = slots >= 0
    np.testing.assert_array_equal(flat_k[slots[valid]], keys[valid])  # 16-bit cache: exact
    np.testing.assert_array_equal(flat_v[slots[valid]], vals[valid])
    untouched = np.setdiff1d(np.arange(PAGES * PAGE), slots[valid])
    assert np.isnan(flat_k[untouched]).all() and np.isnan(flat_v[untouched]).all()


def test_reshape_and_cache_skips_out_of_range_slots(rng):
    """slot_mapping is read on the device (capturable), so a slot past the cache is skipped there
    like -1: nothing is written. A slot_mapping of another dtype or length is refused."""
    k_cache, v_cache, _, _ = _fill(rng, [1])
    key = np.zeros((2, HEADS, DIM), np.float16)
    ss.reshape_and_cache(key, key, k_cache, v_cache, np.array([PAGES * PAGE, 10**12]))
    assert np.isnan(k_cache).all() and np.isnan(v_cache).all()  # nothing written
    with pytest.raises(ss.SlimserveTypeError, match="slot_mapping has dtype int32"):
        ss.reshape_and_cache(key, key, k_cache, v_cache, np.array([0, 1], np.int32))
    with pytest.raises(ss.SlimserveValueError, match="slot_mapping has shape"):
        ss.reshape_and_cache(key, key, k_cache, v_cache, np.array([0]))


def test_decode_matches_fp64_reference(rng):
    lengths = [1, 15, 16, 17, 40, 130]
    k_cache, v_cache, tables, values = _fill(rng, lengths)
    for pages, (k, v) in zip(tables, values):
        slots = pages[np.arange(len(k)) // PAGE] * PAGE + np.arange(len(k)) % PAGE
        ss.reshape_and_cache(k, v, k_cache, v_cache, slots)
    indptr = np.concatenate([[0], np.cumsum([len(p) for p in tables])]).astype(np.int32)
    indices = np.concatenate(tables).astype(np.int32)
    last = np.array([(n - 1) % PAGE + 1 for n in lengths], np.int32)
    q = rng.standard_normal((len(lengths), QO, DIM)).astype(np.float16)
    wrapper = ss.DecodeWrapper()
    wrapper.plan(indptr, indices, last, QO, HEADS, DIM, PAGE, "float16")
    out = np.full_like(q, np.nan)
    wrapper.run(q, ss.PagedKVCache(k_cache, v_cache), out=out)
    group = QO // HEADS
    for b, (k, v) in enumerate(values):
        for h in range(QO):
            scores = k[:, h // group].astype(np.float64) @ q[b, h].astype(np.float64) / np.sqrt(DIM)
            p = np.exp(scores - scores.max())
            expected = (p / p.sum()) @ v[:, h // group].astype(np.float64)
            np.testing.assert_allclose(out[b, h].astype(np.float64), expected, rtol=1e-2, atol=2e-3)
