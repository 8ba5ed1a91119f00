"""slimserve.vllm.per_token on its own (no model, no engine; a few seconds): the per-token FP8
attention layer's do_kv_cache_update and forward, called as vLLM calls them, over a vLLM-shaped
cache tensor (poisoned) with K/V handed as strided views of a fused QKV output.
  - every written (token, KV head) holds the FP8 codes of k / s and the float32 scale s =
    amax / the format's max, bit for bit (the scale computed here in float32, the codes by
    PyTorch's own FP8 rounding), an outlier token included (a per-tensor scale of 1 would
    saturate it);
  - every byte of the blocks and scale entries no token was written to is unchanged;
  - forward's output equals, within 2e-2, a float64 attention over the stored values (codes
    times their scales), causal within each request's new tokens;
  - a non-FP8 kv_cache_dtype is refused when the layer is made.
Run by run.sh in build/vllm-env:  python test_per_token.py"""
import math
import os
import sys

import numpy as np
import torch

from slimserve.vllm import support
from slimserve.vllm.impl import set_current
from slimserve.vllm.metadata import SlimserveMetadata, StepPlanner
from slimserve.vllm.per_token import SlimservePerTokenAttentionImpl

FP8 = {"fp8_e4m3": (torch.float8_e4m3fn, 448.0), "fp8_e5m2": (torch.float8_e5m2, 57344.0)}
HEADS, KV_HEADS, HEAD = 6, 2, 64


def make_impl(kv_cache_dtype: str) -> SlimservePerTokenAttentionImpl:
    return SlimservePerTokenAttentionImpl(num_heads=HEADS, head_size=HEAD, scale=1 / math.sqrt(HEAD),
                                          num_kv_heads=KV_HEADS, alibi_slopes=None, sliding_window=None,
                                          kv_cache_dtype=kv_cache_dtype)


def refusal() -> None:
    try:
        make_impl("auto")
    except support.UnsupportedConfiguration as error:
        assert "SLIMSERVE_KV_SCALES=per_token" in str(error) and "fp8_e5m2" in str(error), str(error)
    else:
        raise AssertionError("a BF16 cache with per-token scales was not refused")


def one_step(rng, kv_dtype: str, block_size: int) -> None:
    fp8, fmax = FP8[kv_dtype]
    num_blocks = 12
    kv_cache = torch.empty(num_blocks, KV_HEADS, block_size, 2 * HEAD, dtype=torch.uint8)
    kv_cache.random_(generator=torch.Generator().manual_seed(int(rng.integers(1 << 30))))
    poison = kv_cache.clone()
    impl = make_impl(kv_dtype)
    # Ragged requests over shuffled blocks with holes (block 0: vLLM's null block): every
    # position written in this step, as a prefix from earlier steps would have been.
    seq_lens = [1, block_size - 1, block_size + 1, 2 * block_size + 3]
    new = [1, 4, block_size + 1, 2]
    order = rng.permutation(np.arange(1, num_blocks))
    tables, used = [], 0
    for length in seq_lens:
        count = -(-length // block_size)
        tables.append([int(b) for b in order[used:used + count]])
        used += count + 1
    width = max(len(t) for t in tables)
    block_table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    slots, which = [], []
    for r, (length, table) in enumerate(zip(seq_lens, tables)):
        for pos in range(length):
            slots.append(table[pos // block_size] * block_size + pos % block_size)
            which.append((r, pos))
    slots.insert(2, -1)  # a padded token: nothing written
    which.insert(2, None)
    n = len(slots)
    kv = torch.from_numpy(rng.standard_normal((2, n, KV_HEADS, HEAD), dtype=np.float32))
    kv[:, 5] *= 1000.0  # an outlier token: its own scale keeps it exact where scale 1 saturates
    kv = kv.to(torch.bfloat16)
    # vLLM's fused projection [tokens, q | k | v]; key / value are its strided slices.
    q_size, kv_size = HEADS * HEAD, KV_HEADS * HEAD
    fused = torch.full((n, q_size + 2 * kv_size), float("nan"), dtype=torch.bfloat16)
    fused[:, q_size:q_size + kv_size] = kv[0].reshape(n, kv_size)
    fused[:, q_size + kv_size:] = kv[1].reshape(n, kv_size)
    key, value = fused[:, q_size:q_size + kv_size], fused[:, q_size + kv_size:]
    slot_mapping = torch.tensor(slots, dtype=torch.int64)

    planner = StepPlanner(num_heads=HEADS, num_kv_heads=KV_HEADS, head_size=HEAD, block_size=block_size,
                          kv_dtype=kv_dtype, activation="bfloat16", max_num_seqs=8, max_num_tokens=n,
                          max_model_len=width * block_size)
    qo = np.concatenate([[0], np.cumsum(new)]).astype(np.int32)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    step = planner.plan(query_start_loc_cpu=torch.from_numpy(qo), seq_lens=lens, block_table=block_table,
                        num_reqs=len(seq_lens))
    # The append covers all n tokens; attention then runs over the step's new query rows.
    append_meta = SlimserveMetadata(num_actual_tokens=n, num_reqs=len(seq_lens), max_query_len=max(new),
                                    query_start_loc=torch.from_numpy(qo), seq_lens=lens, block_table=block_table,
                                    slot_mapping=slot_mapping, step=step, attention=planner.attention,
                                    planner=planner, extra={"vllm_slot_mapping": slot_mapping})
    set_current(append_meta)
    impl.do_kv_cache_update(None, key, value, kv_cache, slot_mapping)
    cache = impl._per_token
    assert cache is not None and cache.k_scales.shape == (num_blocks, block_size, KV_HEADS)

    # Codes and scales, bit for bit; everything else unchanged.
    pages = kv_cache.view(num_blocks, 2, block_size, KV_HEADS, HEAD)
    before = poison.view(num_blocks, 2, block_size, KV_HEADS, HEAD)
    written = torch.zeros(num_blocks, block_size, dtype=torch.bool)
    stored = {}
    for t, w in enumerate(which):
        if w is None:
            continue
        b, row = divmod(slots[t], block_size)
        written[b, row] = True
        for half, scales in ((0, cache.k_scales), (1, cache.v_scales)):
            x = kv[half, t].float()
            s = x.abs().amax(-1) / fmax  # float32, as the kernel
            codes = (x / s[:, None]).to(fp8)
            assert torch.equal(scales[b, row].view(torch.int32), s.view(torch.int32)), \
                f"{kv_dtype} token {t} {'KV'[half]} scales {scales[b, row]} want {s}"
            assert torch.equal(pages[b, half, row], codes.view(torch.uint8)), f"{kv_dtype} token {t} {'KV'[half]} codes"
            stored[(w, half)] = codes.double() * s.double()[:, None]
    for b in range(num_blocks):
        for row in range(block_size):
            if not written[b, row]:
                assert torch.equal(pages[b, :, row], before[b, :, row]), f"block {b} row {row} was written"
                assert (cache.k_scales[b, row] == 1).all() and (cache.v_scales[b, row] == 1).all()

    # forward over the step's new rows, as vLLM calls it.
    num_q = int(qo[-1])
    attn_meta = SlimserveMetadata(num_actual_tokens=num_q, num_reqs=len(seq_lens), max_query_len=max(new),
                                  query_start_loc=torch.from_numpy(qo), seq_lens=lens, block_table=block_table,
                                  slot_mapping=slot_mapping[:num_q], step=step, attention=planner.attention,
                                  planner=planner)
    query = torch.from_numpy(rng.standard_normal((num_q, HEADS * HEAD), dtype=np.float32)).to(torch.bfloat16)
    output = torch.full_like(query, float("nan"))
    impl.forward(None, query, None, None, kv_cache, attn_meta, output)
    out = output.view(num_q, HEADS, HEAD)
    worst = 0.0
    for r, (length, count) in enumerate(zip(seq_lens, new)):
        K = torch.stack([stored[((r, p), 0)] for p in range(length)]).repeat_interleave(HEADS // KV_HEADS, 1)
        V = torch.stack([stored[((r, p), 1)] for p in range(length)]).repeat_interleave(HEADS // KV_HEADS, 1)
        for i in range(count):
            pos = length - count + i
            qi = query[qo[r] + i].view(HEADS, HEAD).double()
            s = torch.einsum("hd,khd->hk", qi, K[: pos + 1]) / math.sqrt(HEAD)
            ref = torch.einsum("hk,khd->hd", s.softmax(-1), V[: pos + 1])
            err = ((out[qo[r] + i].double() - ref).abs() / (1 + ref.abs())).max().item()
            worst = max(worst, err)
            assert math.isfinite(err) and err < 2e-2, f"{kv_dtype} request {r} row {i}: error {err}"
    print(f"per_token {kv_dtype} block {block_size}: {n - 1} tokens appended (1 padded), {num_q} query rows, "
          f"codes and scales exact, worst relative error {worst:.2e}")


def main() -> int:
    seed = int(os.environ.get("SLIMSERVE_TEST_SEED", np.random.SeedSequence().entropy % 2**32))
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    refusal()
    for kv_dtype in FP8:
        one_step(rng, kv_dtype, 32)
    return 0


if __name__ == "__main__":
    sys.exit(main())
