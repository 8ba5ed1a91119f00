"""The plugin's pieces without vLLM running: the start-up refusals, and vLLM's per-layer cache
tensor written by the step's append plan and read by paged attention, compared element by
element with a float64 reference computed from the (already rounded) K/V it was given; the
host attention mode (SLIMSERVE_ATTENTION=host) over the same pages against the same reference;
NVFP4 pages, plain and Hadamard-rotated (keys; keys and values), against the stored codes.
Run by run.sh in build/vllm-env (PyTorch + slimserve over the emulated library):
    python test_layout.py"""
import math
import os
import sys

import numpy as np
import torch

import slimserve as _s
from slimserve.vllm import host_attention, support
from slimserve.vllm.impl import _rows
from slimserve.vllm.layout import LayerCache
from slimserve.vllm.metadata import StepPlanner

FP8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def expect_refusal(fn, *words):
    try:
        fn()
    except support.UnsupportedConfiguration as error:
        assert all(w in str(error) for w in words), f"message {error} lacks {words}"
        return
    raise AssertionError(f"{fn} was not refused")


def refusals():
    layer = dict(num_heads=9, num_kv_heads=3, head_size=64, kv_cache_dtype="auto", sliding_window=None,
                 alibi_slopes=None, logits_soft_cap=None, attn_type="decoder", sinks=None,
                 kv_sharing_target_layer_name=None)
    assert support.check_layer(**layer) == "auto"
    assert support.check_layer(**{**layer, "kv_cache_dtype": "fp8"}) == "fp8_e4m3"
    assert support.check_layer(**{**layer, "kv_cache_dtype": "nvfp4"}) == "nvfp4"
    expect_refusal(lambda: support.check_layer(**{**layer, "kv_cache_dtype": "nvfp4", "head_size": 96}),
                   "head size with kv_cache_dtype nvfp4: 96", "64, 128, 192, 256")
    expect_refusal(lambda: support.check_layer(**{**layer, "head_size": 80}), "head size 80", "64, 96, 128")
    expect_refusal(lambda: support.check_layer(**{**layer, "sliding_window": 4096}), "sliding window 4096")
    expect_refusal(lambda: support.check_layer(**{**layer, "kv_cache_dtype": "int8"}), "'int8'", "fp8_e5m2")
    expect_refusal(lambda: support.check_layer(**{**layer, "logits_soft_cap": 30.0}), "soft cap")
    expect_refusal(lambda: support.check_layer(**{**layer, "attn_type": "encoder_only"}), "attention type")
    expect_refusal(lambda: support.check_model(dtype=torch.float32, block_size=128, head_size=64), "model dtype")
    expect_refusal(lambda: support.check_model(dtype=torch.bfloat16, block_size=16, head_size=64),
                   "block size 16", "32, 64, 128")
    saved = os.environ.get(host_attention.ENV)
    try:
        os.environ[host_attention.ENV] = "gpu"
        host_attention.mode()
    except ValueError as error:
        assert "'gpu'" in str(error) and "kernel, host" in str(error), f"message {error}"
    else:
        raise AssertionError("SLIMSERVE_ATTENTION=gpu was not refused")
    finally:
        if saved is None:
            del os.environ[host_attention.ENV]
        else:
            os.environ[host_attention.ENV] = saved
    print("refusals: 11 checked")


E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])


def e4m3_value(code: int) -> float:
    """E4M3 (fn) by its definition: bias 7, subnormals at exponent field 0, 0x7f/0xff NaN."""
    sign = -1.0 if code & 0x80 else 1.0
    e, m = (code >> 3) & 0xF, code & 0x7
    if e == 0xF and m == 0x7:
        return float("nan")
    return sign * (m / 8 * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))


def decode_nvfp4(vector: np.ndarray, tensor_scale: float) -> np.ndarray:
    """One stored NVFP4 head vector (9 D / 16 bytes) as float64 values, from the format's
    definition (written here, not the library's codec): codes two to a byte, low nibble first,
    then an E4M3 scale per 16 elements."""
    d = vector.size * 16 // 9
    codes = np.stack([vector[: d // 2] & 0xF, vector[: d // 2] >> 4], axis=1).reshape(-1)
    blocks = np.array([e4m3_value(int(c)) for c in vector[d // 2:]])
    return E2M1[codes] * np.repeat(blocks, 16) * tensor_scale


def hadamard(d: int) -> torch.Tensor:
    """H / sqrt(d) in float64 (Sylvester: H[i][j] = (-1)^popcount(i & j))."""
    signs = torch.tensor([[bin(a & b).count("1") % 2 for b in range(d)] for a in range(d)], dtype=torch.float64)
    return (1 - 2 * signs) / math.sqrt(d)


def one_step(rng, kv_dtype: str, block_size: int, rotation: str = "none"):
    heads, kv_heads, head = 6, 2, 64
    num_blocks = 16
    nvfp4 = kv_dtype == "nvfp4"
    vector = head // 2 + head // 16 if nvfp4 else head  # a head vector's elements (bytes for nvfp4)
    cache = torch.empty(num_blocks, kv_heads, block_size, 2 * vector,
                        dtype=torch.uint8 if kv_dtype in FP8 or nvfp4 else torch.bfloat16)
    cache.view(torch.uint8).random_(generator=torch.Generator().manual_seed(int(rng.integers(1 << 30))))
    poison = cache.clone()
    scale = (0.5, 0.25) if kv_dtype in FP8 else (1 / 6, 0.0123) if nvfp4 else (None, None)
    scales = [torch.tensor([s], dtype=torch.float32) if s else None for s in scale]
    layer = LayerCache(cache, kv_dtype=kv_dtype, k_scale=scales[0], v_scale=scales[1])
    # Ragged requests: new tokens at the end of cached prefixes (decode, chunk, prefill);
    # pages shuffled with holes, block 0 never used (vLLM's null block).
    seq_lens = [1, block_size - 1, block_size, block_size + 1, 2 * block_size + 3]
    new = [1, 5, block_size, 1, 7]
    order = rng.permutation(np.arange(1, num_blocks))
    tables, used = [], 0
    for length in seq_lens:
        count = math.ceil(length / block_size)
        tables.append(list(order[used:used + count]))
        used += count + 1  # a hole after each request
    width = max(len(t) for t in tables)
    block_table = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    # Every position of every request is written (the prefix as an earlier step would have).
    slots, keys, values, which = [], [], [], []
    for r, (length, table) in enumerate(zip(seq_lens, tables)):
        for pos in range(length):
            slots.append(int(table[pos // block_size]) * block_size + pos % block_size)
            which.append((r, pos))
    slots.insert(3, -1)  # a padded token: nothing written
    which.insert(3, None)
    k = torch.from_numpy(rng.standard_normal((len(slots), kv_heads, head), dtype=np.float32)).to(torch.bfloat16)
    v = torch.from_numpy(rng.standard_normal((len(slots), kv_heads, head), dtype=np.float32)).to(torch.bfloat16)
    planner = StepPlanner(num_heads=heads, num_kv_heads=kv_heads, head_size=head, block_size=block_size,
                          kv_dtype=kv_dtype, activation="bfloat16", max_num_seqs=8, max_num_tokens=len(slots),
                          max_model_len=width * block_size)
    qo = np.concatenate([[0], np.cumsum(new)])
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    planner.plan(query_start_loc_cpu=torch.tensor(qo, dtype=torch.int32), seq_lens=lens, block_table=block_table,
                 num_reqs=len(seq_lens))
    # The append as do_kv_cache_update makes it: K/V rows handed as strided views of a fused
    # [tokens, q | k | v] projection (vLLM's), read in place (no copy), vLLM's int64 slots too.
    poison_q = torch.full((len(slots), heads * head), float("nan"), dtype=torch.bfloat16)
    fused = torch.cat([poison_q, k.view(len(slots), -1), v.view(len(slots), -1)], dim=1)
    q_size, kv_size = heads * head, kv_heads * head
    k_view, v_view = fused[:, q_size:q_size + kv_size], fused[:, q_size + kv_size:]
    assert k_view.stride(0) == q_size + 2 * kv_size and not k_view.is_contiguous()
    kr, vr = layer.attention.check_rows(_rows(k_view, kv_heads, head), _rows(v_view, kv_heads, head),
                                        "key", "value", strided=True)
    assert kr.ptr == k_view.data_ptr() and vr.ptr == v_view.data_ptr()  # in place, no staging copy
    slot_tensor = torch.tensor(slots, dtype=torch.int64)
    _s._kv_append(layer.attention, kr, vr, _s.ACTIVATION_DTYPES["bfloat16"],
                  slot_mapping=_s._tensor(slot_tensor, name="slot_mapping", dtypes={"int64"}).ptr,
                  names=("key", "value"), rotation=rotation)
    # Blocks no request uses keep their bytes.
    untouched = sorted(set(range(num_blocks)) - {int(b) for t in tables for b in t})
    changed = [b for b in untouched if not torch.equal(cache[b].view(torch.uint8), poison[b].view(torch.uint8))]
    assert not changed, f"append wrote blocks {changed}, which no request holds (tables {tables})"
    q = torch.from_numpy(rng.standard_normal((int(qo[-1]), heads, head), dtype=np.float32)).to(torch.bfloat16)
    out = torch.full_like(q, float("nan"))
    # With rotated pages, what the plugin's forward does (rotation.py): queries rotated first,
    # and with rotated values the output rotated back.
    q_attend = _s.rotate_heads(q, torch.empty_like(q)) if rotation != "none" else q
    torch.ops.slimserve.paged_attention_run(q_attend, layer.pages, None, block_table, lens, out, None,
                                            planner.attention.id, kv_dtype, "NHD", 1 / math.sqrt(head),
                                            layer.k_scale, layer.v_scale)
    if rotation == "keys_and_values":
        _s.rotate_heads(out)

    # The host attention mode (SLIMSERVE_ATTENTION=host) over the same pages.
    host = torch.full_like(q, float("nan"))
    host_attention.attend(q=q_attend, out=host, pages=layer.pages, kv_dtype=kv_dtype, k_scale=layer.k_scale,
                          v_scale=layer.v_scale, k_token_scales=None, v_token_scales=None, query_start_loc=qo,
                          seq_lens=seq_lens, block_table=block_table, num_reqs=len(seq_lens),
                          sm_scale=1 / math.sqrt(head), statuses=None)
    if rotation == "keys_and_values":
        _s.rotate_heads(host)
    assert rotation == "none" or nvfp4, "the reference reads rotated pages for nvfp4 only"
    rotate = hadamard(head)  # symmetric: x @ rotate is each head vector rotated
    rotated_sides = {"none": (), "keys": (0,), "keys_and_values": (0, 1)}[rotation]

    def stored(x, s):  # what the cache holds, as real values
        x = x.double()
        if kv_dtype in FP8:
            return (x / s).to(torch.float32).to(FP8[kv_dtype]).double() * s
        return x

    if nvfp4:
        # The reference reads the stored codes and scales (the append's own rule is checked bit
        # for bit by the C++ tests): each vector decoded by the definition, and checked to be
        # the input within NVFP4's error (half a step of its block's E2M1 grid, scale rounding
        # included: 1/4 of the block's amax, plus E4M3's 1/16 relative rounding of the scale).
        raw = cache.view(torch.uint8).view(num_blocks, 2, block_size, kv_heads, vector).numpy()
        kk, vv = {}, {}
        for i, w in enumerate(which):
            if not w:
                continue
            block, row = divmod(slots[i], block_size)
            for side, (src, dst, s) in enumerate(((k, kk, scale[0]), (v, vv, scale[1]))):
                real = np.stack([decode_nvfp4(raw[block, side, row, h], s) for h in range(kv_heads)])
                given = (src[i].double() @ rotate if side in rotated_sides else src[i].double()).numpy()
                amax = np.abs(given.reshape(kv_heads, -1, 16)).max(axis=2).repeat(16, axis=1)
                assert (np.abs(real - given) <= amax * (0.25 + 1 / 16) + 1e-6).all(), f"nvfp4 token {w} side {side}"
                dst[w] = torch.from_numpy(real)
    else:
        kk = {w: stored(k[i], scale[0]) for i, w in enumerate(which) if w}
        vv = {w: stored(v[i], scale[1]) for i, w in enumerate(which) if w}
    worst = worst_host = 0.0
    for r, (length, n) in enumerate(zip(seq_lens, new)):
        K = torch.stack([kk[(r, p)] for p in range(length)]).repeat_interleave(heads // kv_heads, 1)
        V = torch.stack([vv[(r, p)] for p in range(length)]).repeat_interleave(heads // kv_heads, 1)
        for i in range(n):
            pos = length - n + i
            qi = q[qo[r] + i].double()
            qi = qi @ rotate if rotation != "none" else qi  # the pages' basis
            s = torch.einsum("hd,khd->hk", qi, K[: pos + 1]) / math.sqrt(head)
            ref = torch.einsum("hk,khd->hd", s.softmax(-1), V[: pos + 1])
            ref = ref @ rotate if rotation == "keys_and_values" else ref  # back to the model's basis
            got = out[qo[r] + i].double()
            err = (got - ref).abs().max().item()
            worst = max(worst, err)
            assert math.isfinite(err) and err < 2e-2, f"{kv_dtype} block {block_size} request {r} row {i}: error {err}"
            # Host mode: float32 throughout, then one BF16 rounding of the output: within half a
            # BF16 ulp of the reference, element by element (2^-8 relative, float32's error aside).
            diff = (host[qo[r] + i].double() - ref).abs()
            # (rotated: the queries and the output carry one more BF16 rounding each, as in kernel mode)
            allowed = 2.0 ** -8 * 1.001 * ref.abs() + 1e-5 if rotation == "none" else torch.full_like(ref, 2e-2)
            excess = (diff - allowed).max().item()
            worst_host = max(worst_host, diff.max().item())
            assert math.isfinite(excess) and excess <= 0, \
                f"host mode {kv_dtype} block {block_size} request {r} row {i}: error {diff.max().item()} past half an ulp"
    print(f"layout {kv_dtype}{'' if rotation == 'none' else ' rotation ' + rotation} block {block_size}: {int(qo[-1])} query rows over {len(seq_lens)} requests, "
          f"worst |error| {worst:.2e} (host mode {worst_host:.2e})")


def main():
    seed = int(os.environ.get("SLIMSERVE_TEST_SEED", np.random.SeedSequence().entropy % 2**32))
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    refusals()
    for kv_dtype in ("bfloat16", "fp8_e4m3", "fp8_e5m2", "nvfp4"):
        for block_size in (32, 128):
            one_step(rng, kv_dtype, block_size)
    for rotation in ("keys", "keys_and_values"):  # rotated 4-bit pages, as SLIMSERVE_KV_ROTATION writes them
        one_step(rng, "nvfp4", 32, rotation)
    return 0


if __name__ == "__main__":
    sys.exit(main())
