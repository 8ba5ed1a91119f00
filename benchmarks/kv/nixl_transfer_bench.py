#!/usr/bin/env python3
"""Throughput of one request's KV pages between two processes over NIXL (UCX), against NIXL
moving the same bytes as one contiguous buffer in the same run, and the per-request setup cost.

    UCX_NET_DEVICES=lo build/pyenv/bin/python-cuda benchmarks/kv/nixl_transfer_bench.py \
        [--tokens 32768] [--repeats 7] [--json out.json]

Two caches, one per process: a paged FP8 e4m3 cache with per-token scales (8 KV heads, head_dim
128, 16-token pages: 2 KiB + 64 B per token) and an MLA latent cache (FP8 e4m3 with per-128
group scales, 656 B per token, 64-token pages). Each cache has room for the request three times
over. Three page tables per cache, each for the request's pages in the prefill cache and for the
pages the decode pool handed out: scattered (every other page, shuffled: no two touch, the worst
case), realistic (runs of geometric lengths, mean --mean-run pages, ascending or descending as
a LIFO free list hands them out, 1-3 other pages between runs, the runs shuffled) and runs (one
run on both sides). Each is moved four ways: "before" (the reserved pages mapped in ascending
order to the source ids, the per-array transfer list, prepared indices in sequence order) and
"after" (match_page_runs, coalesce, prepared indices sorted by source id: what DecodeSide does
now), each as the request's own list and over the prepared descriptor lists; the descriptor
counts are after every merge (coalesce's rows; NIXL's merge of consecutive prepared indices).
Measured by the decode process for each case: NIXL READ
(the decode side pulls) and WRITE (pushes; the same NIXL operation a prefill side that writes
would post), the median of --repeats transfers, and the same bytes as one contiguous buffer
(one descriptor) between the same two processes, interleaved with them. Setup: the layout's
serialization + parse + compatibility check (descriptor exchange, without the network), the
transfer list, and NIXL's descriptor lists + transfer request, each the median over 200 runs.
Also the end-to-end DecodeSide.receive of the request (reserve, messages, read, verdict,
publish). With the emulated library the caches are host memory ("DRAM"); with the CUDA build
the same code registers GPU memory ("VRAM").
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import time

import numpy as np

os.environ.setdefault("UCX_NET_DEVICES", "lo")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

HEADS, DIM, PAGE, MLA_PAGE = 8, 128, 16, 64


def make_caches(tokens: int, scales: str = "per_token", alloc: str = "separate"):
    """(paged cache, its arrays, MLA cache, its array) with room for 3 requests of `tokens`."""
    import slimserve as ss
    from slimserve.attention import MlaCache, mla_record_bytes
    pages = 3 * -(-tokens // PAGE) + 1
    shape = (pages, PAGE, HEADS, DIM)
    rng = np.random.default_rng(1)
    k = rng.integers(0, 255, shape, dtype=np.uint8)
    v = rng.integers(0, 255, shape, dtype=np.uint8)
    ks = rng.random(shape[:3], dtype=np.float32)
    vs = rng.random(shape[:3], dtype=np.float32)
    if alloc == "combined":  # one allocation, each page's K then its V: one piece per page for both
        kv = np.ascontiguousarray(np.stack([k, v], axis=1))
        k, v = kv, None
    scale_args = (dict(k_token_scales=ks, v_token_scales=vs) if scales == "per_token"
                  else dict(k_scale=0.5, v_scale=0.5))
    paged = ss.PagedKVCache(k, v, dtype="fp8_e4m3", **scale_args)
    mla_pages = 3 * -(-tokens // MLA_PAGE) + 1
    record = mla_record_bytes("fp8_e4m3", "per_token_group")
    latent = rng.integers(0, 255, (mla_pages, MLA_PAGE, record), dtype=np.uint8)
    mla = MlaCache(latent, kv_dtype="fp8_e4m3", scale_mode="per_token_group")
    return paged, [k, v, ks, vs], mla, [latent]


def page_lists(num_pages: int, capacity: int, case: str, seed: int, mean_run: float = 4.0):
    """The request's page ids in one cache, sequence order. scattered: every other page,
    shuffled (no two touch: the worst case); runs: consecutive pages; realistic: what a LIFO
    free list hands out after churn: runs of geometric lengths (mean `mean_run`, at most 64),
    each ascending or descending, 1-3 pages of other requests between runs, the runs in
    shuffled order."""
    rng = np.random.default_rng(seed)
    if case == "runs":
        return np.arange(1, num_pages + 1, dtype=np.int32)
    if case == "scattered":
        ids = np.arange(1, capacity, 2, dtype=np.int32)[:num_pages]
        return rng.permutation(ids).astype(np.int32)
    runs, start, left = [], 1, num_pages
    while left:
        length = int(min(left, 64, rng.geometric(1.0 / mean_run)))
        run = np.arange(start, start + length, dtype=np.int32)
        runs.append(run[::-1] if rng.random() < 0.5 else run)
        start, left = start + length + int(rng.integers(1, 4)), left - length
    assert start <= capacity, "the cache is too small for this table"
    return np.concatenate([runs[i] for i in rng.permutation(len(runs))])


def sorted_mapping(src_ids: np.ndarray, reserved: np.ndarray) -> np.ndarray:
    """The mapping DecodeSide used before match_page_runs: the reserved pages in ascending
    order to the request's pages in the order of their source ids (for the "before" figures)."""
    out = np.empty_like(src_ids)
    out[np.argsort(src_ids, kind="stable")] = np.sort(reserved)
    return out


def runs_of(*id_arrays) -> int:
    """Pieces per array NIXL makes of a prepared transfer whose index arrays list these page
    ids in this order: it merges an index into the previous one when both sides continue it."""
    breaks = np.zeros(id_arrays[0].size - 1, bool)
    for ids in id_arrays:
        breaks |= np.diff(ids) != 1
    return 1 + int(np.count_nonzero(breaks))


def peer(conn, tokens: int, scales: str, alloc: str) -> None:
    """The prefill process: both caches registered, offers over the protocol on request."""
    sys.modules.setdefault("torch", None)  # slimserve without its torch.library ops: no PyTorch import
    import slimserve as ss
    from slimserve.nixl import PrefillSide
    paged, _, mla, _ = make_caches(tokens, scales, alloc)
    sides = {}
    for name, cache in (("paged", paged), ("mla", mla)):
        pool = ss.PagePool(cache.view.num_pages)
        sides[name] = (PrefillSide(f"prefill-{name}", pool, cache), pool)
    conn.send({name: (side.metadata(), side.layout.to_bytes()) for name, (side, _) in sides.items()})
    for name, metadata in conn.recv().items():
        sides[name][0].connect(metadata)
    conn.send("ready")
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if conn.poll(0):
            command, *args = conn.recv()
            if command == "stop":
                break
            if command == "offer":  # a request of all the pool's first pages
                name, transfer_id, num_tokens = args
                side, pool = sides[name]
                pages = pool.allocate(-(-num_tokens // side.layout.page_size))
                side.offer(transfer_id, pages, num_tokens)
                conn.send("offered")
        for side, _ in sides.values():
            side.poll()
        time.sleep(0.0002)
    for side, _ in sides.values():
        side.close()


def timed(agent, op, local, remote, peer_name):
    return timed_handle(agent, agent.initialize_xfer(op, local, remote, peer_name))


def timed_handle(agent, handle):
    t0 = time.perf_counter()
    state = agent.transfer(handle)
    while state == "PROC":
        state = agent.check_xfer_state(handle)
    elapsed = time.perf_counter() - t0
    assert state == "DONE", state
    agent.release_xfer_handle(handle)
    return elapsed


def median_us(fn, runs=200):
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def bench_cache(name, side, remote_name, remote_layout_bytes, arrays, tokens, repeats, conn, mean_run=4.0):
    import slimserve as ss  # noqa: F401
    from slimserve.kv_transfer import CacheLayout, coalesce, match_page_runs, transfer_list
    local_layout = side.layout
    remote_layout = CacheLayout.from_bytes(remote_layout_bytes)
    page_size = local_layout.page_size
    num_pages = -(-tokens // page_size)
    capacity = local_layout.num_pages
    total = local_layout.request_bytes(tokens)
    agent, mem = side.agent, side.mem_type
    result = {"cache": name, "tokens": tokens, "bytes": total, "pages": num_pages}
    # Setup cost, per request.
    wire = local_layout.to_bytes()
    result["descriptor_exchange_us"] = median_us(lambda: local_layout.check_compatible(CacheLayout.from_bytes(wire)))
    src = page_lists(num_pages, capacity, "scattered", 2)
    dst = page_lists(num_pages, capacity, "scattered", 3)
    result["list_build_scattered_us"] = median_us(lambda: transfer_list(remote_layout, src, local_layout, dst, tokens))
    result["coalesce_scattered_us"] = median_us(lambda: coalesce(transfer_list(remote_layout, src, local_layout, dst, tokens)))
    result["match_page_runs_scattered_us"] = median_us(lambda: match_page_runs(src, dst), 50)
    rows = transfer_list(remote_layout, src, local_layout, dst, tokens)

    def descs(r):
        dev = np.zeros(len(r), np.uint64)
        return (agent.get_xfer_descs(np.stack([r[:, 1], r[:, 2], dev], 1), mem),
                agent.get_xfer_descs(np.stack([r[:, 0], r[:, 2], dev], 1), mem))

    def prep():
        local, far = descs(rows)
        agent.release_xfer_handle(agent.initialize_xfer("READ", local, far, remote_name))
    result["nixl_request_scattered_us"] = median_us(prep, 50)
    # The same request over the descriptor lists DecodeSide prepared once per cache: indices only.
    merged = side._kv_interleaved(local_layout) and side._kv_interleaved(remote_layout)
    pieces = len(side._pieces(local_layout, merged))
    t0 = time.perf_counter()
    side._prepared_list(remote_name, remote_layout, merged)
    result["nixl_prepare_remote_once_us"] = (time.perf_counter() - t0) * 1e6

    def prepped(op, s, d):  # after: sorted by source id (DecodeSide._prepared_xfer)
        return side._prepared_xfer(op, remote_name, remote_layout, s, d)[0]

    def prepped_before(op, s, d):  # before: the request's sequence order
        arrays = np.arange(pieces, dtype=np.int64)[:, None]
        local = (arrays * local_layout.num_pages + d[None, :]).ravel().astype(np.int32)
        far = (arrays * remote_layout.num_pages + s[None, :]).ravel().astype(np.int32)
        return agent.make_prepped_xfer(op, side._prepared_list("NIXL_INIT_AGENT", local_layout, merged), local,
                                       side._prepared_list(remote_name, remote_layout, merged), far, b"")
    result["nixl_prepped_request_scattered_us"] = median_us(lambda: agent.release_xfer_handle(prepped("READ", src, dst)), 50)
    # One contiguous buffer of the same bytes in each process: the start of each cache's largest region.
    base_local = max(local_layout.regions(), key=lambda r: r[1])[0]
    base_remote = max(remote_layout.regions(), key=lambda r: r[1])[0]
    one = np.array([[base_remote, base_local, total]], np.uint64)
    for case in ("scattered", "realistic", "runs"):
        s = page_lists(num_pages, capacity, case, 2, mean_run)
        reserved = page_lists(num_pages, capacity, case, 3, mean_run)  # what the decode pool handed out
        d_before, d_after = sorted_mapping(s, reserved), match_page_runs(s, reserved)
        r_before = transfer_list(remote_layout, s, local_layout, d_before, tokens)
        r_after = coalesce(transfer_list(remote_layout, s, local_layout, d_after, tokens))
        assert int(r_before[:, 2].sum()) == int(r_after[:, 2].sum()) == total
        order = np.argsort(s, kind="stable")
        result[f"descriptors_{case}"] = {
            "list_before": len(r_before), "list_after": len(r_after),
            "prepared_before": pieces * runs_of(s, d_before), "prepared_after": pieces * runs_of(s[order], d_after[order])}
        contiguous = descs(one)
        methods = {"list_before": lambda op, lists=descs(r_before): agent.initialize_xfer(op, *lists, remote_name),
                   "list_after": lambda op, lists=descs(r_after): agent.initialize_xfer(op, *lists, remote_name),
                   "prepared_before": lambda op: prepped_before(op, s, d_before),
                   "prepared_after": lambda op: prepped(op, s, d_after)}
        for op in ("READ", "WRITE"):
            times = {m: [] for m in methods}
            flat_t = []
            timed(agent, op, *contiguous, remote_name)  # warm-up (connection, registration caches)
            for make in methods.values():
                timed_handle(agent, make(op))
            for _ in range(repeats):  # interleaved, so all see the same machine
                flat_t.append(timed(agent, op, *contiguous, remote_name))
                for m, make in methods.items():
                    times[m].append(timed_handle(agent, make(op)))
            f = statistics.median(flat_t)
            result[f"{op.lower()}_contiguous_gbps_{case}"] = total / f / 1e9
            for m in methods:
                result[f"{op.lower()}_{case}_{m}_ratio"] = f / statistics.median(times[m])
    # End to end through the protocol.
    e2e = []
    for i in range(3):
        conn.send(("offer", name, 100 + i, tokens))
        assert conn.recv() == "offered"
        t0 = time.perf_counter()
        pages = side.receive(remote_name, 100 + i, tokens, timeout_s=60)
        e2e.append(time.perf_counter() - t0)
        result["receive_read_gbps"] = total / side.last_stats["read_s"] / 1e9
        result["receive_setup_us"] = side.last_stats["setup_us"]
        side.pool.release(pages)
    result["receive_total_ms"] = statistics.median(e2e) * 1e3
    return result


def descriptor_counts(layout, tokens: int, case: str, mean_run: float) -> dict:
    """Descriptors of one request before and after (as bench_cache counts them), no transfer."""
    from slimserve.kv_transfer import coalesce, match_page_runs, transfer_list
    from slimserve.nixl import DecodeSide
    num_pages, capacity = -(-tokens // layout.page_size), layout.num_pages
    s = page_lists(num_pages, capacity, case, 2, mean_run)
    reserved = page_lists(num_pages, capacity, case, 3, mean_run)
    d_before, d_after = sorted_mapping(s, reserved), match_page_runs(s, reserved)
    pieces = len(DecodeSide._pieces(layout, DecodeSide._kv_interleaved(layout)))
    order = np.argsort(s, kind="stable")
    return {"list_before": len(transfer_list(layout, s, layout, d_before, tokens)),
            "list_after": len(coalesce(transfer_list(layout, s, layout, d_after, tokens))),
            "prepared_before": pieces * runs_of(s, d_before),
            "prepared_after": pieces * runs_of(s[order], d_after[order])}


def print_counts(tokens: int) -> int:
    from slimserve.kv_transfer import CacheLayout
    print(f"descriptors of one {tokens}-token request (list before/after, prepared before/after)")
    for scales, alloc in (("per_token", "separate"), ("per_token", "combined"), ("per_tensor", "combined")):
        paged, _, mla, _ = make_caches(tokens, scales, alloc)
        for name, cache in ((f"paged {scales} {alloc}", paged), ("mla", mla)):
            if name == "mla" and alloc != "separate":
                continue
            layout = CacheLayout.of(cache)
            cells = []
            for case, mean in (("scattered", 1), ("realistic", 2), ("realistic", 4), ("realistic", 8), ("realistic", 16)):
                n = descriptor_counts(layout, tokens, case, mean)
                label = "scattered" if case == "scattered" else f"mean run {mean}"
                cells.append(f"{label}: {n['list_before']}/{n['list_after']}, {n['prepared_before']}/{n['prepared_after']}")
            print(f"  {name}: " + "; ".join(cells))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", help="write the results here too")
    parser.add_argument("--mean-run", type=float, default=4.0,
                        help="the realistic page tables' mean run length (pages adjacent in the pool)")
    parser.add_argument("--paged-scales", choices=("per_token", "per_tensor"), default="per_token",
                        help="the paged cache's FP8 scales: per-token arrays (moved with the pages) or one per tensor")
    parser.add_argument("--paged-alloc", choices=("separate", "combined"), default="separate",
                        help="the paged cache's K and V: two arrays, or one allocation with each page's K then V")
    parser.add_argument("--counts-only", action="store_true",
                        help="only the descriptor counts of the page tables (before/after), for mean runs 2-16; no NIXL")
    args = parser.parse_args()
    if args.counts_only:
        return print_counts(args.tokens)
    import slimserve as ss
    from slimserve.nixl import DecodeSide
    context = multiprocessing.get_context("spawn")
    conn, child = context.Pipe()
    process = context.Process(target=peer, args=(child, args.tokens, args.paged_scales, args.paged_alloc), daemon=True)
    process.start()
    paged, paged_arrays, mla, mla_arrays = make_caches(args.tokens, args.paged_scales, args.paged_alloc)
    remote = conn.recv()
    sides = {}
    for name, cache in (("paged", paged), ("mla", mla)):
        sides[name] = DecodeSide(f"decode-{name}", ss.PagePool(cache.view.num_pages), cache)
    conn.send({name: side.metadata() for name, side in sides.items()})
    names = {name: side.connect(remote[name][0]) for name, side in sides.items()}
    assert conn.recv() == "ready"
    results = []
    for name, arrays in (("paged", paged_arrays), ("mla", mla_arrays)):
        results.append(bench_cache(name, sides[name], names[name], remote[name][1], arrays, args.tokens,
                                   args.repeats, conn, args.mean_run))
    conn.send(("stop",))
    process.join(10)
    print(f"memory: {sides['paged'].mem_type}, emulated library: {ss.EMULATED}, load average {os.getloadavg()[0]:.1f}")
    for r in results:
        print(f"\n{r['cache']}: {r['tokens']} tokens, {r['bytes'] / 2**20:.1f} MiB in {r['pages']} pages")
        for case in ("scattered", "realistic", "runs"):
            n = r["descriptors_" + case]
            print(f"  {case:9s} contiguous READ {r['read_contiguous_gbps_' + case]:.2f} GB/s, "
                  f"WRITE {r['write_contiguous_gbps_' + case]:.2f} GB/s")
            for m in ("list_before", "list_after", "prepared_before", "prepared_after"):
                print(f"    {m:15s} {n[m]:5d} descriptors: READ ratio {r['read_' + case + '_' + m + '_ratio']:.2f}, "
                      f"WRITE {r['write_' + case + '_' + m + '_ratio']:.2f}")
        print(f"  setup: descriptor exchange {r['descriptor_exchange_us']:.1f} us, list {r['list_build_scattered_us']:.1f} us"
              f" ({r['coalesce_scattered_us']:.1f} us coalesced), match_page_runs {r['match_page_runs_scattered_us']:.1f} us,"
              f" NIXL request {r['nixl_request_scattered_us']:.1f} us (scattered); prepared lists: request "
              f"{r['nixl_prepped_request_scattered_us']:.1f} us, the peer's list prepared once "
              f"{r['nixl_prepare_remote_once_us']:.0f} us")
        print(f"  receive(): {r['receive_total_ms']:.1f} ms end to end, read {r['receive_read_gbps']:.2f} GB/s, "
              f"setup {r['receive_setup_us']:.0f} us")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    for side in sides.values():
        side.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
