"""The capturable torch ops: a plan per batch fills persistent buffers, the run launches only.
On the emulator a run is proven free of host synchronization and allocation (the library's
runtime counters stay put, and the torch calls that would synchronize or allocate raise while
it runs), and running again with new contents of the same caller-owned buffers (a CUDA graph's
replay) gives the new answer, checked element by element against an FP64 reference."""
import contextlib

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: torch custom ops untested")

import slimserve as ss  # noqa: E402
from slimserve.torch_ops import PagedAttentionPlan  # noqa: E402
from test_paged_attention import _reference  # noqa: E402

HQ, HKV, D, PAGE, PAGES, WIDTH = 8, 2, 64, 16, 48, 12


@contextlib.contextmanager
def no_sync_no_alloc(monkeypatch):
    """Inside: the library may not synchronize or allocate, and host copies / new tensors
    through torch raise."""

    def forbidden(name):
        def raise_(*args, **kwargs):
            raise AssertionError(f"{name} inside a capturable run")
        return raise_

    with monkeypatch.context() as patch:
        for name in ("cpu", "item", "tolist", "numpy", "__array__"):
            patch.setattr(torch.Tensor, name, forbidden(f"Tensor.{name}"))
        for name in ("empty", "empty_like", "zeros", "tensor"):
            patch.setattr(torch, name, forbidden(f"torch.{name}"))
        before = ss.runtime_counters()
        yield
        after = ss.runtime_counters()
    assert after["synchronizations"] == before["synchronizations"], (before, after)
    assert after["allocations"] == before["allocations"], (before, after)


def _fill_batch(rng, lengths, block_table, seq_lens):
    """Shuffled pages with holes written into the persistent block_table / seq_lens in place."""
    free = rng.permutation(np.arange(1, PAGES))
    block = np.full(block_table.shape, -7, np.int32)  # garbage past each row's pages
    used = []
    start = 0
    for b, n in enumerate(lengths):
        count = -(-n // PAGE)
        block[b, :count] = free[start : start + 2 * count : 2]
        used.append(block[b, :count])
        start += 2 * count
    block_table.copy_(torch.from_numpy(block))
    seq_lens.copy_(torch.from_numpy(np.array(lengths, np.int32)))
    return used


def _expected(q, k_cache, v_cache, used, lengths, layout):
    k = k_cache.float().numpy().astype(np.float64)
    v = v_cache.float().numpy().astype(np.float64)
    if layout == "HND":
        k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    k_seq = [k[p].reshape(-1, HKV, D)[:n] for p, n in zip(used, lengths)]
    v_seq = [v[p].reshape(-1, HKV, D)[:n] for p, n in zip(used, lengths)]
    qo = np.arange(len(lengths) + 1, dtype=np.int32)
    return _reference(q.float().numpy(), k_seq, v_seq, qo, 1.0 / np.sqrt(D))[0]


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_decode_run_replays_on_new_buffer_contents_without_sync(rng, monkeypatch, layout):
    batch = 3
    plan = PagedAttentionPlan(HQ, HKV, D, PAGE, q_dtype=torch.float16, max_batch=4, max_num_tokens=4,
                              max_seq_len=WIDTH * PAGE, max_pages_per_request=WIDTH)
    shape = (PAGES, PAGE, HKV, D) if layout == "NHD" else (PAGES, HKV, PAGE, D)
    # The engine's persistent buffers: the same tensors every step (a graph holds their pointers).
    q = torch.empty(batch, HQ, D, dtype=torch.float16)
    out = torch.empty(batch, HQ, D, dtype=torch.float16)
    k_cache = torch.empty(shape, dtype=torch.float16)
    v_cache = torch.empty(shape, dtype=torch.float16)
    block_table = torch.empty(batch, WIDTH, dtype=torch.int32)
    seq_lens = torch.empty(batch, dtype=torch.int32)
    statuses = torch.zeros(batch, 2, dtype=torch.int32)
    buffers = None
    for step, lengths in enumerate(([1, PAGE - 1, 70], [PAGE, PAGE + 1, 150], [33, 2, WIDTH * PAGE])):
        used = _fill_batch(rng, lengths, block_table, seq_lens)
        q.copy_(torch.from_numpy(rng.uniform(-1, 1, q.shape).astype(np.float16)))
        k_cache.copy_(torch.from_numpy(rng.uniform(-1, 1, shape).astype(np.float16)))
        v_cache.copy_(torch.from_numpy(rng.uniform(-1, 1, shape).astype(np.float16)))
        out.fill_(float("nan"))
        plan.plan([0, 1, 2, 3], lengths)
        assert buffers is None or plan.buffers == buffers  # the pointers a graph captured stay valid
        buffers = plan.buffers
        with no_sync_no_alloc(monkeypatch):
            torch.ops.slimserve.paged_attention_run(q, k_cache, v_cache, block_table, seq_lens, out, statuses,
                                                    plan.id, "auto", layout, 0.0, None, None)
        ref = _expected(q, k_cache, v_cache, used, lengths, layout)
        got = out.float().numpy().astype(np.float64)
        bad = np.abs(got - ref) > 2.0 ** -10 * np.abs(ref) + 2e-3
        assert not bad.any(), f"step {step}: {bad.sum()} elements off, worst {np.abs(got - ref).max()}"

    # statuses=: an aborted request's rows are NaN, the others unchanged.
    statuses[1, 0] = 1  # stale_tag
    out.fill_(0.0)
    torch.ops.slimserve.paged_attention_run(q, k_cache, v_cache, block_table, seq_lens, out, statuses,
                                            plan.id, "auto", layout, 0.0, None, None)
    assert torch.isnan(out[1]).all() and not torch.isnan(out[0]).any() and not torch.isnan(out[2]).any()


def test_a_new_grid_asks_for_a_new_capture():
    plan = PagedAttentionPlan(HQ, HKV, D, PAGE, q_dtype=torch.float16, max_batch=4, max_num_tokens=4,
                              max_seq_len=64, max_pages_per_request=4)
    plan.plan([0, 1, 2], [5, 9])
    plan.plan([0, 1, 2], [50, 3])  # same grid: fine
    with pytest.raises(ss.SlimserveError, match="captured again") as error:
        plan.plan([0, 1, 2, 3], [5, 9, 1])
    assert error.value.code == "failed_precondition"
    with pytest.raises(ss.SlimserveValueError, match="exceeds the plan's limits"):
        plan.plan([0, 1], [65])


def test_run_refuses_wrong_buffers():
    plan = PagedAttentionPlan(HQ, HKV, D, PAGE, q_dtype=torch.float16, max_batch=2, max_num_tokens=2,
                              max_seq_len=64, max_pages_per_request=4)
    plan.plan([0, 1, 2], [5, 9])
    q = torch.zeros(2, HQ, D, dtype=torch.float16)
    cache = torch.zeros(8, PAGE, HKV, D, dtype=torch.float16)
    table, lens = torch.ones(2, 4, dtype=torch.int32), torch.tensor([5, 9], dtype=torch.int32)

    def run(**override):
        a = dict(q=q, k=cache, v=cache, table=table, lens=lens, out=torch.zeros_like(q), statuses=None)
        a.update(override)
        torch.ops.slimserve.paged_attention_run(a["q"], a["k"], a["v"], a["table"], a["lens"], a["out"],
                                                a["statuses"], plan.id, "auto", "NHD", 0.0, None, None)

    run()
    with pytest.raises(ss.SlimserveValueError, match="block_table has 3 columns"):
        run(table=torch.ones(2, 3, dtype=torch.int32))
    with pytest.raises(ss.SlimserveTypeError, match="seq_lens has dtype int64"):
        run(lens=torch.tensor([5, 9]))
    with pytest.raises(ss.SlimserveValueError, match="out has shape"):
        run(out=torch.zeros(2, HQ, 32, dtype=torch.float16))
    with pytest.raises(ss.SlimserveValueError, match="statuses has shape"):
        run(statuses=torch.zeros(1, 2, dtype=torch.int32))
    with pytest.raises(ss.SlimserveValueError, match="q has shape"):
        run(q=torch.zeros(3, HQ, D, dtype=torch.float16))
    with pytest.raises(ss.SlimserveError, match="no live PagedAttentionPlan"):
        torch.ops.slimserve.paged_attention_run(q, cache, cache, table, lens, torch.zeros_like(q), None, 10**6,
                                                "auto", "NHD", 0.0, None, None)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_reshape_and_cache_reads_slots_on_the_device(rng, monkeypatch, layout):
    """vLLM's call on a combined FP8 cache (kv_cache[:, 0] / [:, 1] views), "fp8" and torch's
    float8_e4m3fn tensors, a float k_scale and a tensor v_scale; exact against torch's own
    FP8 rounding of value / scale (values inside the format's range)."""
    tokens = 6
    shape = (PAGES, 2, PAGE, HKV, D) if layout == "NHD" else (PAGES, 2, HKV, PAGE, D)
    kv = torch.full(shape, float("nan")).to(torch.float8_e4m3fn)
    key = torch.from_numpy(rng.uniform(-4, 4, (tokens, HKV, D)).astype(np.float32)).to(torch.bfloat16)
    value = torch.from_numpy(rng.uniform(-4, 4, (tokens, HKV, D)).astype(np.float32)).to(torch.bfloat16)
    slots = torch.from_numpy(rng.permutation(PAGES * PAGE)[:tokens].astype(np.int64))
    slots[3] = -1  # skipped
    v_scale = torch.tensor([0.25])
    ss.reshape_and_cache(key, value, kv[:, 0], kv[:, 1], slots, "fp8", 0.5, v_scale, layout=layout)
    with no_sync_no_alloc(monkeypatch):
        ss.reshape_and_cache(key, value, kv[:, 0], kv[:, 1], slots, "fp8", 0.5, v_scale, layout=layout)
    bits = kv.view(torch.uint8)
    expected = torch.full(shape, float("nan")).to(torch.float8_e4m3fn).view(torch.uint8)
    for t, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        page, offset = divmod(slot, PAGE)
        k_bits = (key[t].float() / 0.5).to(torch.float8_e4m3fn).view(torch.uint8)
        v_bits = (value[t].float() / 0.25).to(torch.float8_e4m3fn).view(torch.uint8)
        if layout == "NHD":
            expected[page, 0, offset], expected[page, 1, offset] = k_bits, v_bits
        else:
            expected[page, 0, :, offset], expected[page, 1, :, offset] = k_bits, v_bits
    assert torch.equal(bits, expected)


def test_reshape_and_cache_op_is_vllms_call(rng):
    key = torch.from_numpy(rng.standard_normal((4, HKV, D)).astype(np.float32)).to(torch.float16)
    value = -key
    k_cache = torch.full((8, PAGE, HKV, D), float("nan"), dtype=torch.float16)
    v_cache = k_cache.clone()
    slots = torch.tensor([3, 100, -1, 17], dtype=torch.int64)
    torch.ops.slimserve.reshape_and_cache(key, value, k_cache, v_cache, slots, "auto", None, None)
    flat_k, flat_v = k_cache.view(-1, HKV, D), v_cache.view(-1, HKV, D)
    keep = torch.tensor([0, 1, 3])
    assert torch.equal(flat_k[slots[keep]], key[keep]) and torch.equal(flat_v[slots[keep]], value[keep])
    assert int(torch.isnan(flat_k).any(dim=(1, 2)).sum()) == 8 * PAGE - 3
    with pytest.raises(ss.SlimserveTypeError, match="slot_mapping has dtype int32"):
        torch.ops.slimserve.reshape_and_cache(key, value, k_cache, v_cache, slots.to(torch.int32), "auto", None,
                                              None)
    torch.ops.slimserve.reshape_and_cache_layout(key, value, k_cache.transpose(1, 2).contiguous(),
                                                 v_cache.transpose(1, 2).contiguous(), slots, "auto", None, None,
                                                 "HND")
