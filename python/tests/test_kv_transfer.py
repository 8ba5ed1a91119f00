"""Cache layouts and transfer lists from Python: every paged format and the MLA formats; the
rows applied with NumPy between two caches move exactly the request's filled slots (checked
slot by slot against the source pages); mismatches and bad lists refused naming the field."""
import numpy as np
import pytest

import slimserve as ss
from slimserve.attention import MlaCache, mla_record_bytes
from slimserve.kv_transfer import LAYOUT_BYTES, CacheLayout, coalesce, match_page_runs, transfer_list

NUM_PAGES, PAGE, HEADS, DIM = 24, 16, 2, 64


def paged(rng, dtype, layout, scales, fill=True):
    element = np.uint16 if dtype in ("bfloat16", "float16") else np.uint8
    shape = (NUM_PAGES, PAGE, HEADS, DIM) if layout == "NHD" else (NUM_PAGES, HEADS, PAGE, DIM)
    make = (lambda s, t: rng.integers(0, np.iinfo(t).max, s, dtype=t)) if fill else (lambda s, t: np.full(s, 0xA5, t))
    k, v = make(shape, element), make(shape, element)
    kwargs = {}
    if scales == "per_token":
        scale_shape = shape[:3]
        kwargs = dict(k_token_scales=rng.random(scale_shape, dtype=np.float32) if fill else np.full(scale_shape, -1, np.float32),
                      v_token_scales=rng.random(scale_shape, dtype=np.float32) if fill else np.full(scale_shape, -1, np.float32))
    elif scales == "per_tensor":
        kwargs = dict(k_scale=0.5, v_scale=0.25)
    if dtype == "float16":
        k, v = k.view(np.float16), v.view(np.float16)
    cache = ss.PagedKVCache(k, v, layout=layout, dtype=dtype, **kwargs)
    arrays = [k, v] + ([kwargs["k_token_scales"], kwargs["v_token_scales"]] if scales == "per_token" else [])
    return cache, arrays


def apply(rows):
    import ctypes
    for src, dst, n in rows.tolist():
        ctypes.memmove(dst, src, n)


def slots(array, page, layout):
    """[page_size, heads, ...] view of one page (token-major whatever the layout)."""
    view = array[page] if layout == "NHD" else np.swapaxes(array[page], 0, 1)
    return np.ascontiguousarray(view)


FORMATS = [("bfloat16", "none"), ("float16", "per_tensor"), ("fp8_e4m3", "per_tensor"),
           ("fp8_e4m3", "per_token"), ("fp8_e5m2", "per_token")]


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("dtype,scales", FORMATS)
def test_paged_rows_move_exactly_the_filled_slots(rng, dtype, scales, layout):
    for tokens in (1, PAGE - 1, PAGE, PAGE + 1, PAGE * 9 + 3):
        src, src_arrays = paged(rng, dtype, layout, scales)
        dst, dst_arrays = paged(rng, dtype, layout, scales, fill=False)
        before = [a.copy() for a in dst_arrays]
        count = -(-tokens // PAGE)
        src_pages = rng.permutation(np.arange(1, NUM_PAGES))[:count]
        dst_pages = rng.permutation(np.arange(1, NUM_PAGES))[:count]
        a, b = CacheLayout.of(src), CacheLayout.of(dst)
        rows = transfer_list(a, src_pages.tolist(), b, [(int(p), 7) for p in dst_pages], tokens)
        assert rows.dtype == np.uint64 and rows.shape[1] == 3
        assert int(rows[:, 2].sum()) == a.request_bytes(tokens)
        apply(rows)
        owned = np.zeros((NUM_PAGES, PAGE), bool)
        for i, page in enumerate(dst_pages):
            owned[page, : min(PAGE, tokens - i * PAGE)] = True
        for s_arr, d_arr, old in zip(src_arrays, dst_arrays, before):
            for i, page in enumerate(dst_pages):
                n = min(PAGE, tokens - i * PAGE)
                np.testing.assert_array_equal(slots(d_arr, page, layout)[:n].view(np.uint8),
                                              slots(s_arr, src_pages[i], layout)[:n].view(np.uint8))
            for page in range(NUM_PAGES):  # every slot the request does not own keeps its poison
                keep = ~owned[page]
                np.testing.assert_array_equal(slots(d_arr, page, layout)[keep].view(np.uint8),
                                              slots(old, page, layout)[keep].view(np.uint8))


def test_mla_rows_and_wire_form(rng):
    for dtype, mode in (("bfloat16", "none"), ("fp8_e4m3", "per_token_group"), ("fp8_e4m3", "per_tensor")):
        record = mla_record_bytes(dtype, mode)
        src_pages = rng.integers(0, 255, (12, 64, record), dtype=np.uint8)
        dst_pages = np.full((12, 64, record), 0xA5, np.uint8)
        scale = {"latent_scale": 0.5} if mode == "per_tensor" else {}
        src = CacheLayout.of(MlaCache(src_pages, kv_dtype=dtype, scale_mode=mode, **scale))
        dst = CacheLayout.of(MlaCache(dst_pages, kv_dtype=dtype, scale_mode=mode, **scale))
        assert src.kind == "mla_latent" and src.token_bytes == record
        wire = src.to_bytes()
        assert len(wire) == LAYOUT_BYTES == 136
        assert CacheLayout.from_bytes(wire).to_bytes() == wire
        tokens = 64 * 4 + 9
        rows = transfer_list(src, [3, 4, 5, 9, 1], dst, [2, 3, 4, 10, 11], tokens)
        assert len(rows) == 3  # 3..5 -> 2..4 merge; 9 -> 10 and 1 -> 11 break the run
        apply(rows)
        for i, (s, d) in enumerate(zip([3, 4, 5, 9, 1], [2, 3, 4, 10, 11])):
            n = min(64, tokens - i * 64)
            np.testing.assert_array_equal(dst_pages[d, :n], src_pages[s, :n])
            assert (dst_pages[d, n:] == 0xA5).all()
        assert (dst_pages[[0, 1, 5, 6, 7, 8, 9]] == 0xA5).all()


def test_mismatch_and_bad_lists_are_refused_naming_the_field(rng):
    base, _ = paged(rng, "fp8_e4m3", "NHD", "per_token")
    local = CacheLayout.of(base)
    for other, field in ((paged(rng, "fp8_e5m2", "NHD", "per_token")[0], "dtype"),
                         (paged(rng, "fp8_e4m3", "HND", "per_token")[0], "layout"),
                         (paged(rng, "fp8_e4m3", "NHD", "per_tensor")[0], "scale_mode")):
        with pytest.raises(ss.SlimserveValueError, match=f"mismatch: {field}"):
            local.check_compatible(CacheLayout.of(other))
    k = np.zeros((8, 32, HEADS, DIM), np.uint8)
    wide = ss.PagedKVCache(k, k.copy(), dtype="fp8", k_token_scales=np.ones((8, 32, HEADS), np.float32),
                           v_token_scales=np.ones((8, 32, HEADS), np.float32))
    with pytest.raises(ss.SlimserveValueError, match="mismatch: page_size is 16 here and 32"):
        local.check_compatible(CacheLayout.of(wide))
    k = np.zeros((8, PAGE, HEADS, 128), np.uint8)
    deep = ss.PagedKVCache(k, k.copy(), dtype="fp8", k_scale=1.0, v_scale=1.0)
    with pytest.raises(ss.SlimserveValueError, match="mismatch: scale_mode"):
        local.check_compatible(CacheLayout.of(deep))  # the first field that differs is named
    deep_tokens = ss.PagedKVCache(k, k.copy(), dtype="fp8", k_token_scales=np.ones((8, PAGE, HEADS), np.float32),
                                  v_token_scales=np.ones((8, PAGE, HEADS), np.float32))
    with pytest.raises(ss.SlimserveValueError, match="mismatch: head_dim is 64 here and 128"):
        local.check_compatible(CacheLayout.of(deep_tokens))
    with pytest.raises(ss.SlimserveValueError, match="mismatch: page_size"):
        transfer_list(local, [1], CacheLayout.of(wide), [1], 1)
    with pytest.raises(ss.SlimserveError, match="listed twice"):
        transfer_list(local, [1, 2], local, [3, 3], 20)
    with pytest.raises(ss.SlimserveError, match="guard page"):
        transfer_list(local, [0, 2], local, [3, 4], 20)
    with pytest.raises(ss.SlimserveError, match="need 2 pages"):
        transfer_list(local, [1], local, [3], 20)
    with pytest.raises(ss.SlimserveError):
        CacheLayout.from_bytes(local.to_bytes()[:100])
    corrupt = bytearray(local.to_bytes())
    corrupt[16] = 17  # page_size
    with pytest.raises(ss.SlimserveError, match="page_size 17"):
        CacheLayout.from_bytes(bytes(corrupt))
    with pytest.raises(TypeError):
        CacheLayout.of(np.zeros(4))
    assert len(local.regions()) >= 2  # K and V (separate arrays here), the two scale arrays


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_page_pieces_name_every_full_page_of_every_array(rng, layout):
    """page_pieces (what a transfer engine prepares once per cache): array p's page i starts
    where NumPy has it and is one page long, in transfer-list order; a combined K/V allocation
    has V one page after K with a two-page stride; MLA one array of records."""
    cache, arrays = paged(rng, "fp8_e4m3", layout, "per_token")
    pieces = CacheLayout.of(cache).page_pieces()
    assert len(pieces) == 4
    for (address, size, stride, count), array in zip(pieces, arrays):
        assert (address, size, stride, count) == (array.ctypes.data, array[0].nbytes, array.strides[0], NUM_PAGES)
    # A full request's rows are exactly these pieces, page by page.
    src, dst = [3, 7, 5], [9, 2, 11]
    rows = transfer_list(CacheLayout.of(cache), src, CacheLayout.of(cache), dst, 3 * PAGE)
    want = {(a + s * st, a + d * st, n) for a, n, st, _ in pieces for s, d in zip(src, dst)}
    assert {tuple(r) for r in rows.tolist()} == want
    page_shape = (PAGE, HEADS, DIM) if layout == "NHD" else (HEADS, PAGE, DIM)
    kv = rng.integers(0, 255, (NUM_PAGES, 2) + page_shape, dtype=np.uint8)
    combined = ss.PagedKVCache(kv, None, layout=layout, dtype="fp8_e4m3", k_scale=0.5, v_scale=0.5)
    page = kv[0, 0].nbytes
    assert CacheLayout.of(combined).page_pieces() == [(kv.ctypes.data, page, 2 * page, NUM_PAGES),
                                                      (kv.ctypes.data + page, page, 2 * page, NUM_PAGES)]
    records = rng.integers(0, 255, (8, 64, mla_record_bytes("fp8_e4m3", "per_token_group")), dtype=np.uint8)
    mla = CacheLayout.of(MlaCache(records, kv_dtype="fp8_e4m3", scale_mode="per_token_group"))
    assert mla.page_pieces() == [(records.ctypes.data, records[0].nbytes, records.strides[0], 8)]


def runs_with_holes(rng, lengths, capacity):
    """Page ids: runs of the given lengths (each ascending or descending, as a LIFO free list
    hands them out), a hole of 1-3 pages between runs, the runs in shuffled order; within
    1..capacity - 1."""
    ids, start = [], 1 + int(rng.integers(0, 3))
    for length in lengths:
        run = list(range(start, start + length))
        ids.append(run[::-1] if rng.random() < 0.5 else run)
        start += length + 1 + int(rng.integers(0, 3))
    assert start <= capacity
    return np.array([p for i in rng.permutation(len(ids)) for p in ids[i]], np.int32)


def cache_of(rng, layout, scales, combined, fill=True, num_pages=NUM_PAGES):
    """A FP8 cache and its arrays (K/V as one [num_pages, 2, ...] allocation when combined)."""
    page_shape = (PAGE, HEADS, DIM) if layout == "NHD" else (HEADS, PAGE, DIM)
    make = (lambda shape, t: rng.integers(0, 255, shape, dtype=t)) if fill else (lambda shape, t: np.full(shape, 0xA5, t))
    kwargs = dict(k_scale=0.5, v_scale=0.5)
    scale_arrays = []
    if scales == "per_token":
        shape = (num_pages,) + page_shape[:2]
        scale_arrays = [rng.random(shape, dtype=np.float32) if fill else np.full(shape, -1, np.float32) for _ in range(2)]
        kwargs = dict(k_token_scales=scale_arrays[0], v_token_scales=scale_arrays[1])
    if combined:
        kv = make((num_pages, 2) + page_shape, np.uint8)
        return ss.PagedKVCache(kv, None, layout=layout, dtype="fp8_e4m3", **kwargs), [kv] + scale_arrays
    k, v = make((num_pages,) + page_shape, np.uint8), make((num_pages,) + page_shape, np.uint8)
    return ss.PagedKVCache(k, v, layout=layout, dtype="fp8_e4m3", **kwargs), [k, v] + scale_arrays


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("scales,combined", [("per_tensor", True), ("per_token", True), ("per_token", False)])
def test_coalesced_rows_move_the_same_bytes_in_the_fewest_rows(rng, layout, scales, combined):
    """coalesce(transfer_list(...)) moves every byte the per-array list moves and nothing else
    (both applied to poisoned caches, compared byte for byte), in rows no two of which touch on
    both sides; a run of pages is one row per array that is not adjacent to another (a combined
    K/V allocation: K and V of the whole run in one row)."""
    for tokens in (1, PAGE - 1, PAGE, PAGE + 1, PAGE * 11 + 7, PAGE * 12):
        count = -(-tokens // PAGE)
        lengths = []
        for length in (5, 3, 2, 1, 1):  # runs of 5, 3, 2, 1 and 1 pages, as far as the request goes
            if sum(lengths) < count:
                lengths.append(min(length, count - sum(lengths)))
        src_pages = runs_with_holes(rng, lengths, 40)
        dst_pages = match_page_runs(src_pages, runs_with_holes(rng, lengths[::-1], 40))
        src, _ = cache_of(rng, layout, scales, combined, num_pages=40)
        a = CacheLayout.of(src)
        rows = transfer_list(a, src_pages, a, dst_pages, tokens)
        merged = coalesce(rows)
        assert int(merged[:, 2].sum()) == int(rows[:, 2].sum()) == a.request_bytes(tokens)
        assert len(merged) <= len(rows)
        starts = {(int(s), int(d)) for s, d, _ in merged.tolist()}
        ends = {(int(s + n), int(d + n)) for s, d, n in merged.tolist()}
        assert not starts & ends  # no two rows could be one
        results = []
        for merge in (False, True):  # the same request into two poisoned caches, listed both ways
            dst, dst_arrays = cache_of(rng, layout, scales, combined, fill=False, num_pages=40)
            listed = transfer_list(a, src_pages, CacheLayout.of(dst), dst_pages, tokens)
            apply(coalesce(listed) if merge else listed)
            results.append([x.view(np.uint8).copy() for x in dst_arrays])
        for want, got in zip(*results):
            np.testing.assert_array_equal(got, want)
        if combined and scales == "per_tensor" and layout == "NHD":
            # One row per run, K and V together; a partly filled last page's pieces break its run.
            assert len(merged) == len(lengths) if tokens % PAGE == 0 else len(merged) <= len(lengths) + 2
        if combined and scales == "per_token" and layout == "NHD" and tokens % PAGE == 0:
            assert len(merged) == 3 * len(lengths)  # K/V, K scales, V scales per run


def test_match_page_runs_lands_source_runs_on_reserved_runs(rng):
    src = np.array([11, 10, 9, 4, 5, 15], np.int32)  # runs 9..11 (descending), 4..5, 15
    got = match_page_runs(src, [20, 1, 7, 2, 6, 8])  # free runs 1..2, 6..8, 20
    np.testing.assert_array_equal(got, [8, 7, 6, 1, 2, 20])
    # A source run longer than every free run: the longest first, the rest into the next.
    np.testing.assert_array_equal(match_page_runs([1, 2, 3, 4], [10, 11, 12, 20]), [10, 11, 12, 20])
    for _ in range(20):  # the same run lengths on both sides, anywhere: every run lands whole
        lengths = rng.integers(1, 9, int(rng.integers(1, 12))).tolist()
        capacity = 1 + sum(lengths) + 4 * len(lengths) + 4
        src = runs_with_holes(rng, lengths, capacity)
        reserved = rng.permutation(runs_with_holes(rng, rng.permutation(lengths).tolist(), capacity))
        got = match_page_runs(src, reserved)
        assert sorted(got.tolist()) == sorted(reserved.tolist())  # one to one
        order = np.argsort(src)
        pairs = np.stack([src[order], got[order]], 1)
        breaks = np.count_nonzero((np.diff(pairs[:, 0]) != 1) | (np.diff(pairs[:, 1]) != 1))
        assert breaks + 1 == len(lengths)
    with pytest.raises(ss.SlimserveValueError, match="3 source pages and 2 reserved"):
        match_page_runs([1, 2, 3], [4, 5])
    with pytest.raises(ss.SlimserveValueError, match="twice"):
        match_page_runs([1, 1], [4, 5])
    with pytest.raises(ss.SlimserveValueError, match="rows must be"):
        coalesce(np.zeros((2, 2), np.uint64))
