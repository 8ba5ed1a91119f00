"""Random shapes, dtypes, strides, lengths and ids through every Python entry: each call must
either succeed or raise SlimserveError (the ValueError / TypeError subclasses included), never
crash and never raise anything else. Run under ASan with the emulated library built with it
(python_tests_asan), a read or write outside any buffer the binding described is a crash here.

Bounded and seeded: SLIMSERVE_FUZZ_SECONDS (default 20) and SLIMSERVE_FUZZ_ITERATIONS (default
unbounded) stop it; SLIMSERVE_FUZZ_SEED replays a run (the seed is printed). Each case draws a
valid call and then breaks one thing about it (or nothing), so most calls reach the kernels.

Long run (recorded): SLIMSERVE_FUZZ_SECONDS=600 SLIMSERVE_FUZZ_SEED=20261201 against the
ASan + UBSan build of the emulated library (the asan preset; the ASan runtime and libstdc++
preloaded into Python): 42,925 calls in 600 s across the 10 entries (4,292 or 4,293 each, 24,073
of them refused with SlimserveError, 18,852 run to completion), crashes 0, sanitizer reports 0.
"""
import os
import time

import numpy as np
import pytest

import slimserve as ss

try:
    import torch
except ImportError:  # the NumPy half still runs
    torch = None

SECONDS = float(os.environ.get("SLIMSERVE_FUZZ_SECONDS", "20"))
ITERATIONS = int(os.environ.get("SLIMSERVE_FUZZ_ITERATIONS", "0")) or None


class Case:
    """One random call: draws sizes, then `maybe` breaks one of them."""

    def __init__(self, rng):
        self.rng = rng
        self.broken = None
        # Which draw to break: a quarter of the cases break nothing (they run the kernels).
        self.break_at = rng.integers(0, 12) if rng.random() < 0.75 else 10**6
        self.draws = 0

    def maybe(self, name, good, bad_choices):
        """`good`, unless this is the draw picked to break: then one of bad_choices."""
        self.draws += 1
        if self.draws - 1 == self.break_at and bad_choices:
            self.broken = name
            return bad_choices[self.rng.integers(0, len(bad_choices))]
        return good

    def ints(self, low, high):
        return int(self.rng.integers(low, high))


def _array(case, name, shape, dtype, *, framework="numpy"):
    """A poisoned array of `shape`, or a broken one: another shape, dtype, a strided view,
    a non-array, None."""
    rng = case.rng
    shape = tuple(shape)
    bad_shapes = [shape[:-1], shape + (1,), tuple(max(0, s + rng.integers(-2, 3)) for s in shape)]
    shape = case.maybe(name + ".shape", shape, bad_shapes)
    dtype = case.maybe(name + ".dtype", dtype, [np.float32, np.int64, np.uint8, np.float16, np.int32])
    kind = case.maybe(name + ".kind", "plain", ["strided", "none", "list", "transposed"])
    if kind == "none":
        return None
    if kind == "list":
        return [0] * (shape[0] if shape else 1)
    bigger = shape[:-1] + (2 * shape[-1],) if kind == "strided" and shape else shape
    if np.dtype(dtype).kind == "f":
        data = rng.uniform(-2, 2, bigger).astype(dtype)
    else:
        data = rng.integers(0, 40, bigger).astype(dtype)
    if kind == "strided" and shape:
        data = data[..., ::2]
    if kind == "transposed" and len(shape) >= 2:
        data = np.swapaxes(np.swapaxes(data, 0, 1).copy(), 0, 1)
    if framework == "torch" and torch is not None and data.dtype != np.uint16:
        return torch.from_numpy(np.ascontiguousarray(data) if kind != "strided" else data.copy()[..., :])
    return data


def _lengths(case, batch, page):
    return [case.ints(1, 3 * page + 2) for _ in range(batch)]


def _block_table(case, lengths, page, num_pages):
    width = max(-(-n // page) for n in lengths) + case.ints(0, 2)
    block = case.rng.integers(1, num_pages, (len(lengths), width)).astype(np.int32)
    return case.maybe("block_table.ids", block, [block * 0 - 1, block + num_pages, block[:, :1]])


def fuzz_decode(case):
    page = case.maybe("page_size", 16, [1, 8, 24])
    heads, kv_heads, d = 4, 2, case.maybe("head_dim", 64, [80, 32])
    num_pages = case.ints(4, 20)
    lengths = _lengths(case, case.ints(1, 4), page)
    counts = [-(-n // page) for n in lengths]
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    indices = case.rng.integers(1, num_pages, int(indptr[-1])).astype(np.int32)
    indices = case.maybe("indices", indices, [indices[:-1], indices + num_pages, -indices])
    last = np.array([n - (c - 1) * page for n, c in zip(lengths, counts)], np.int32)
    last = case.maybe("last_page_len", last, [last + page, last[:-1], last * 0])
    kv_dtype = case.maybe("kv_dtype", "float16", ["fp8", "int4", "bfloat16"])
    k = _array(case, "k_pages", (num_pages, page, kv_heads, d), np.float16)
    v = _array(case, "v_pages", (num_pages, page, kv_heads, d), np.float16)
    cache = ss.PagedKVCache(k, v, dtype=kv_dtype if kv_dtype != "fp8" else None)
    wrapper = ss.DecodeWrapper()
    wrapper.plan(indptr, indices, last, heads, kv_heads, d, page, kv_dtype)
    q = _array(case, "q", (len(lengths), heads, d), np.float16)
    out = _array(case, "out", (len(lengths), heads, d), np.float16)
    wrapper.run(q, cache, out=out)


def fuzz_append(case):
    page = 16
    kv_heads, d = case.maybe("kv_heads", 2, [3]), 64
    pool = ss.PagePool(24)
    counts = [case.ints(1, 3) for _ in range(case.ints(1, 3))]
    table = ss.PageTable(4, 16, page, 24)
    requests = [(pool.allocate(c), case.ints((c - 1) * page + 1, c * page + 1)) for c in counts]
    built = table.build(requests)
    if case.maybe("stale", False, [True]):
        table.build(requests[:1])
    num_pages = case.maybe("num_pages", 24, [4])
    combined = case.maybe("combined", False, [True])
    if combined:
        kv = _array(case, "kv_pages", (num_pages, 2, page, kv_heads if case.broken is None else 2, d), np.float16)
        cache = ss.PagedKVCache(kv, None)
    else:
        k = _array(case, "k_pages", (num_pages, page, 2, d), np.float16)
        cache = ss.PagedKVCache(k, _array(case, "v_pages", (num_pages, page, 2, d), np.float16))
    n = sum(t for _, t in requests) if case.maybe("form", "chunk", ["explicit"]) == "chunk" else 3
    rows_k = _array(case, "k", (n, kv_heads, d), np.float16)
    rows_v = _array(case, "v", (n, kv_heads, d), np.float16)
    if case.broken == "form":
        ss.append_kv(cache, built, rows_k, rows_v, token_request=case.rng.integers(-1, 4, 3),
                     token_position=case.rng.integers(-5, 60, 3))
    else:
        append = np.concatenate([[0], np.cumsum([t for _, t in requests])]).astype(np.int32)
        append = case.maybe("append_indptr", append, [append[::-1].copy(), append + 5, append[:-1]])
        ss.append_kv(cache, built, rows_k, rows_v, append_indptr=append)


def fuzz_reshape_and_cache(case):
    page, kv_heads, d = 16, 2, 64
    num_pages = case.ints(2, 10)
    n = case.ints(1, 8)
    fp8 = case.maybe("fp8", False, [True])
    dtype = np.uint8 if fp8 else np.float16
    k_cache = _array(case, "key_cache", (num_pages, page, kv_heads, d), dtype)
    v_cache = _array(case, "value_cache", (num_pages, page, kv_heads, d), dtype)
    slots = case.rng.integers(-1, num_pages * page, n).astype(np.int64)
    slots = case.maybe("slot_mapping", slots, [slots + num_pages * page, slots.astype(np.int32), slots[:-1]])
    scale = case.maybe("k_scale", 0.5, [float("nan"), 0.0, -1.0, np.array([1.0, 2.0], np.float32)])
    ss.reshape_and_cache(_array(case, "key", (n, kv_heads, d), np.float16),
                         _array(case, "value", (n, kv_heads, d), np.float16), k_cache, v_cache, slots,
                         case.maybe("kv_cache_dtype", "fp8" if fp8 else "auto", ["fp8_e5m2", "bogus"]),
                         scale if fp8 else None, 1.0 if fp8 else None,
                         layout=case.maybe("layout", "NHD", ["HND", "XYZ"]))


def fuzz_paged_attention(case):
    page, heads, kv_heads, d = 16, 4, 2, 64
    num_pages = case.ints(4, 24)
    lengths = _lengths(case, case.ints(1, 4), page)
    qo_len = [case.ints(1, min(n, 5) + 1) for n in lengths]
    qo = np.concatenate([[0], np.cumsum(qo_len)]).astype(np.int32)
    qo = case.maybe("qo_indptr", qo, [qo[::-1].copy(), qo + 1, qo[:-1]])
    block = _block_table(case, lengths, page, num_pages)
    lens = np.array(case.maybe("seq_lens", lengths, [[0] * len(lengths), [n + 100 for n in lengths]]), np.int32)
    wrapper = ss.PagedAttentionWrapper()
    wrapper.plan(qo, heads, kv_heads, d, page, block_table=block, seq_lens=lens, kv_dtype="float16",
                 warpgroup_mma=bool(case.ints(0, 2)), allow_split=bool(case.ints(0, 2)))
    tokens = int(qo[-1]) if qo.size else 0
    k = _array(case, "k_pages", (num_pages, page, kv_heads, d), np.float16)
    cache = ss.PagedKVCache(k, _array(case, "v_pages", (num_pages, page, kv_heads, d), np.float16))
    q = _array(case, "q", (tokens, heads, d), np.float16)
    lse = case.maybe("lse", None, [np.zeros((tokens, heads), np.float32), np.zeros((tokens, 1), np.float32)])
    statuses = case.maybe("statuses", None, [ss.RequestStatuses(1), np.zeros((len(lengths), 2), np.int32)])
    wrapper.run(q, cache, out=_array(case, "out", (tokens, heads, d), np.float16), lse=lse, statuses=statuses,
                sliding_window=case.maybe("sliding_window", 0, [-3, 5]),
                sinks=case.maybe("sinks", None, [np.zeros(heads, np.float32), np.zeros(1, np.float32)]))


def fuzz_mla(case):
    page = 16
    num_pages = case.ints(2, 12)
    record = ss.mla_record_bytes("bfloat16")
    pages = _array(case, "mla_pages", (num_pages, page, record), np.uint8)
    cache = ss.MlaCache(pages, kv_dtype=case.maybe("kv_dtype", "bfloat16", ["fp8", "nope"]))
    lengths = _lengths(case, case.ints(1, 3), page)
    block = _block_table(case, lengths, page, num_pages)
    heads = case.maybe("num_heads", 8, [7, 0])
    if case.ints(0, 2):
        counts = [-(-n // page) for n in lengths]
        indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        indices = case.rng.integers(1, num_pages, int(indptr[-1])).astype(np.int32)
        last = np.array([n - (c - 1) * page for n, c in zip(lengths, counts)], np.int32)
        n = case.ints(0, 4)
        append = np.array([0] * len(lengths) + [n], np.int32)
        ss.mla_append(cache, indptr, indices, last, _array(case, "latent", (n, 512), np.float16),
                      _array(case, "rope", (n, 64), np.float16), append_indptr=append)
        return
    wrapper = ss.MlaDecodeWrapper()
    wrapper.plan(block, lengths, heads, page)
    q = _array(case, "q", (len(lengths), heads, 576), np.uint16)
    wrapper.run(q, cache, case.maybe("sm_scale", 0.1, [float("nan")]),
                out=_array(case, "out", (len(lengths), heads, 512), np.uint16))


def fuzz_gemm(case):
    k, n, m, group = 128, 64, case.ints(1, 5), case.maybe("group_size", 32, [0, 48, 7])
    weights = ss.quantize_int4(np.random.default_rng(1).standard_normal((k, n)).astype(np.float32), group_size=32,
                               activation="float16")
    packed = case.maybe("packed", weights.packed, [weights.packed[:-8], weights.packed.astype(np.int64)])
    ss.gemm_w4a16(_array(case, "a", (m, k), np.float16), packed,
                  case.maybe("scales", weights.scales, [weights.scales[:-1], weights.scales.astype(np.float32)]),
                  None, group, out=_array(case, "out", (m, n), np.float16))


def fuzz_pool(case):
    pool = ss.PagePool(case.maybe("num_pages", 8, [0, -1, 2**40]))
    pages = pool.allocate(case.maybe("count", case.ints(0, 7), [-1, 10**9, 2.5]))
    pool.release(case.maybe("release", pages, [pages + pages, [(3, 999)]]))
    ss.RequestStatuses(case.maybe("capacity", 4, [0, -2]))
    ss.DeviceArray.empty(case.maybe("nbytes", 64, [-1]))


def fuzz_torch_run(case):
    if torch is None:
        return
    from slimserve.torch_ops import PagedAttentionPlan
    page, heads, kv_heads, d = 16, 4, 2, 64
    width = 4
    plan = PagedAttentionPlan(heads, kv_heads, d, page, q_dtype=torch.float16, max_batch=3, max_num_tokens=3,
                              max_seq_len=width * page, max_pages_per_request=width)
    batch = case.ints(1, 4)
    lengths = [case.ints(1, width * page + 1) for _ in range(batch)]
    plan.plan(list(range(batch + 1)), case.maybe("seq_lens", lengths, [[n + page * width for n in lengths]]))
    num_pages = case.ints(2, 12)
    k = torch.zeros(num_pages, page, kv_heads, d, dtype=torch.float16)
    table = torch.from_numpy(case.rng.integers(-3, num_pages + 3, (batch, width)).astype(np.int32))
    table = case.maybe("block_table", table, [table[:, :2], table.to(torch.int64)])
    lens = case.maybe("seq_lens_device", torch.tensor(lengths, dtype=torch.int32),
                      [torch.tensor(lengths) * 0 + 10**6, torch.tensor(lengths[:-1] or [1], dtype=torch.int32)])
    out = torch.zeros(batch, heads, d, dtype=torch.float16)
    torch.ops.slimserve.paged_attention_run(torch.zeros(batch, heads, d, dtype=torch.float16), k,
                                            case.maybe("v_cache", k, [k[:, :8], k.to(torch.float32)]), table,
                                            lens, case.maybe("out", out, [out[:, :2]]), None, plan.id,
                                            case.maybe("kv_cache_dtype", "auto", ["fp8"]), "NHD", 0.0, None, None)


def fuzz_moe(case):
    experts, top_k, k, n, group = 3, case.maybe("top_k", 2, [0, 4]), 64, 32, 32
    tokens = case.ints(1, 5)
    weights = [ss.quantize_int4(np.random.default_rng(e).standard_normal((k, n)).astype(np.float32), group_size=group,
                                activation="float16") for e in range(experts)]
    packed, scales, zeros = ss.stack_experts(weights)
    packed = case.maybe("packed", packed, [packed[: packed.size // 2]])
    scales = case.maybe("scales", scales, [scales[:-3], scales.astype(np.float32)])
    ids = case.rng.integers(0, experts, (tokens, max(top_k, 1))).astype(np.int32)
    ids = case.maybe("topk_ids", ids, [ids + experts, -ids - 1, ids.astype(np.int64), ids[:, :1]])
    router = ss.MoeRouter(experts, top_k, case.maybe("max_tokens", 8, [0, 1]))
    routing = router.run(ids)
    gemm = ss.MoeGemm(case.maybe("epilogue", "down_weighted_sum", ["gate_up_silu", "x"]), packed, scales, zeros,
                      k=k, n=n, group_size=case.maybe("group_size", group, [16, 0]), num_experts=experts,
                      top_k=top_k, max_tokens=8)
    rows = tokens * top_k if gemm.epilogue == "down_weighted_sum" else tokens
    out_shape = (tokens, n) if gemm.epilogue == "down_weighted_sum" else (tokens * top_k, n // 2)
    gemm.run(_array(case, "a", (rows, k), np.float16), routing,
             topk_weights=_array(case, "topk_weights", (tokens, top_k), np.float32),
             out=_array(case, "out", out_shape, np.float16))


def fuzz_kv_bookkeeping(case):
    page = 16
    pool = ss.PagePool(16)
    prefix = ss.PrefixCache(pool, case.maybe("page_size", page, [0, -4]))
    sets = ss.RequestSets(pool, prefix, case.maybe("max_requests", 4, [0]), page)
    tokens = case.rng.integers(0, 50, case.maybe("prompt", case.ints(1, 40), [0, 400])).astype(np.int32)
    request, _ = sets.admit(tokens)
    sets.append(case.maybe("request", request, [(request[0] + 7, request[1]), (request[0], 12345)]),
                case.maybe("new_tokens", 3, [-1, 10**6]))
    pages = sets.pages(request)
    table = ss.PageTable(4, 16, page, 16)
    built = table.build([(pages, sets.tokens(request))])
    tags = ss.DeviceTags(16)
    tags.sync(pool)
    statuses = ss.RequestStatuses(case.maybe("statuses", 2, [1]) if case.broken is None else 1)
    ss.check_page_tags(built, tags, statuses, writers=case.maybe("writers", [request[1]], [[1, 2, 3]]),
                       append_indptr=case.maybe("append_indptr", [0, 3], [[0], [5, 0]]))
    statuses.to_host(case.maybe("count", 1, [-1, 9]))
    ids = np.array([[p for p, _ in pages]], np.int32)
    held = np.array([[t for _, t in pages]], np.uint32)
    ids = case.maybe("block_ids", ids, [case.rng.integers(-2, 20, ids.shape).astype(np.int32), ids[:, :0]])
    ss.validate_block_table(ids, [case.maybe("seq_len", sets.tokens(request), [10**6, -1])], held, 16, page)
    k = np.zeros((16, page, 2, 64), np.float16)
    cache = ss.PagedKVCache(k, k.copy())
    if len(pages) >= 2:
        ss.copy_pages(cache, tags, [{"src": pages[0], "dst": case.maybe("dst", pages[-1], [(99, 1), pages[0]]),
                                     "writer": request[1], "tokens": case.maybe("tokens", 1, [0, 17])}])
    sets.finish(request, np.concatenate([tokens, [1, 2, 3]]).astype(np.int32))


ENTRIES = [fuzz_decode, fuzz_append, fuzz_reshape_and_cache, fuzz_paged_attention, fuzz_mla, fuzz_gemm,
           fuzz_pool, fuzz_torch_run, fuzz_moe, fuzz_kv_bookkeeping]


def test_fuzz_every_entry():
    seed = int(os.environ.get("SLIMSERVE_FUZZ_SEED", np.random.SeedSequence().entropy % 2**32))
    print(f"fuzz seed {seed}")
    rng = np.random.default_rng(seed)
    deadline = time.monotonic() + SECONDS
    counts = {entry.__name__: [0, 0] for entry in ENTRIES}  # [calls, refused]
    iteration = 0
    while time.monotonic() < deadline and (ITERATIONS is None or iteration < ITERATIONS):
        entry = ENTRIES[iteration % len(ENTRIES)]
        case = Case(rng)
        counts[entry.__name__][0] += 1
        try:
            entry(case)
        except ss.SlimserveError:
            counts[entry.__name__][1] += 1
        except Exception as error:  # noqa: BLE001 (the point: nothing else may escape)
            pytest.fail(f"seed {seed}, iteration {iteration}, {entry.__name__} with {case.broken or 'nothing'} "
                        f"broken raised {type(error).__name__}: {error}")
        iteration += 1
    print(f"fuzz: {iteration} calls in {SECONDS:.0f} s, crashes 0; per entry [calls, refused]: {counts}")
    assert iteration > 0
