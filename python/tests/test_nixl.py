"""Prefill/decode over NIXL between two processes on loopback (UCX over `lo`): the prefill
process (nixl_peer.serve) fills pages with append_kv and offers them; this process is the decode
engine. Every transferred byte equals the source page's, decode attention over the received
pages equals a single-process run, and each fault fails its request alone with nothing leaked
(both pools' free-page counts back where they started, no page published). Every wait is
bounded in time; the module's requests are bounded in count."""
import multiprocessing
import os
import time

import numpy as np
import pytest

nixl = pytest.importorskip("nixl", reason="NIXL is installed by scripts/python-env")
if "libasan" in os.environ.get("LD_PRELOAD", ""):
    pytest.skip("NIXL's UCX under the ASan runtime preload is not supported", allow_module_level=True)

os.environ["UCX_NET_DEVICES"] = "lo"  # loopback only

import slimserve as ss  # noqa: E402
from slimserve.nixl import DecodeSide, TransferFailed  # noqa: E402

import nixl_peer  # noqa: E402

NUM_PAGES = 64


class Peer:
    """A prefill process and this process's decode side, connected."""

    def __init__(self, config=None, name="decode"):
        context = multiprocessing.get_context("spawn")
        self.conn, child = context.Pipe()
        self.process = context.Process(target=nixl_peer.serve, args=(child, config or {}), daemon=True)
        self.process.start()
        self.pool = ss.PagePool(NUM_PAGES)
        self.cache, self.arrays = nixl_peer.make_cache(NUM_PAGES, (config or {}).get("decode_dtype", "fp8_e4m3"),
                                                       (config or {}).get("decode_page", nixl_peer.PAGE),
                                                       (config or {}).get("decode_head_dim", nixl_peer.DIM),
                                                       combined=(config or {}).get("combined", False))
        self.side = DecodeSide(name, self.pool, self.cache)
        assert self.conn.poll(30), "the prefill process did not start"
        self.peer = self.side.connect(self.conn.recv())
        self.conn.send(self.side.metadata())
        self.free = self.pool.available

    def call(self, *command):
        self.conn.send(command)
        assert self.conn.poll(20), f"no answer to {command[0]}"
        return self.conn.recv()

    def prefill(self, transfer_id, num_tokens, seed, behaviour="normal"):
        return self.call("prefill", transfer_id, num_tokens, seed, behaviour)

    def stats(self):
        return self.call("stats")

    def wait_for(self, predicate, timeout_s=5.0):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            stats = self.stats()
            if predicate(stats):
                return stats
            time.sleep(0.02)
        return self.stats()

    def close(self):
        if self.process.is_alive():
            self.conn.send(("stop",))
            self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
        self.side.close()


@pytest.fixture(scope="module")
def peer():
    p = Peer()
    yield p
    p.close()


def received_bytes(arrays, pages, num_tokens):
    return nixl_peer.page_bytes(arrays, [p for p, _ in pages], num_tokens)


def attention(cache, pages, num_tokens, q):
    wrapper = ss.DecodeWrapper()
    ids = np.array([p for p, _ in pages], np.int32)
    last = (num_tokens - 1) % nixl_peer.PAGE + 1
    wrapper.plan(np.array([0, len(ids)], np.int32), ids, np.array([last], np.int32), q.shape[1], nixl_peer.HEADS,
                 nixl_peer.DIM, nixl_peer.PAGE, "fp8_e4m3")
    out = np.full_like(q, np.nan)
    return wrapper.run(q, cache, out=out)


def test_two_processes_move_pages_and_decode_equals_single_process(peer, rng):
    start_prefill = peer.stats()["available"]
    # Partly filled last pages go through the request's own list, full pages through the
    # descriptor lists prepared once per cache (indices only).
    for transfer_id, num_tokens in ((1, 1), (2, nixl_peer.PAGE - 1), (3, nixl_peer.PAGE * 7 + 5),
                                    (4, nixl_peer.PAGE * 5)):
        seed = int(rng.integers(1 << 30))
        src_ids, src_bytes = peer.prefill(transfer_id, num_tokens, seed)
        writer = peer.side.new_writer()
        seen = []
        pages = peer.side.receive(peer.peer, transfer_id, num_tokens, timeout_s=10, writer=writer,
                                  hold_before_publish=lambda held: seen.extend(peer.side.writer(p) for p, _ in held))
        assert len(pages) == len(src_ids)
        assert seen == [0] * len(pages)  # nobody's to write until published
        assert all(peer.side.writer(p) == writer for p, _ in pages)
        # Every transferred byte equals the source page's (K, V and both per-token scale arrays).
        for got, want in zip(received_bytes(peer.arrays, pages, num_tokens), src_bytes):
            assert got == want
        # Decode attention over the received pages equals a single-process run over the same rows.
        q = rng.standard_normal((1, 8, nixl_peer.DIM)).astype(np.float16)
        local_pool = ss.PagePool(NUM_PAGES)
        local_cache, _ = nixl_peer.make_cache(NUM_PAGES)
        local_pages = local_pool.allocate(len(pages))
        nixl_peer.fill_pages(local_cache, NUM_PAGES, local_pages, num_tokens, seed)
        expected = attention(local_cache, local_pages, num_tokens, q)
        got = attention(peer.cache, pages, num_tokens, q)
        assert np.isfinite(expected).all()
        np.testing.assert_array_equal(got, expected)
        peer.pool.release(pages)  # the decode engine finishes the request
        stats = peer.wait_for(lambda s: transfer_id in s["completed"])
        assert transfer_id in stats["completed"]
    assert peer.side.last_stats["descriptors"] >= 4 and peer.side.last_stats["setup_us"] > 0
    assert peer.pool.available == peer.free
    assert peer.wait_for(lambda s: s["available"] == start_prefill)["available"] == start_prefill


def test_received_requests_adopted_into_request_sets_with_their_fills(peer, rng):
    """receive_request: the received pages become a RequestSets request (its identity writes
    them; pages and length as received) with their device fills recorded, so the decode step
    after the import passes the fill-checked, owned tag check and appends at the next slot.
    Ragged lengths; the fill words of every other page keep their poison; the same check over
    a plain receive (no fills recorded) or a wrong tag fails; a RequestSets with no free slot
    fails the transfer alone with both pools back where they started."""
    from slimserve import _lib
    page = nixl_peer.PAGE
    sets = ss.RequestSets(peer.pool, None, 2, page)
    tags, tables, statuses = ss.DeviceTags(NUM_PAGES), ss.PageTable(1, NUM_PAGES, page, NUM_PAGES), ss.RequestStatuses(1)
    words = np.full(NUM_PAGES, np.uint64(page << 32 | 0x7EADBEEF), np.uint64)  # poison: a tag no page has
    assert _lib.slimserve_memcpy_async(tags._fills_ptr(), words.ctypes.data, words.nbytes, 0, None) == 0
    start_prefill = peer.stats()["available"]
    for transfer_id, num_tokens in ((90, 1), (91, page - 1), (92, page), (93, page + 1), (94, page * 9 + 5)):
        seed = int(rng.integers(1 << 30))
        src_ids, src_bytes = peer.prefill(transfer_id, num_tokens, seed)
        request, pages = peer.side.receive_request(sets, peer.peer, transfer_id, num_tokens, device_tags=tags,
                                                   timeout_s=10)
        assert sets.pages(request) == pages and sets.tokens(request) == num_tokens
        assert all(peer.side.writer(p) == request[1] for p, _ in pages)
        for got, want in zip(received_bytes(peer.arrays, pages, num_tokens), src_bytes):
            assert got == want
        for i, (p, t) in enumerate(pages):
            words[p] = np.uint64(min(page, num_tokens - i * page)) << np.uint64(32) | np.uint64(t)
        np.testing.assert_array_equal(tags.read_fills(NUM_PAGES), words)
        tags.sync(peer.pool)
        ss.check_page_tags(tables.build([(pages, num_tokens)]), tags, statuses, writers=[request[1]], check_fill=True)
        assert statuses.to_host(1) == [("ok", -1)]
        wrong = [(p, t + 1) if i == len(pages) - 1 else (p, t) for i, (p, t) in enumerate(pages)]
        ss.check_page_tags(tables.build([(wrong, num_tokens)]), tags, statuses, writers=[request[1]], check_fill=True)
        assert statuses.to_host(1)[0][0] != "ok"
        plan = sets.append(request, 1)  # the decode step after the import appends its first token
        assert not plan["needs_copy"]
        tags.sync(peer.pool)
        ss.check_page_tags(tables.build([(sets.pages(request), num_tokens + 1)]), tags, statuses,
                           writers=[request[1]], append_indptr=[0, 1], check_fill=True)
        assert statuses.to_host(1) == [("ok", -1)]
        sets.finish(request)
        assert peer.wait_for(lambda s: transfer_id in s["completed"])["completed"].count(transfer_id) == 1
    # A plain receive records no fills: the same check reads the pages as unwritten.
    peer.prefill(95, page * 2, int(rng.integers(1 << 30)))
    pages = peer.side.receive(peer.peer, 95, page * 2, timeout_s=10)
    tags.sync(peer.pool)
    ss.check_page_tags(tables.build([(pages, page * 2)]), tags, statuses, check_fill=True)
    assert statuses.to_host(1) == [("unwritten_slots", 0)]
    peer.pool.release(pages)
    # No free slot in the engine's sets: the transfer fails alone, nothing is published.
    held = [sets.admit([1, 2, 3])[0] for _ in range(2)]
    peer.prefill(96, page + 3, int(rng.integers(1 << 30)))
    with pytest.raises(TransferFailed, match="slots"):
        peer.side.receive_request(sets, peer.peer, 96, page + 3, device_tags=tags, timeout_s=10)
    for request in held:
        sets.finish(request)
    assert peer.pool.available == peer.free
    assert peer.wait_for(lambda s: s["available"] == start_prefill)["available"] == start_prefill


def test_combined_kv_allocations_move_byte_for_byte():
    """K and V in one allocation on both sides (each page's K then V): the prepared lists read
    a page's K and V as one piece. Full and partly filled last pages; every byte of the request
    equals the source's and no other page of the decode cache is written."""
    rng = np.random.default_rng()
    p = Peer({"combined": True}, name="decode-combined")
    try:
        for transfer_id, num_tokens in ((70, nixl_peer.PAGE * 6), (71, nixl_peer.PAGE * 3 + 9)):
            for array in p.arrays:
                array[...] = array.dtype.type(0xA5) if array.dtype == np.uint8 else -1.0  # poisoned again
            src_ids, src_bytes = p.prefill(transfer_id, num_tokens, int(rng.integers(1 << 30)))
            pages = p.side.receive(p.peer, transfer_id, num_tokens, timeout_s=10)
            for got, want in zip(received_bytes(p.arrays, pages, num_tokens), src_bytes):
                assert got == want
            others = np.setdiff1d(np.arange(NUM_PAGES), [q for q, _ in pages])
            assert all((a[others] == (0xA5 if a.dtype == np.uint8 else -1.0)).all() for a in p.arrays)
            p.pool.release(pages)
        assert p.pool.available == p.free
    finally:
        p.close()


@pytest.mark.parametrize("kv_dtype, scale_mode", [("fp8_e4m3", "per_token_group"), ("nvfp4", "per_tensor")])
def test_mla_latent_pages_move_byte_for_byte(peer, rng, kv_dtype, scale_mode):
    from slimserve.attention import MlaCache, mla_record_bytes
    records = np.full((16, 64, mla_record_bytes(kv_dtype, scale_mode)), 0x5A, np.uint8)
    pool = ss.PagePool(16)
    latent_scale = 1.0 if scale_mode == "per_tensor" else None
    side = DecodeSide(f"decode-mla-{kv_dtype}", pool,
                      MlaCache(records, kv_dtype=kv_dtype, scale_mode=scale_mode, latent_scale=latent_scale))
    try:
        name = side.connect(peer.call("connect_mla", side.metadata(), kv_dtype, scale_mode))
        for transfer_id, num_tokens in ((60, 1), (61, 64 * 3 + 17), (62, 64 * 4)):
            src_ids, (src_bytes,) = peer.call("prefill_mla", transfer_id, num_tokens, int(rng.integers(1 << 30)))
            records[:] = 0x5A  # poisoned again: every byte outside the request must stay so
            pages = side.receive(name, transfer_id, num_tokens, timeout_s=10)
            assert nixl_peer.page_bytes([records], [p for p, _ in pages], num_tokens)[0] == src_bytes
            last, filled = pages[-1][0], (num_tokens - 1) % 64 + 1
            assert (records[last, filled:] == 0x5A).all()  # past the request: not moved
            others = np.setdiff1d(np.arange(16), [p for p, _ in pages])
            assert (records[others] == 0x5A).all()  # no other page written
            pool.release(pages)
        assert pool.available == 15
    finally:
        side.close()


def expect_failure(peer, transfer_id, num_tokens, match, timeout_s=3.0):
    with pytest.raises(TransferFailed, match=match):
        peer.side.receive(peer.peer, transfer_id, num_tokens, timeout_s=timeout_s)
    assert peer.pool.available == peer.free, "the decode side leaked its reservation"


def test_decode_pool_out_of_pages_refused_before_any_byte(peer, rng):
    hog = peer.pool.allocate(peer.pool.available - 2)
    src_ids, _ = peer.prefill(10, nixl_peer.PAGE * 3, int(rng.integers(1 << 30)))
    with pytest.raises(ss.SlimserveError) as error:
        peer.side.receive(peer.peer, 10, nixl_peer.PAGE * 3)
    assert error.value.code == "resource_exhausted"
    assert peer.pool.available == 2
    assert peer.stats()["offers"] == 1  # no request reached the prefill side: its offer waits
    peer.pool.release(hog)
    pages = peer.side.receive(peer.peer, 10, nixl_peer.PAGE * 3)  # with room, the same request goes through
    peer.pool.release(pages)
    assert peer.pool.available == peer.free


def test_unknown_and_duplicated_transfer_ids(peer, rng):
    expect_failure(peer, 999, 5, "unknown transfer id")
    peer.prefill(11, 20, int(rng.integers(1 << 30)))
    assert "already offered" in peer.call("offer_again", 11)
    pages = peer.side.receive(peer.peer, 11, 20)
    peer.pool.release(pages)
    peer.wait_for(lambda s: 11 in s["completed"])
    expect_failure(peer, 11, 20, "unknown transfer id")  # done once: a second request is unknown


def test_descriptor_mismatches_refused_naming_the_field(peer, rng):
    start = peer.stats()["available"]
    for (dtype, page, head_dim), field in ((("bfloat16", nixl_peer.PAGE, nixl_peer.DIM), "dtype"),
                                           (("fp8_e4m3", 32, nixl_peer.DIM), "page_size"),
                                           (("fp8_e4m3", nixl_peer.PAGE, 128), "head_dim")):
        pool = ss.PagePool(NUM_PAGES)
        cache, arrays = nixl_peer.make_cache(NUM_PAGES, dtype, page, head_dim)
        side = DecodeSide(f"decode-{field}", pool, cache)
        try:
            name = side.connect(peer.call("connect", side.metadata()))
            transfer_id = 20 + len(field)
            peer.prefill(transfer_id, 40, int(rng.integers(1 << 30)))
            with pytest.raises(TransferFailed, match=f"mismatch: {field}"):
                side.receive(name, transfer_id, 40, timeout_s=3)
            assert pool.available == NUM_PAGES - 1
            assert all((a == a.flat[0]).all() for a in arrays)  # not a byte landed
            assert transfer_id in [t for t, _ in peer.stats()["refused"]]
            pages = peer.side.receive(peer.peer, transfer_id, 40)  # a matching decode side still gets it
            peer.pool.release(pages)
        finally:
            side.close()
    assert peer.wait_for(lambda s: s["available"] == start)["available"] == start


def test_prefill_releasing_its_pages_is_refused_by_its_tag_check(peer, rng):
    start = peer.stats()["available"]
    peer.prefill(30, 40, int(rng.integers(1 << 30)), "release_early")
    expect_failure(peer, 30, 40, "released or has a new owner")
    peer.prefill(31, nixl_peer.PAGE * 6, int(rng.integers(1 << 30)), "release_during")
    expect_failure(peer, 31, nixl_peer.PAGE * 6, "tag check refused the read")
    stats = peer.wait_for(lambda s: s["offers"] == 0 and s["available"] == start)
    assert stats["available"] == start and stats["offers"] == 0
    assert stats["release_errors"] >= 1  # the binding's own release of those pages was refused, nothing changed


def test_late_grant_after_the_decode_side_gave_up(peer, rng):
    start = peer.stats()["available"]
    peer.prefill(40, 50, int(rng.integers(1 << 30)), "slow:1.5")
    t0 = time.monotonic()
    expect_failure(peer, 40, 50, "no answer", timeout_s=0.5)
    assert time.monotonic() - t0 < 2.0
    # The pages it had reserved go to the next request, with new tags; the late grant is dropped.
    nxt = peer.pool.allocate(4)
    deadline = time.monotonic() + 5
    while peer.side.late_messages == 0 and time.monotonic() < deadline:
        peer.side.poll()
        time.sleep(0.02)
    assert peer.side.late_messages >= 1
    peer.pool.release(nxt)
    stats = peer.wait_for(lambda s: s["offers"] == 0 and s["available"] == start)
    assert stats["available"] == start  # the cancel released the prefill side's pages


def poison(arrays):
    """Fills the decode cache's arrays with a byte the prefill side never writes; returns copies."""
    for a in arrays:
        a.view(np.uint8)[...] = 0x5A
    return [a.view(np.uint8).copy() for a in arrays]


def test_stale_descriptors_refused_with_nothing_overwritten(peer, rng):
    """A grant naming memory the prefill side never registered (its cache moved since it
    registered: stale descriptors) is refused before any byte moves: TransferFailed, every byte
    of the poisoned decode cache unchanged, both pools back where they started. Full pages (the
    prepared lists) and a partly filled last page (the request's own list)."""
    start = peer.stats()["available"]
    for transfer_id, num_tokens in ((60, nixl_peer.PAGE * 4), (61, nixl_peer.PAGE * 2 + 3)):
        peer.prefill(transfer_id, num_tokens, int(rng.integers(1 << 30)), "stale_layout")
        before = poison(peer.arrays)
        with pytest.raises(TransferFailed, match="not in the memory the prefill side registered"):
            peer.side.receive(peer.peer, transfer_id, num_tokens, timeout_s=3)
        for a, b in zip(peer.arrays, before):
            np.testing.assert_array_equal(a.view(np.uint8), b)
        assert peer.pool.available == peer.free
        assert not peer.side.quarantined
    stats = peer.wait_for(lambda s: s["offers"] == 0 and s["available"] == start)
    assert stats["available"] == start  # the cancel released the prefill side's pages


def test_prefill_killed_mid_transfer(peer, rng):
    """Last: it kills the module's prefill process. It exits right after its grant; the decode
    side posts the READ only once the process is gone: refused, every byte of the poisoned
    decode cache unchanged, the reservation back in the pool."""
    peer.prefill(50, nixl_peer.PAGE * 20, int(rng.integers(1 << 30)), "die_after_grant")
    before = poison(peer.arrays)
    t0 = time.monotonic()
    with pytest.raises(TransferFailed, match="read failed|no verdict|did not finish"):
        peer.side.receive(peer.peer, 50, nixl_peer.PAGE * 20, timeout_s=4,
                          hold_before_read=lambda pages: peer.process.join(3))
    assert time.monotonic() - t0 < 6
    assert not peer.process.is_alive()
    for a, b in zip(peer.arrays, before):
        np.testing.assert_array_equal(a.view(np.uint8), b)
    deadline = time.monotonic() + 5
    while peer.side.quarantined and time.monotonic() < deadline:
        peer.side.poll()
        time.sleep(0.05)
    assert peer.pool.available == peer.free  # the reservation came back, nothing published
    peer.process.join(5)
    assert peer.process.exitcode == 3
