"""The prefill engine of the NIXL tests, run in its own process: it fills pages of its own pool
and cache (emulated append_kv of K/V drawn from a seed) and offers them through
slimserve.nixl.PrefillSide; the test process is the decode engine. Commands arrive over a
multiprocessing pipe; every loop is bounded in time."""
import os
import sys
import time

import numpy as np

PAGE, HEADS, DIM = 16, 2, 64


def make_cache(num_pages: int, dtype="fp8_e4m3", page=PAGE, head_dim=DIM, fill=0xA5, combined=False):
    """A per-token-scaled FP8 (or BF16) NHD cache in host memory; the arrays ride along.
    combined: K and V in one allocation, each page's K then its V."""
    import slimserve as ss
    element = np.uint8 if dtype.startswith("fp8") else np.uint16
    shape = (num_pages, page, HEADS, head_dim)
    if combined:
        kv = np.full((num_pages, 2) + shape[1:], fill, element)
        k, v = kv[:, 0], kv[:, 1]
    else:
        k, v = np.full(shape, fill, element), np.full(shape, fill, element)
    kv_args = (kv, None) if combined else (k, v)
    if dtype.startswith("fp8"):
        ks, vs = np.full(shape[:3], -1.0, np.float32), np.full(shape[:3], -1.0, np.float32)
        cache = ss.PagedKVCache(*kv_args, dtype=dtype, k_token_scales=ks, v_token_scales=vs)
        return cache, [k, v, ks, vs]
    return ss.PagedKVCache(*kv_args, dtype=dtype), [k, v]


def request_kv(seed: int, num_tokens: int, head_dim=DIM):
    """The K/V rows (float16) both processes derive from a request's seed."""
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((num_tokens, HEADS, head_dim)).astype(np.float16)
    v = rng.standard_normal((num_tokens, HEADS, head_dim)).astype(np.float16)
    return k, v


def fill_pages(cache, num_pages: int, pages, num_tokens: int, seed: int, head_dim=DIM):
    """append_kv of the request's rows into `pages` (handles) of `cache`."""
    import slimserve as ss
    table = ss.PageTable(1, len(pages), cache.view.page_size, num_pages).build([(pages, num_tokens)])
    k, v = request_kv(seed, num_tokens, head_dim)
    ss.append_kv(cache, table, k, v, append_indptr=np.array([0, num_tokens], np.int32))


def page_bytes(arrays, ids, num_tokens: int):
    """The filled slots of the request's pages, array by array (NHD: token-major)."""
    out = []
    for a in arrays:
        rows = np.concatenate([a[i] for i in ids])[:num_tokens]
        out.append(rows.tobytes())
    return out


def serve(conn, config: dict) -> None:
    os.environ["UCX_NET_DEVICES"] = "lo"
    # This engine needs no PyTorch: keep slimserve from importing it (seconds on a busy machine).
    sys.modules.setdefault("torch", None)
    import slimserve as ss
    from slimserve.kv_transfer import CacheLayout
    from slimserve.nixl import PrefillSide
    num_pages = config.get("num_pages", 64)
    pool = ss.PagePool(num_pages)
    cache, arrays = make_cache(num_pages, config.get("dtype", "fp8_e4m3"), config.get("page", PAGE),
                               config.get("head_dim", DIM), combined=config.get("combined", False))
    side = PrefillSide("prefill", pool, cache)
    conn.send(side.metadata())
    side.connect(conn.recv())
    mla = None  # (side, pool, records): the MLA latent cache of the last "connect_mla"
    # Holes: every other page stays taken, so a request's pages are not one run.
    spacers = pool.allocate(min(8, num_pages // 4))
    behaviours = {}
    registered_layout = ghost = None
    deadline = time.monotonic() + config.get("lifetime_s", 120)
    while time.monotonic() < deadline:
        if conn.poll(0):
            command, *args = conn.recv()
            if command == "stop":
                break
            if command == "prefill":
                transfer_id, num_tokens, seed, behaviour = args
                count = -(-num_tokens // cache.view.page_size)
                pages = pool.allocate(count)
                order = np.random.default_rng(seed).permutation(count)
                pages = [pages[i] for i in order]  # shuffled: not ascending
                fill_pages(cache, num_pages, pages, num_tokens, seed, config.get("head_dim", DIM))
                side.offer(transfer_id, pages, num_tokens, timeout_s=config.get("offer_timeout_s", 20))
                behaviours[transfer_id] = (behaviour, pages)
                if behaviour == "stale_layout":  # grants with a cache of the same geometry it never registered
                    ghost = make_cache(num_pages, config.get("dtype", "fp8_e4m3"), config.get("page", PAGE),
                                       config.get("head_dim", DIM), combined=config.get("combined", False))
                    registered_layout, side.layout = side.layout, CacheLayout.of(ghost[0])
                if behaviour == "release_early":  # the engine releases its pages before any request
                    pool.release(pages)
                conn.send(([p for p, _ in pages], page_bytes(arrays, [p for p, _ in pages], num_tokens)))
            elif command == "connect":  # another decode engine
                side.connect(args[0])
                conn.send(side.metadata())
            elif command == "connect_mla":  # a decode engine with an MLA latent cache: metadata, dtype, scale mode
                from slimserve.attention import MlaCache, mla_record_bytes
                metadata, kv_dtype, scale_mode = args
                if mla is not None:  # one MLA cache at a time: the previous test's is done
                    mla[0].close()
                records = np.full((16, 64, mla_record_bytes(kv_dtype, scale_mode)), 0xA5, np.uint8)
                mla_pool = ss.PagePool(16)
                latent_scale = 1.0 if scale_mode == "per_tensor" else None
                mla = (PrefillSide(f"prefill-mla-{kv_dtype}", mla_pool,
                                   MlaCache(records, kv_dtype=kv_dtype, scale_mode=scale_mode,
                                            latent_scale=latent_scale)),
                       mla_pool, records)
                mla[0].connect(metadata)
                conn.send(mla[0].metadata())
            elif command == "prefill_mla":  # records written as an MLA append would leave them: any bytes
                transfer_id, num_tokens, seed = args
                mla_side, mla_pool, records = mla
                pages = mla_pool.allocate(-(-num_tokens // 64))[::-1]
                rng = np.random.default_rng(seed)
                for i, (page, _) in enumerate(pages):
                    n = min(64, num_tokens - i * 64)
                    records[page, :n] = rng.integers(0, 256, records[page, :n].shape, dtype=np.uint8)
                mla_side.offer(transfer_id, pages, num_tokens)
                conn.send(([p for p, _ in pages], page_bytes([records], [p for p, _ in pages], num_tokens)))
            elif command == "offer_again":
                try:
                    side.offer(args[0], [(1, 1)], 1)
                    conn.send("accepted")
                except ss.SlimserveError as error:
                    conn.send(str(error))
            elif command == "stats":
                conn.send({"available": pool.available, "offers": len(side.offers), "completed": list(side.completed),
                           "refused": list(side.refused), "release_errors": len(side.release_errors)})
        slow = [t for t, (b, _) in behaviours.items() if b.startswith("slow") and t in side.offers]
        if slow and side.offers[slow[0]]["state"] == "offered":
            time.sleep(float(behaviours[slow[0]][0].split(":")[1]))  # answers late
            behaviours[slow[0]] = ("normal", behaviours[slow[0]][1])
        side.poll()
        if registered_layout is not None and all(o["state"] != "offered" for o in side.offers.values()):
            side.layout, registered_layout, ghost = registered_layout, None, None  # the grant went out
        if mla is not None:
            mla[0].poll()
        for transfer_id, (behaviour, pages) in list(behaviours.items()):
            offer = side.offers.get(transfer_id)
            if offer is None or offer["state"] != "granted":
                continue
            if behaviour == "die_after_grant":
                os._exit(3)  # killed mid-transfer: no verdict, no release
            if behaviour == "release_during":  # the engine frees its pages while they are read
                pool.release(pages)
                behaviours[transfer_id] = ("released", pages)
        time.sleep(0.0005)
    pool.release(spacers)
    side.close()
    if mla is not None:
        mla[0].close()
