"""The INT4 MoE wrappers (slimserve.moe) against NumPy FP64 references built from the quantized
weights: one layer as an engine runs it (one routing, gate+up then down reading its output),
every element; routings with top-k 1/2/8, empty experts, one expert taking every token and
out-of-range ids; refusals with their messages."""
import ctypes

import numpy as np
import pytest

import slimserve as ss
from slimserve import _capi

EPS = 2.0 ** -24


def make_experts(rng, experts, k, n, group_size, symmetric):
    weights = [ss.quantize_int4((rng.uniform(-1, 1, (k, n)) * (1 + e % 3)).astype(np.float32),
                                group_size=group_size, symmetric=symmetric, activation="float16")
               for e in range(experts)]
    packed, scales, zeros = ss.stack_experts(weights)
    rounded = np.stack([w.dequantize().astype(np.float64) for w in weights])  # round_T((q - z) s)
    s = np.stack([np.repeat(w.scales.astype(np.float64).reshape(k // group_size, n), group_size, axis=0)
                  for w in weights])
    d = np.rint(rounded / s)  # q - z: rounding moved w by less than s / 2
    assert np.abs(d).max() <= 15
    return packed, scales, zeros, {"per_weight": rounded, "per_group_sum": d * s}


def make_routing(rng, kind, tokens, top_k, experts):
    ids = np.empty((tokens, top_k), np.int32)
    for t in range(tokens):
        pool = np.arange(min(top_k + 1, experts) if kind == "few_experts" else experts)
        rng.shuffle(pool)
        if kind == "one_expert_all_tokens":
            where = int(np.nonzero(pool == 1)[0][0])
            pool[where], pool[t % top_k] = pool[t % top_k], 1
        ids[t] = pool[:top_k]
    if kind == "invalid":
        ids[0, 0] = experts
        if ids.size > 3:
            ids.flat[3] = -1
    weights = rng.uniform(0.05, 1.0, (tokens, top_k)).astype(np.float32)
    return ids, weights


def ulp(values):
    return np.ldexp(1.0, np.frexp(np.maximum(np.abs(values), 6.103515625e-05))[1] - 11)


def reference_gate_up(x, ids, w, experts):
    tokens, top_k = ids.shape
    inter = w.shape[2] // 2
    valid = (ids >= 0) & (ids < experts)
    e = np.where(valid, ids, 0).reshape(-1)
    xs = np.repeat(x.astype(np.float64), top_k, axis=0)  # [pairs, k]
    wg, wu = w[e][:, :, :inter], w[e][:, :, inter:]
    g = np.einsum("pk,pkn->pn", xs, wg)
    u = np.einsum("pk,pkn->pn", xs, wu)
    mg = np.einsum("pk,pkn->pn", np.abs(xs), np.abs(wg))
    mu = np.einsum("pk,pkn->pn", np.abs(xs), np.abs(wu))
    silu = g / (1 + np.exp(-g))
    want = silu * u
    sum_tol = 2 * (x.shape[1] + 2) * EPS
    tg, tu = sum_tol * mg, sum_tol * mu
    tol = 1.1 * tg * (np.abs(u) + tu) + (np.abs(silu) + 1.1 * tg) * tu + 16 * EPS * np.abs(want) + ulp(want)
    return want, tol, valid.reshape(-1)


def reference_down(mid, ids, weights, w, experts):
    tokens, top_k = ids.shape
    valid = (ids >= 0) & (ids < experts)
    e = np.where(valid, ids, 0).reshape(-1)
    m = np.where(valid.reshape(-1, 1), mid.astype(np.float64), 0.0)  # skipped pairs' rows are NaN
    sums = np.einsum("pk,pkn->pn", m, w[e])
    magnitude = np.einsum("pk,pkn->pn", np.abs(m), np.abs(w[e]))
    r = (weights.astype(np.float64) * valid).reshape(-1, 1)
    sum_tol = 2 * (mid.shape[1] + 2) * EPS
    want = (r * sums).reshape(tokens, top_k, -1).sum(axis=1)
    tol = (r * (sum_tol * magnitude + (top_k + 2) * EPS * np.abs(sums))).reshape(tokens, top_k, -1).sum(axis=1)
    return want, tol + ulp(want)


CASES = [  # tokens, max_tokens, top_k, experts, hidden, inter, group up / down, symmetric, routing
    (5, 5, 1, 4, 64, 32, 32, 32, True, "random"),
    (7, 16, 2, 6, 128, 64, 64, 64, False, "random"),
    (9, 9, 8, 10, 64, 48, 32, 48, True, "random"),
    (12, 12, 2, 10, 64, 32, 64, 32, False, "few_experts"),
    (17, 20, 8, 12, 64, 32, 32, 32, False, "one_expert_all_tokens"),
    (3, 3, 1, 3, 64, 32, 64, 32, True, "one_expert_all_tokens"),
    (6, 8, 2, 5, 64, 32, 32, 32, True, "invalid"),
]


@pytest.mark.parametrize("case", CASES, ids=[f"T{c[0]}-top{c[2]}-E{c[3]}-{c[9]}" for c in CASES])
def test_moe_layer_matches_numpy(rng, case):
    tokens, max_tokens, top_k, experts, hidden, inter, g_up, g_down, symmetric, kind = case
    up_packed, up_scales, up_zeros, up_w = make_experts(rng, experts, hidden, 2 * inter, g_up, symmetric)
    dn_packed, dn_scales, dn_zeros, dn_w = make_experts(rng, experts, inter, hidden, g_down, symmetric)
    ids, weights = make_routing(rng, kind, tokens, top_k, experts)
    x = rng.uniform(-1, 1, (tokens, hidden)).astype(np.float16)

    router = ss.MoeRouter(experts, top_k, max_tokens)
    up = ss.MoeGemm("gate_up_silu", up_packed, up_scales, up_zeros, k=hidden, n=2 * inter, group_size=g_up,
                    num_experts=experts, top_k=top_k, max_tokens=max_tokens)
    down = ss.MoeGemm("down_weighted_sum", dn_packed, dn_scales, dn_zeros, k=inter, n=hidden, group_size=g_down,
                      num_experts=experts, top_k=top_k, max_tokens=max_tokens)
    results = []
    for _ in range(2):  # the second run over the used workspaces: the same bits
        mid = np.full((tokens * top_k, inter), np.nan, np.float16)
        out = np.full((tokens, hidden), np.nan, np.float16)
        routing = router.run(ids)
        up.run(x, routing, out=mid)
        down.run(mid, routing, topk_weights=weights, out=out)
        if kind == "invalid":
            with pytest.raises(ss.SlimserveError, match=rf"topk_ids\[0, 0\] = {experts} .*skipped") as error:
                routing.read_status()
            assert error.value.code == "out_of_range"
            word = routing.status_word()
            assert word == {"invalid_pairs": 2, "first_invalid": 0, "first_id": experts}
        else:
            routing.read_status()
        results.append((mid, out))
    np.testing.assert_array_equal(results[0][0].view(np.uint16), results[1][0].view(np.uint16))
    np.testing.assert_array_equal(results[0][1].view(np.uint16), results[1][1].view(np.uint16))
    assert up.workspace_bytes == 0 and down.workspace_bytes >= max_tokens * top_k * hidden * 4
    mid, out = results[0]

    want, tol, valid = reference_gate_up(x, ids, up_w[up.scaling], experts)
    got = mid.astype(np.float64)
    assert np.isnan(got[~valid]).all()  # skipped pairs' rows are not written
    assert (np.abs(got[valid] - want[valid]) <= tol[valid]).all()
    want, tol = reference_down(mid, ids, weights, dn_w[down.scaling], experts)
    assert (np.abs(out.astype(np.float64) - want) <= tol).all()


def test_scaling_model_follows_the_group_size(rng):
    packed, scales, zeros, _ = make_experts(rng, 2, 64, 32, 32, True)
    ids = np.array([[0], [1]], np.int32)
    router = ss.MoeRouter(2, 1, 2)
    gemm = ss.MoeGemm("down_weighted_sum", packed, scales, zeros, k=64, n=32, group_size=32, num_experts=2,
                      top_k=1, max_tokens=2)
    gemm.run(np.ones((2, 64), np.float16), router.run(ids), topk_weights=np.ones((2, 1), np.float32))
    assert gemm.scaling == "per_weight"
    packed, scales, zeros, _ = make_experts(rng, 2, 64, 32, 64, True)
    gemm = ss.MoeGemm("down_weighted_sum", packed, scales, zeros, k=64, n=32, group_size=64, num_experts=2,
                      top_k=1, max_tokens=2)
    gemm.run(np.ones((2, 64), np.float16), router.run(ids), topk_weights=np.ones((2, 1), np.float32))
    assert gemm.scaling == "per_group_sum"


def test_refusals_name_the_problem(rng):
    ids, _ = make_routing(rng, "random", 4, 2, 6)
    ss.validate_moe_routing(ids, 6)
    ids[2, 1] = 6
    with pytest.raises(ss.SlimserveError, match=r"topk_ids\[2, 1\] = 6 is outside 0..5") as error:
        ss.validate_moe_routing(ids, 6)
    assert error.value.code == "out_of_range"
    ids[2, 1] = 0

    with pytest.raises(ss.SlimserveError, match="top_k = 7 must be in 1..6"):
        ss.MoeRouter(6, 7, 4).run(np.zeros((4, 7), np.int32))
    router = ss.MoeRouter(6, 2, 4)
    routing = router.run(ids)
    with pytest.raises(ss.SlimserveError, match="plan again"):
        router.run(np.zeros((5, 2), np.int32))  # more tokens than the plan serves

    # A short workspace and a struct_size too small, through the C ABI as the wrappers call it.
    args = router._args(ss._tensor(ids), 4)
    out = _capi.MoeRouting()
    status = ss._lib.slimserve_moe_routing_run(router._plan, ctypes.byref(args), router._workspace.ptr,
                                               router.workspace_bytes - 1, None, ctypes.byref(out))
    assert _capi.STATUS_NAMES[status] == "resource_exhausted"
    assert b"routing workspace of" in ss._lib.slimserve_last_error()
    assert out.num_tokens == 0  # not written
    args.struct_size = 8
    status = ss._lib.slimserve_moe_routing_workspace_size(ctypes.byref(args), ctypes.byref(ctypes.c_size_t()))
    assert _capi.STATUS_NAMES[status] == "invalid_argument"
    assert b"struct_size is 8" in ss._lib.slimserve_last_error()

    packed, scales, zeros, _ = make_experts(rng, 6, 32, 64, 32, True)
    down = ss.MoeGemm("down_weighted_sum", packed, scales, zeros, k=32, n=64, group_size=32, num_experts=6,
                      top_k=2, max_tokens=4)
    a = rng.uniform(-1, 1, (8, 32)).astype(np.float16)
    out = np.full((4, 64), np.nan, np.float16)
    with pytest.raises(TypeError, match="topk_weights"):
        down.run(a, routing, out=out)
    bad = ss.MoeGemm("down_weighted_sum", packed, scales, zeros, k=32, n=40, group_size=32, num_experts=6,
                     top_k=2, max_tokens=4)
    with pytest.raises(ss.SlimserveError, match="n = 40") as error:
        bad.run(a, routing, topk_weights=np.ones((4, 2), np.float32), out=np.empty((4, 40), np.float16))
    # The binding's own check of the weights' extents (n = 40 does not match the stacked experts'
    # buffers) comes before the library's shape check.
    assert error.value.code == "invalid_argument" and "packed holds" in str(error.value)
    router_weights = np.ones((4, 2), np.float32)
    down.run(a, routing, topk_weights=router_weights, out=out)
    assert not np.isnan(out.astype(np.float64)).any()
    out[:] = np.nan
    # The wrapper passes the routing's own ids; a routing of another shape is refused.
    other = ss.MoeRouter(6, 1, 4).run(np.ascontiguousarray(ids[:, :1]))
    with pytest.raises(ss.SlimserveError, match="the routing was aligned for"):
        down.run(a, other, topk_weights=router_weights, out=out)
    assert np.isnan(out.astype(np.float64)).all()  # nothing was written
