"""torch.library ops. Skipped (cleanly, with a reason) when PyTorch is not installed."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: torch custom ops untested")

import slimserve as ss  # noqa: E402


def test_ops_are_registered():
    for name in ("reshape_and_cache", "paged_decode", "paged_attention", "gemm_w4a16"):
        assert hasattr(torch.ops.slimserve, name)


def test_reshape_and_cache_op_on_cpu_tensors(rng):
    key = torch.from_numpy(rng.standard_normal((5, 2, 64)).astype(np.float32)).to(torch.bfloat16)
    value = key * 2
    k_cache = torch.full((8, 16, 2, 64), float("nan"), dtype=torch.bfloat16)
    v_cache = k_cache.clone()
    slots = torch.tensor([17, 18, 40, -1, 100], dtype=torch.int64)
    torch.ops.slimserve.reshape_and_cache(key, value, k_cache, v_cache, slots, "auto", None, None)
    flat = k_cache.view(-1, 2, 64)
    assert torch.equal(flat[torch.tensor([17, 18, 40, 100])], key[torch.tensor([0, 1, 2, 4])])
    assert torch.isnan(flat[0]).all()


def test_fake_impls_give_shapes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a = torch.empty(3, 128, dtype=torch.float16)
        packed = torch.empty(128 * 64 // 8, dtype=torch.int32)
        out = torch.ops.slimserve.gemm_w4a16(a, packed, torch.empty(4, 64, dtype=torch.float16),
                                             None, None, 32)
        assert out.shape == (3, 64)


def test_paged_attention_op_matches_the_wrapper(rng):
    page, hq, hkv, d, pages = 16, 4, 2, 64, 12
    kv_len, qo_len = [5, 33], [5, 2]
    block = np.array([[3, 7, 999], [9, 1, 4]], np.int32)
    k = torch.from_numpy(rng.uniform(-1, 1, (pages, page, hkv, d)).astype(np.float32)).to(torch.bfloat16)
    v = torch.from_numpy(rng.uniform(-1, 1, (pages, page, hkv, d)).astype(np.float32)).to(torch.bfloat16)
    qo_indptr = np.array([0, 5, 7], np.int32)
    qkv = torch.from_numpy(rng.uniform(-1, 1, (7, (hq + 2 * hkv) * d)).astype(np.float32)).to(torch.bfloat16)
    q = qkv[:, : hq * d].reshape(7, hq, d)  # a strided view: read in place
    sinks = torch.tensor([0.5, -1.0, 0.0, 2.0])
    out = torch.ops.slimserve.paged_attention(q, k, v, torch.from_numpy(qo_indptr), torch.from_numpy(block),
                                              torch.tensor(kv_len, dtype=torch.int32), "auto", 0.0, 8, 0.0,
                                              sinks, None, None)
    wrapper = ss.PagedAttentionWrapper()
    wrapper.plan(qo_indptr, hq, hkv, d, page, block_table=block, seq_lens=np.array(kv_len, np.int32))
    expected = wrapper.run(q.contiguous(), ss.PagedKVCache(k, v), out=torch.empty(7, hq, d, dtype=torch.bfloat16),
                           sliding_window=8, sinks=sinks.numpy())
    assert torch.equal(out, expected) and not torch.isnan(out).any()
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fake = torch.ops.slimserve.paged_attention(torch.empty(7, hq, d, dtype=torch.bfloat16), torch.empty(k.shape, dtype=k.dtype),
                                                   torch.empty(v.shape, dtype=v.dtype), torch.empty(3, dtype=torch.int32),
                                                   torch.empty(2, 3, dtype=torch.int32),
                                                   torch.empty(2, dtype=torch.int32), "auto", 0.0, 0, 0.0, None,
                                                   None, None)
        assert fake.shape == (7, hq, d)
