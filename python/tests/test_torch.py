"""torch.library ops. Skipped (cleanly, with a reason) when PyTorch is not installed."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: torch custom ops untested")

import slimserve as ss  # noqa: E402


def test_ops_are_registered():
    for name in ("reshape_and_cache", "paged_decode", "gemm_w4a16"):
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
