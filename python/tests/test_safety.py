"""Every Python entry refuses a wrong argument before anything launches, naming it, with one
exception family (SlimserveError, whose SlimserveValueError / SlimserveTypeError are also
ValueError / TypeError). Each test here is a failure an engine developer hit on the earlier
binding (a crash, a silent wrong answer or a stray exception type), now refused or fixed."""
import ctypes

import numpy as np
import pytest

import slimserve as ss
from slimserve import _capi

PAGE, HKV, D = 16, 2, 64


def _bf16(rng, shape):
    """BF16 bits (uint16) of uniform values, and those values as float64."""
    bits = (rng.uniform(-1, 1, shape).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return bits, (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def _page_table(pages_per_request, tokens):
    pool = ss.PagePool(32)
    table = ss.PageTable(4, 64, PAGE, 32)
    requests = [(pool.allocate(n), t) for n, t in zip(pages_per_request, tokens)]
    return pool, table, requests


def test_errors_are_one_family_with_codes_and_builtin_bases():
    assert issubclass(ss.SlimserveValueError, ss.SlimserveError)
    assert issubclass(ss.SlimserveValueError, ValueError)
    assert issubclass(ss.SlimserveTypeError, TypeError)
    pool = ss.PagePool(4)
    with pytest.raises(ss.SlimserveValueError) as error:
        pool.allocate(-1)  # was "internal error: unexpected exception: cannot create std::vector"
    assert error.value.code == "invalid_argument" and "-1" in str(error.value)
    with pytest.raises(ss.SlimserveError) as error:
        pool.allocate(10**12)
    assert error.value.code == "resource_exhausted" and pool.available == 3
    with pytest.raises(ss.SlimserveError) as error:
        pool.validate((2, 12345))
    # The message does not repeat the code ("stale_handle: stale handle: ...").
    assert not str(error.value).startswith(("stale", "invalid", "failed")), str(error.value)


def test_double_device_free_is_refused_not_an_abort():
    ptr = ctypes.c_void_p()
    assert ss._lib.slimserve_device_alloc(64, ctypes.byref(ptr)) == 0
    assert ss._lib.slimserve_device_free(ptr) == 0
    status = ss._lib.slimserve_device_free(ptr)  # glibc aborted the process here before
    assert status == _capi.STATUS_CODES["failed_precondition"]
    assert b"not a live device allocation" in ss._lib.slimserve_last_error()


def test_decode_run_checks_q_against_the_plan(rng):
    k = np.zeros((8, PAGE, HKV, D), np.float16)
    cache = ss.PagedKVCache(k, k.copy())
    wrapper = ss.DecodeWrapper()
    wrapper.plan(np.array([0, 1], np.int32), np.array([3], np.int32), np.array([5], np.int32), 8, HKV, D, PAGE,
                 "float16")
    with pytest.raises(ss.SlimserveValueError, match="q has shape"):
        wrapper.run(np.zeros((1, 1, 128), np.float16), cache)  # crashed the process before
    with pytest.raises(ss.SlimserveTypeError, match="q has dtype"):
        wrapper.run(np.zeros((1, 8, D), np.float32), cache)
    with pytest.raises(ss.SlimserveValueError, match="out has shape"):
        wrapper.run(np.zeros((1, 8, D), np.float16), cache, out=np.zeros((1, 8, 32), np.float16))
    other = ss.PagedKVCache(np.zeros((8, PAGE, 1, D), np.float16), np.zeros((8, PAGE, 1, D), np.float16))
    with pytest.raises(ss.SlimserveValueError, match="does not match the plan"):
        wrapper.run(np.zeros((1, 8, D), np.float16), other)


def test_decode_plan_checks_lengths_and_run_checks_ids():
    wrapper = ss.DecodeWrapper()
    with pytest.raises(ss.SlimserveValueError, match="indices has 1 entries"):
        wrapper.plan([0, 3], [1], [5], 8, HKV, D, PAGE, "float16")  # read past indices before
    with pytest.raises(ss.SlimserveValueError, match="last_page_len"):
        wrapper.plan([0, 1], [1], [PAGE + 1], 8, HKV, D, PAGE, "float16")
    wrapper.plan([0, 1], [9], [5], 8, HKV, D, PAGE, "float16")
    small = np.zeros((4, PAGE, HKV, D), np.float16)
    with pytest.raises(ss.SlimserveValueError, match="page id 9") as error:
        wrapper.run(np.zeros((1, 8, D), np.float16), ss.PagedKVCache(small, small.copy()))
    assert error.value.code == "out_of_range"


def test_append_kv_checks_rows_against_the_cache(rng):
    pool, table, requests = _page_table([1], [3])
    built = table.build(requests)
    k = np.zeros((32, PAGE, HKV, D), np.float16)
    cache = ss.PagedKVCache(k, k.copy())
    good = np.zeros((3, HKV, D), np.float16)
    with pytest.raises(ss.SlimserveValueError, match="k has shape"):
        ss.append_kv(cache, built, np.zeros((3, 1, D), np.float16), good, append_indptr=[0, 3])
    with pytest.raises(ss.SlimserveValueError, match="v has shape"):
        ss.append_kv(cache, built, good, np.zeros((3, HKV, 32), np.float16), append_indptr=[0, 3])
    with pytest.raises(ss.SlimserveValueError, match="append_indptr has 3 entries"):
        ss.append_kv(cache, built, good, good, append_indptr=[0, 1, 3])
    with pytest.raises(ss.SlimserveValueError, match="token_position has 2 entries"):
        ss.append_kv(cache, built, good, good, token_request=[0, 0, 0], token_position=[0, 1])


def test_append_into_a_combined_cache_lands_in_its_page(rng):
    """[pages, 2, page, H, D]: page 3's rows went into page 1's V half and page 2's K half."""
    pool = ss.PagePool(8)
    pages = pool.allocate(3)  # ids 1, 2, 3 in some order
    table = ss.PageTable(1, 8, PAGE, 8)
    built = table.build([([pages[2]], 5)])
    target = pages[2][0]
    kv = np.full((8, 2, PAGE, HKV, D), 0x7FFF, np.uint16)  # poison (BF16 NaN bits)
    cache = ss.PagedKVCache(kv, None, dtype="bfloat16")
    k_bits, _ = _bf16(rng, (5, HKV, D))
    v_bits, _ = _bf16(rng, (5, HKV, D))
    ss.append_kv(cache, built, k_bits, v_bits, append_indptr=[0, 5], dtype="bfloat16")
    expected = np.full_like(kv, 0x7FFF)
    expected[target, 0, :5] = k_bits
    expected[target, 1, :5] = v_bits
    np.testing.assert_array_equal(kv, expected)
    with pytest.raises(ss.SlimserveValueError, match="packed") as error:
        wrapper = ss.DecodeWrapper()
        wrapper.plan([0, 1], [target], [5], 4, HKV, D, PAGE, "bfloat16")
        wrapper.run(np.zeros((1, 4, D), np.uint16), cache, dtype="bfloat16")  # read 0.0 before
    assert error.value.code == "unsupported"


def test_built_table_keeps_its_storage_and_goes_stale_on_the_next_build():
    pool, table, requests = _page_table([1, 2], [4, 20])
    first = table.build(requests)
    second = table.build(requests[:1])
    with pytest.raises(ss.SlimserveError, match="stale") as error:
        first.device  # noqa: B018 (ran on the newer table's arrays before)
    assert error.value.code == "failed_precondition"
    k = np.zeros((32, PAGE, HKV, D), np.float16)
    cache = ss.PagedKVCache(k, k.copy())
    with pytest.raises(ss.SlimserveError, match="stale"):
        ss.append_kv(cache, first, np.ones((4, HKV, D), np.float16), np.ones((4, HKV, D), np.float16),
                     append_indptr=[0, 4, 4])
    del table  # the BuiltTable holds it: its arrays are not freed under it
    rows = np.full((4, HKV, D), 0.5, np.float16)
    ss.append_kv(cache, second, rows, rows, append_indptr=[0, 4])
    page = requests[0][0][0][0]
    assert np.all(k[page, :4] == 0.5) and np.all(k[page, 4:] == 0)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0.0, -0.5, 1e39])  # 1e39: finite, but inf as float32
def test_bad_scales_are_refused(bad):
    pages = np.zeros((4, PAGE, HKV, D), np.uint8)
    with pytest.raises(ss.SlimserveValueError, match="k_scale must be finite and > 0"):
        ss.PagedKVCache(pages, pages.copy(), dtype="fp8", k_scale=bad, v_scale=1.0)
    with pytest.raises(ss.SlimserveValueError, match="v_scale must be finite and > 0"):
        ss.PagedKVCache(pages, pages.copy(), dtype="fp8", k_scale=1.0, v_scale=np.array([bad], np.float32))


def test_nvfp4_tensor_scale_domain():
    """NVFP4 tensor scales above FLT_MAX / 2^14 are refused (the kernels would read them as
    invalid: NaN blocks and rows); the largest in the domain is taken."""
    u8 = np.zeros((4, PAGE, HKV, D * 9 // 16), np.uint8)
    largest = float(np.float32(np.finfo(np.float32).max) / np.float32(16384))
    above = float(np.nextafter(np.float32(largest), np.float32(np.inf)))
    ss.PagedKVCache(u8, u8.copy(), dtype="nvfp4", k_scale=largest, v_scale=1.0)
    with pytest.raises(ss.SlimserveValueError, match="k_scale .* above the nvfp4 tensor scale"):
        ss.PagedKVCache(u8, u8.copy(), dtype="nvfp4", k_scale=above, v_scale=1.0)
    with pytest.raises(ss.SlimserveValueError, match="v_scale .* above the nvfp4 tensor scale"):
        ss.PagedKVCache(u8, u8.copy(), dtype="nvfp4", k_scale=1.0, v_scale=np.array([above], np.float32))
    with pytest.raises(ss.SlimserveValueError, match="fp8_scale"):
        ss.nvfp4_tensor_scale(above * 6.0 * 2.0)


def test_dtype_contradictions_and_engine_names():
    fp16 = np.zeros((4, PAGE, HKV, D), np.float16)
    with pytest.raises(ss.SlimserveTypeError, match="cannot hold fp8_e4m3"):
        ss.PagedKVCache(fp16, fp16.copy(), dtype="fp8_e4m3", k_scale=1.0, v_scale=1.0)
    u8 = np.zeros((4, PAGE, HKV, D), np.uint8)
    with pytest.raises(ss.SlimserveTypeError, match="auto"):
        ss.PagedKVCache(u8, u8.copy(), k_scale=1.0, v_scale=1.0)
    with pytest.raises(ss.SlimserveTypeError, match="needs its scales"):
        ss.PagedKVCache(u8, u8.copy(), dtype="fp8")
    with pytest.raises(ss.SlimserveValueError, match="not a KV cache dtype"):
        ss.PagedKVCache(u8, u8.copy(), dtype="int4")
    for name, code in (("fp8", 2), ("fp8_e4m3", 2), ("fp8_e5m2", 3)):
        assert ss.PagedKVCache(u8, u8.copy(), dtype=name, k_scale=0.5, v_scale=2.0).view.dtype == code
    assert ss.kv_dtype_name("auto", "float16") == "float16"


def test_nvfp4_by_name_byte_pages_and_clear_refusals():
    """NVFP4 pages are uint8 head vectors of 9 * D / 16 bytes (codes, then E4M3 block scales)
    with a per-tensor scale; append_kv writes them, paged attention plans them, the CUDA-core
    decode (no NVFP4 path) refuses them by name."""
    assert ss.kv_dtype_name("nvfp4") == "nvfp4" and ss.KV_DTYPES["nvfp4"] == 4
    u8 = np.zeros((32, PAGE, HKV, 9 * D // 16), np.uint8)
    cache = ss.PagedKVCache(u8, u8.copy(), dtype="nvfp4", k_scale=1.0, v_scale=1.0)
    assert (cache.dtype, cache.view.dtype, cache.view.head_dim) == ("nvfp4", 4, D)
    with pytest.raises(ss.SlimserveTypeError, match="needs its scales"):
        ss.PagedKVCache(u8, u8.copy(), dtype="nvfp4")
    with pytest.raises(ss.SlimserveValueError, match="head vector's bytes"):
        short = np.zeros((32, PAGE, HKV, 35), np.uint8)
        ss.PagedKVCache(short, short.copy(), dtype="nvfp4", k_scale=1.0, v_scale=1.0)
    with pytest.raises(ss.SlimserveValueError, match="per-token scales are for FP8"):
        ss.PagedKVCache(u8, u8.copy(), dtype="nvfp4", k_token_scales=np.ones((32, PAGE, HKV), np.float32),
                        v_token_scales=np.ones((32, PAGE, HKV), np.float32))
    # The CUDA-core decode takes NVFP4 pages (its plan succeeds; values: tests/attention).
    ss.DecodeWrapper().plan([0, 1], [3], [5], 8, HKV, D, PAGE, "nvfp4")
    # The tensor-core paged attention takes NVFP4 (its plan succeeds), its fused prefill too
    # (tests/attention/fused_prefill_nvfp4_test.cpp).
    ss.PagedAttentionWrapper().plan([0, 1], 8, HKV, D, PAGE, kv_indptr=[0, 1], kv_indices=[3],
                                    last_page_len=[5], kv_dtype="nvfp4", q_dtype="float16")
    # append_kv writes NVFP4 pages: zeros become zero codes and zero block scales, in exactly
    # the 3 tokens' head vectors (the rest of the poisoned pages stays).
    k_pages, v_pages = np.full_like(u8, 0xAA), np.full_like(u8, 0xAA)
    cache = ss.PagedKVCache(k_pages, v_pages, dtype="nvfp4", k_scale=1.0, v_scale=1.0)
    pool, table, requests = _page_table([1], [3])
    good = np.zeros((3, HKV, D), np.float16)
    ss.append_kv(cache, table.build(requests), good, good, append_indptr=[0, 3])
    for pages in (k_pages, v_pages):
        assert int((pages == 0).sum()) == 3 * HKV * (9 * D // 16)
        assert int((pages == 0xAA).sum()) == pages.size - 3 * HKV * (9 * D // 16)


def test_torch_names_and_fp8_tensors():
    torch = pytest.importorskip("torch")
    pages = torch.zeros((4, PAGE, HKV, D), dtype=torch.float8_e4m3fn)
    cache = ss.PagedKVCache(pages, pages.clone(), dtype="auto", k_scale=0.25, v_scale=torch.tensor([0.5]))
    assert cache.dtype == "fp8_e4m3"
    assert ss.kv_dtype_name(torch.float8_e5m2) == "fp8_e5m2"
    with pytest.raises(ss.SlimserveTypeError, match="cannot hold fp8_e5m2"):
        ss.PagedKVCache(pages, pages.clone(), dtype="fp8_e5m2", k_scale=1.0, v_scale=1.0)


def test_page_size_one_is_refused_with_the_nearest_size():
    """SGLang's token pool: the kernels read pages in 16-token tiles (docs/embedding.md)."""
    with pytest.raises(ss.SlimserveError, match="page_size") as error:
        w = ss.PagedAttentionWrapper()
        w.plan([0, 1], 4, 2, D, 1, block_table=np.array([[1, 2, 3]], np.int32), seq_lens=[3])
    assert error.value.code in ("invalid_argument", "unsupported")


def test_append_reads_strided_rows_in_place_and_refuses_bad_strides(rng):
    """vLLM hands key / value as slices of its fused [tokens, q | k | v] output: the append
    reads them in place (same bytes as packed rows, the NaN between rows never read); a row
    stride that is not a multiple of 8, or heads that are not contiguous, is refused by name
    before anything is written."""
    tokens, row = 5, HKV * D
    k_bits = rng.standard_normal((tokens, HKV, D)).astype(np.float16)
    v_bits = rng.standard_normal((tokens, HKV, D)).astype(np.float16)
    fused = np.full((tokens, 3 * row + 8), np.nan, np.float16)  # q | k | v | pad, NaN elsewhere
    fused[:, row:2 * row] = k_bits.reshape(tokens, row)
    fused[:, 2 * row:3 * row] = v_bits.reshape(tokens, row)
    k_view = fused[:, row:2 * row].reshape(tokens, HKV, D)  # a view: rows 3 * row + 8 apart
    v_view = fused[:, 2 * row:3 * row].reshape(tokens, HKV, D)
    assert not k_view.flags.c_contiguous and np.shares_memory(k_view, fused)
    slots = np.array([3 * PAGE + 1, -1, 0, 5 * PAGE + PAGE - 1, 2 * PAGE], np.int64)
    packed_k, packed_v = (np.full((8, PAGE, HKV, D), np.inf, np.float16) for _ in range(2))
    ss.reshape_and_cache(k_bits, v_bits, packed_k, packed_v, slots)
    strided_k, strided_v = (np.full((8, PAGE, HKV, D), np.inf, np.float16) for _ in range(2))
    ss.reshape_and_cache(k_view, v_view, strided_k, strided_v, slots)
    np.testing.assert_array_equal(strided_k, packed_k)
    np.testing.assert_array_equal(strided_v, packed_v)

    odd = np.zeros((tokens, row + 4), np.float16)[:, :row].reshape(tokens, HKV, D)  # rows row + 4 apart
    with pytest.raises(ss.SlimserveValueError, match="key has row stride 132"):
        ss.reshape_and_cache(odd, v_bits, strided_k, strided_v, slots)
    heads_apart = np.zeros((tokens, HKV, 2 * D), np.float16)[:, :, :D]  # heads 2 * D apart
    with pytest.raises(ss.SlimserveValueError, match="value has strides .* must be contiguous"):
        ss.reshape_and_cache(k_bits, heads_apart, strided_k, strided_v, slots)
    np.testing.assert_array_equal(strided_k, packed_k)  # nothing written by the refused calls
    np.testing.assert_array_equal(strided_v, packed_v)


def test_byte_page_stride_must_be_whole_16_byte_steps():
    """The C view takes page strides in whole 16-byte steps (every page as aligned as the first):
    an NVFP4 (byte) cache whose pages are 8 bytes apart beyond a page is refused by Python, naming
    k_pages, before any call into C; 16 bytes beyond a page is taken."""
    page = PAGE * HKV * (9 * D // 16)  # bytes of one packed NVFP4 page

    def pages(extra):
        return np.zeros((32, page + extra), np.uint8)[:, :page].reshape(32, PAGE, HKV, 9 * D // 16)

    with pytest.raises(ss.SlimserveValueError, match="k_pages page stride .* multiple of 16 bytes"):
        ss.PagedKVCache(pages(8), pages(8), dtype="nvfp4", k_scale=1.0, v_scale=1.0)
    cache = ss.PagedKVCache(pages(16), pages(16), dtype="nvfp4", k_scale=1.0, v_scale=1.0)
    assert cache.page_stride == page + 16
