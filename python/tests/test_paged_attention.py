"""Tensor-core paged attention and MLA through the C ABI (ABI 2), against FP64 NumPy
references built from what the cache holds: CSR vs block table (bit-identical), one combined K/V
allocation, q read in place from a fused QKV output, a strided output, window / soft-cap / sinks,
fused FP8 prefill (the same cache bytes as appending), MLA absorbed decode, and refusals."""
import numpy as np
import pytest

import slimserve as ss

PAGE, HQ, HKV, D, PAGES = 16, 8, 2, 64, 40
KV_LEN = [1, 15, 33, 70]  # decode at 1, a prefill of page - 1, a chunk of page + 1 on a prefix, a long decode
QO_LEN = [1, 15, 17, 1]


def _tables(rng, lengths, num_pages=PAGES, page=PAGE):
    """Shuffled pages with holes; CSR arrays and a block table with garbage past each row."""
    counts = [-(-n // page) for n in lengths]
    free = rng.permutation(np.arange(1, num_pages))[: 2 * sum(counts)][::2]
    pages, start = [], 0
    for c in counts:
        pages.append(free[start : start + c])
        start += c
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    last = np.array([n - (c - 1) * page for n, c in zip(lengths, counts)], np.int32)
    width = max(counts) + 1
    block = np.where(rng.random((len(lengths), width)) < 0.5, 999, -5).astype(np.int32)
    for b, p in enumerate(pages):
        block[b, : len(p)] = p
    return pages, indptr, np.concatenate(pages).astype(np.int32), last, block


def _reference(q, k_seq, v_seq, qo_indptr, sm_scale, window_left=-1, soft_cap=0.0, sinks=None):
    """q [T, HQ, D]; k_seq/v_seq per request [len, HKV, D] (float64). Returns o, lse."""
    o = np.zeros(q.shape, np.float64)
    lse = np.zeros(q.shape[:2], np.float64)
    group = q.shape[1] // k_seq[0].shape[1]
    for b, (k, v) in enumerate(zip(k_seq, v_seq)):
        n = qo_indptr[b + 1] - qo_indptr[b]
        for i in range(n):
            position = len(k) - n + i
            begin = max(0, position - window_left) if window_left >= 0 else 0
            t = qo_indptr[b] + i
            for h in range(q.shape[1]):
                s = k[begin : position + 1, h // group] @ q[t, h].astype(np.float64) * sm_scale
                if soft_cap > 0:
                    s = soft_cap * np.tanh(s / soft_cap)
                m = max(s.max(), sinks[h]) if sinks is not None else s.max()
                w = np.exp(s - m)
                total = w.sum() + (np.exp(sinks[h] - m) if sinks is not None else 0.0)
                o[t, h] = w @ v[begin : position + 1, h // group] / total
                lse[t, h] = m + np.log(total)
    return o, lse


def _check(out, lse, ref_o, ref_lse, v_max, p_rel):
    """Every element: FP16 output rounding, P rounded to the mma type, FP32 noise."""
    out = np.asarray(out, np.float64)
    tolerance = 2.0 ** -11 * np.abs(ref_o) + (2 * p_rel + 2e-5) * v_max + 1e-6
    bad = np.abs(out - ref_o) > tolerance
    assert not bad.any(), f"{bad.sum()} elements out of tolerance, worst {np.abs(out - ref_o).max()}"
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5, atol=1e-3)


def _fp16_cache(rng, pages):
    k = rng.uniform(-1, 1, (PAGES, PAGE, HKV, D)).astype(np.float16)
    v = rng.uniform(-1, 1, (PAGES, PAGE, HKV, D)).astype(np.float16)
    k_seq = [k[p].reshape(-1, HKV, D)[:n].astype(np.float64) for p, n in zip(pages, KV_LEN)]
    v_seq = [v[p].reshape(-1, HKV, D)[:n].astype(np.float64) for p, n in zip(pages, KV_LEN)]
    return k, v, k_seq, v_seq


def test_block_table_combined_kv_strided_q_matches_csr_and_reference(rng):
    pages, indptr, indices, last, block = _tables(rng, KV_LEN)
    k, v, k_seq, v_seq = _fp16_cache(rng, pages)
    qo_indptr = np.concatenate([[0], np.cumsum(QO_LEN)]).astype(np.int32)
    tokens = int(qo_indptr[-1])
    qkv = rng.uniform(-1, 1, (tokens, (HQ + 2 * HKV) * D)).astype(np.float16)
    q_view = qkv[:, : HQ * D].reshape(tokens, HQ, D)  # read in place: token stride (HQ + 2 HKV) D

    csr = ss.PagedAttentionWrapper()
    csr.plan(qo_indptr, HQ, HKV, D, PAGE, kv_indptr=indptr, kv_indices=indices, last_page_len=last,
             kv_dtype="float16", num_sms=4, min_chunk_tokens=16)
    assert csr.info["kernel"] == "tensor_core" and csr.info["reason"]
    out = np.full((tokens, HQ, D), np.nan, np.float16)
    lse = np.full((tokens, HQ), np.nan, np.float32)
    csr.run(np.ascontiguousarray(q_view), ss.PagedKVCache(k, v, dtype="float16"), out=out, lse=lse)
    ref_o, ref_lse = _reference(q_view, k_seq, v_seq, qo_indptr, 1 / np.sqrt(D))
    _check(out, lse, ref_o, ref_lse, 1.0, 2.0 ** -12)

    combined = np.stack([k, v], axis=1)  # [pages, 2, page, H, D]
    padded = np.full((tokens, HQ * D + 8), np.nan, np.float16)
    out_view = padded[:, : HQ * D].reshape(tokens, HQ, D)
    lse_block = np.full((tokens, HQ), np.nan, np.float32)
    blocked = ss.PagedAttentionWrapper()
    blocked.plan(qo_indptr, HQ, HKV, D, PAGE, block_table=block, seq_lens=np.array(KV_LEN, np.int32),
                 kv_dtype="float16", num_sms=4, min_chunk_tokens=16)
    blocked.run(q_view, ss.PagedKVCache(combined, None, dtype="float16"), out=out_view, lse=lse_block)
    np.testing.assert_array_equal(out_view.view(np.uint16), out.view(np.uint16))  # bit-identical
    np.testing.assert_array_equal(lse_block, lse)
    assert np.isnan(padded[:, HQ * D :]).all()  # the padding is never written


def test_window_soft_cap_sinks_and_scale(rng):
    pages, indptr, indices, last, block = _tables(rng, KV_LEN)
    k, v, k_seq, v_seq = _fp16_cache(rng, pages)
    qo_indptr = np.concatenate([[0], np.cumsum(QO_LEN)]).astype(np.int32)
    q = rng.uniform(-1, 1, (int(qo_indptr[-1]), HQ, D)).astype(np.float16)
    sinks = rng.uniform(-2, 2, HQ).astype(np.float32)
    wrapper = ss.PagedAttentionWrapper()
    wrapper.plan(qo_indptr, HQ, HKV, D, PAGE, block_table=block, seq_lens=np.array(KV_LEN, np.int32),
                 kv_dtype="float16")
    out = np.full_like(q, np.nan)
    lse = np.full(q.shape[:2], np.nan, np.float32)
    wrapper.run(q, ss.PagedKVCache(k, v, dtype="float16"), out=out, lse=lse, sm_scale=0.09,
                sliding_window=20, logit_soft_cap=3.0, sinks=sinks)
    ref_o, ref_lse = _reference(q, k_seq, v_seq, qo_indptr, np.float64(np.float32(0.09)), window_left=19,
                                soft_cap=3.0, sinks=sinks.astype(np.float64))
    _check(out, lse, ref_o, ref_lse, 1.0, 2.0 ** -12)


def _e4m3_table():
    codes = np.arange(256)
    sign = np.where(codes >> 7, -1.0, 1.0)
    exponent, mantissa = (codes >> 3) & 15, codes & 7
    magnitude = np.where(exponent == 0, mantissa * 2.0 ** -9, (1 + mantissa / 8.0) * 2.0 ** (exponent - 7.0))
    magnitude[(exponent == 15) & (mantissa == 7)] = np.nan
    return sign * magnitude


def test_fused_fp8_prefill_writes_append_bytes_and_matches_reference(rng):
    prefix, chunk = [0, PAGE + 5, PAGE], [PAGE - 1, PAGE + 1, 40]
    lengths = [p + c for p, c in zip(prefix, chunk)]
    pages, indptr, indices, last, _ = _tables(rng, lengths)
    scale = np.float32(1 / 64)
    k_cache = np.full((PAGES, PAGE, HKV, D), 0x3C, np.uint8)
    v_cache = k_cache.copy()
    slots_of = [p[np.arange(n) // PAGE] * PAGE + np.arange(n) % PAGE for p, n in zip(pages, lengths)]
    prefix_k = rng.uniform(-1, 1, (sum(prefix), HKV, D)).astype(np.float16)
    prefix_v = rng.uniform(-1, 1, (sum(prefix), HKV, D)).astype(np.float16)
    prefix_slots = np.concatenate([s[:p] for s, p in zip(slots_of, prefix)]).astype(np.int64)
    ss.reshape_and_cache(prefix_k, prefix_v, k_cache, v_cache, prefix_slots, "fp8_e4m3", float(scale), float(scale))
    k_separate, v_separate = k_cache.copy(), v_cache.copy()

    qo_indptr = np.concatenate([[0], np.cumsum(chunk)]).astype(np.int32)
    tokens = int(qo_indptr[-1])
    qkv = rng.uniform(-1, 1, (tokens, (HQ + 2 * HKV) * D)).astype(np.float16)
    q = qkv[:, : HQ * D].reshape(tokens, HQ, D)
    chunk_k = qkv[:, HQ * D : (HQ + HKV) * D].reshape(tokens, HKV, D)
    chunk_v = qkv[:, (HQ + HKV) * D :].reshape(tokens, HKV, D)
    wrapper = ss.PagedAttentionWrapper()
    wrapper.plan(qo_indptr, HQ, HKV, D, PAGE, kv_indptr=indptr, kv_indices=indices, last_page_len=last,
                 kv_dtype="fp8_e4m3", q_dtype="float16")
    out = np.full((tokens, HQ, D), np.nan, np.float16)
    lse = np.full((tokens, HQ), np.nan, np.float32)
    cache = ss.PagedKVCache(k_cache, v_cache, dtype="fp8_e4m3", k_scale=float(scale), v_scale=float(scale))
    wrapper.run(q, cache, out=out, lse=lse, chunk_k=chunk_k, chunk_v=chunk_v)

    chunk_slots = np.concatenate([s[p:] for s, p in zip(slots_of, prefix)]).astype(np.int64)
    ss.reshape_and_cache(np.ascontiguousarray(chunk_k), np.ascontiguousarray(chunk_v), k_separate, v_separate,
                         chunk_slots, "fp8_e4m3", float(scale), float(scale))
    np.testing.assert_array_equal(k_cache, k_separate)  # the fused write is the append's bytes
    np.testing.assert_array_equal(v_cache, v_separate)

    table = _e4m3_table()
    k_seq, v_seq = [], []
    for b, (slots, p) in enumerate(zip(slots_of, prefix)):
        rows = slice(qo_indptr[b], qo_indptr[b + 1])
        k_seq.append(np.concatenate([table[k_cache.reshape(-1, HKV, D)[slots[:p]]] * scale,
                                     chunk_k[rows].astype(np.float64)]))
        v_seq.append(np.concatenate([table[v_cache.reshape(-1, HKV, D)[slots[:p]]] * scale,
                                     chunk_v[rows].astype(np.float64)]))
    ref_o, ref_lse = _reference(q, k_seq, v_seq, qo_indptr, 1 / np.sqrt(D))
    _check(out, lse, ref_o, ref_lse, 1.0, 2.0 ** -12)


def test_refusals_name_the_problem(rng):
    pages, indptr, indices, last, block = _tables(rng, KV_LEN)
    k, v, _, _ = _fp16_cache(rng, pages)
    qo_indptr = np.concatenate([[0], np.cumsum(QO_LEN)]).astype(np.int32)
    tokens = int(qo_indptr[-1])
    cache = ss.PagedKVCache(k, v, dtype="float16")
    wrapper = ss.PagedAttentionWrapper()
    with pytest.raises(ss.SlimserveError, match="workspace") as error:
        wrapper.plan(qo_indptr, HQ, HKV, D, PAGE, block_table=block, seq_lens=np.array(KV_LEN, np.int32),
                     kv_dtype="float16", workspace=ss.DeviceArray.empty(64))
    assert error.value.code == "resource_exhausted"
    with pytest.raises(ss.SlimserveError, match="head_dim 80"):
        wrapper.plan(qo_indptr, HQ, HKV, 80, PAGE, block_table=block, seq_lens=np.array(KV_LEN, np.int32),
                     kv_dtype="float16")
    wrapper.plan(qo_indptr, HQ, HKV, D, PAGE, block_table=block, seq_lens=np.array(KV_LEN, np.int32),
                 kv_dtype="float16")
    padded = rng.uniform(-1, 1, (tokens, HQ * D + 4)).astype(np.float16)  # a stride of HQ D + 4: not 16 B
    out = np.full((tokens, HQ, D), np.nan, np.float16)
    with pytest.raises(ss.SlimserveError, match="stride") as error:
        wrapper.run(padded[:, : HQ * D].reshape(tokens, HQ, D), cache, out=out)
    assert error.value.code == "invalid_argument"
    with pytest.raises(ss.SlimserveError, match="sliding_window"):
        wrapper.run(np.zeros((tokens, HQ, D), np.float16), cache, out=out, sliding_window=-2)
    assert np.isnan(out).all()  # nothing written by a refused call
    tags = np.ones(block.shape, np.uint32)
    ss.validate_block_table(block, KV_LEN, tags, PAGES, PAGE)
    block[3, 1] = PAGES + 9
    with pytest.raises(ss.SlimserveError, match=str(PAGES + 9)) as error:
        ss.validate_block_table(block, KV_LEN, tags, PAGES, PAGE)
    assert error.value.code == "out_of_range"


def _bf16(x):
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def _from_bf16(bits):
    return (np.asarray(bits, np.uint32) << 16).view(np.float32).astype(np.float64)


def test_mla_absorbed_decode_matches_reference(rng):
    lengths, heads, query_tokens, page = [2, 17, 45], 8, 2, 16
    pages, indptr, indices, last, block = _tables(rng, lengths, num_pages=16, page=page)
    record = ss.mla_record_bytes("bfloat16", "none")
    assert record == 1152
    cache_pages = np.zeros((16, page, record), np.uint8)
    cache = ss.MlaCache(cache_pages)
    latent = _bf16(rng.uniform(-3, 3, (sum(lengths), 512)))
    rope = _bf16(rng.uniform(-1, 1, (sum(lengths), 64)))
    append_indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    ss.mla_append(cache, indptr, indices, last, latent, rope, append_indptr=append_indptr, dtype="bfloat16")
    q = _bf16(rng.uniform(-1, 1, (len(lengths) * query_tokens, heads, 576)))
    wrapper = ss.MlaDecodeWrapper()
    wrapper.plan(block, lengths, heads, page, query_tokens=query_tokens, num_sms=4)
    out = np.full((len(lengths) * query_tokens, heads, 512), 0x7FC0, np.uint16)
    lse = np.full((len(lengths) * query_tokens, heads), np.nan, np.float32)
    sm_scale = 1 / np.sqrt(192)
    wrapper.run(q, cache, float(sm_scale), out=out, lse=lse)
    flat = cache_pages.reshape(-1, record)
    for b, (p, n) in enumerate(zip(pages, lengths)):
        slots = p[np.arange(n) // page] * page + np.arange(n) % page
        keys = _from_bf16(flat[slots].view(np.uint16)[:, :576])
        np.testing.assert_array_equal(keys[:, :512], _from_bf16(latent[append_indptr[b] : append_indptr[b + 1]]))
        for t in range(query_tokens):
            row = b * query_tokens + t
            visible = keys[: n - query_tokens + t + 1]
            for h in range(heads):
                s = visible @ _from_bf16(q[row, h]) * np.float64(np.float32(sm_scale))
                w = np.exp(s - s.max())
                want = w @ visible[:, :512] / w.sum()
                got = _from_bf16(out[row, h])
                tolerance = 6e-3 * np.abs(keys[:, :512]).max() + 8e-3 * np.abs(want) + 1e-6
                assert (np.abs(got - want) <= tolerance).all(), (b, t, h, np.abs(got - want).max())
                assert abs(lse[row, h] - (s.max() + np.log(w.sum()))) <= 2e-3 + 1e-4 * abs(s.max())


_E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])


def test_mla_nvfp4_latent_append_and_decode_match_the_format(rng):
    """An NVFP4 latent cache (416-byte records: 256 code bytes, 32 E4M3 block scales, BF16
    rope): the append's codes decode, by the format's definition, to within a block step of
    the input; the decode matches FP64 over the stored values."""
    lengths, heads, query_tokens, page = [1, 17, 40], 16, 1, 16
    pages, indptr, indices, last, block = _tables(rng, lengths, num_pages=16, page=page)
    record = ss.mla_record_bytes("nvfp4", "per_tensor")
    assert record == 416 and ss.mla_record_bytes("nvfp4", "per_token_group") == 0
    tensor_scale = np.float32(0.01)
    cache_pages = np.full((16, page, record), 0xFF, np.uint8)
    cache = ss.MlaCache(cache_pages, kv_dtype="nvfp4", scale_mode="per_tensor", latent_scale=float(tensor_scale))
    latent = _bf16(rng.standard_normal((sum(lengths), 512)) * np.where(rng.random(512) < 0.05, 8.0, 1.0))
    latent[3, 7] = _bf16(40.0)  # past 6 x 448 x tensor scale = 26.88: saturates
    rope = _bf16(rng.uniform(-1, 1, (sum(lengths), 64)))
    append_indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    ss.mla_append(cache, indptr, indices, last, latent, rope, append_indptr=append_indptr, dtype="bfloat16")
    e4m3 = _e4m3_table()
    flat = cache_pages.reshape(-1, record)
    stored = []  # per request: [n, 576] as the format defines the cached values
    for b, (p, n) in enumerate(zip(pages, lengths)):
        rows = flat[p[np.arange(n) // page] * page + np.arange(n) % page]
        codes = np.stack([rows[:, :256] & 15, rows[:, :256] >> 4], axis=-1).reshape(n, 512)
        block_scales = e4m3[rows[:, 256:288]]
        values = _E2M1[codes] * np.repeat(block_scales, 16, axis=1) * np.float64(tensor_scale)
        x = _from_bf16(latent[append_indptr[b] : append_indptr[b + 1]])
        # Each value within half a code gap of its input clipped to the largest value the
        # tensor scale allows, 6 x 448 x tensor scale (gaps are at most 2 x block scale x tensor
        # scale, between 4 and 6; a tie such as 5 goes to 4, even); 1e-6 for the rounding of the
        # float32 tensor scale. Inputs past that largest value saturate to it exactly.
        largest = 6 * 448 * np.float64(tensor_scale)
        step = np.repeat(block_scales, 16, axis=1) * np.float64(tensor_scale)
        assert (np.abs(values - np.clip(x, -largest, largest)) <= step * (1 + 1e-6)).all()
        np.testing.assert_array_equal(values[np.abs(x) > largest], np.sign(x[np.abs(x) > largest]) * largest)
        np.testing.assert_array_equal(rows[:, 288:].view(np.uint16), rope[append_indptr[b] : append_indptr[b + 1]])
        stored.append(np.concatenate([values, _from_bf16(rope[append_indptr[b] : append_indptr[b + 1]])], axis=1))
    q = _bf16(rng.uniform(-1, 1, (len(lengths) * query_tokens, heads, 576)))
    wrapper = ss.MlaDecodeWrapper()
    wrapper.plan(block, lengths, heads, page, query_tokens=query_tokens, kv_dtype="nvfp4", scale_mode="per_tensor",
                 num_sms=4)
    out = np.full((len(lengths) * query_tokens, heads, 512), 0x7FC0, np.uint16)
    lse = np.full((len(lengths) * query_tokens, heads), np.nan, np.float32)
    sm_scale = 1 / np.sqrt(192)
    wrapper.run(q, cache, float(sm_scale), out=out, lse=lse)
    for b, keys in enumerate(stored):
        for h in range(heads):
            s = keys @ _from_bf16(q[b, h]) * np.float64(np.float32(sm_scale))
            w = np.exp(s - s.max())
            want = w @ keys[:, :512] / w.sum()
            tolerance = 3e-3 * np.abs(keys[:, :512]).max() + 8e-3 * np.abs(want) + 1e-6
            assert (np.abs(_from_bf16(out[b, h]) - want) <= tolerance).all(), (b, h)
            assert abs(lse[b, h] - (s.max() + np.log(w.sum()))) <= 2e-3 + 1e-4 * abs(s.max())


def test_stale_page_aborts_exactly_its_request(rng):
    pool, tags = ss.PagePool(PAGES), ss.DeviceTags(PAGES)
    handles = pool.allocate(PAGES - 1)
    order = rng.permutation(len(handles))
    counts = [-(-n // PAGE) for n in KV_LEN]
    width = max(counts) + 1
    block = np.full((len(KV_LEN), width), 999, np.int32)
    block_tags = np.zeros(block.shape, np.uint32)
    at = 0
    for b, c in enumerate(counts):
        for i in range(c):
            page_id, tag = handles[order[at]]
            block[b, i], block_tags[b, i] = page_id, tag
            at += 2  # holes
    pages = [block[b, :c] for b, c in enumerate(counts)]
    k, v, k_seq, v_seq = _fp16_cache(rng, pages)
    stale = block[2, 1], block_tags[2, 1]
    pool.release([stale])  # request 2's second page goes back to the pool: its tag moves on
    pool.allocate(1)
    tags.sync(pool)
    qo_indptr = np.concatenate([[0], np.cumsum(QO_LEN)]).astype(np.int32)
    q = rng.uniform(-1, 1, (int(qo_indptr[-1]), HQ, D)).astype(np.float16)
    wrapper = ss.PagedAttentionWrapper()
    wrapper.plan(qo_indptr, HQ, HKV, D, PAGE, block_table=block, seq_lens=np.array(KV_LEN, np.int32),
                 expected_tags=block_tags, kv_dtype="float16")
    statuses = ss.RequestStatuses(len(KV_LEN))
    wrapper.check_tags(tags, statuses)
    assert statuses.to_host(len(KV_LEN)) == [("ok", -1), ("ok", -1), ("stale_tag", 1), ("ok", -1)]
    out = np.full_like(q, 0)
    lse = np.zeros(q.shape[:2], np.float32)
    wrapper.run(q, ss.PagedKVCache(k, v, dtype="float16"), out=out, lse=lse, statuses=statuses)
    ref_o, ref_lse = _reference(q, k_seq, v_seq, qo_indptr, 1 / np.sqrt(D))
    aborted = slice(qo_indptr[2], qo_indptr[3])
    assert np.isnan(out[aborted]).all() and (lse[aborted] == -np.inf).all()
    keep = np.ones(len(q), bool)
    keep[aborted] = False
    _check(out[keep], lse[keep], ref_o[keep], ref_lse[keep], 1.0, 2.0 ** -12)
