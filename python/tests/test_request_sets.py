import numpy as np
import pytest

import slimserve as ss


def test_fork_copy_on_write_and_ownership(rng):
    pool = ss.PagePool(16)
    sets = ss.RequestSets(pool, ss.PrefixCache(pool, 16), 4, 16)
    tags, tables, statuses = ss.DeviceTags(16), ss.PageTable(4, 32, 16, 16), ss.RequestStatuses(4)
    k_pages = rng.standard_normal((16, 16, 1, 64)).astype(np.float16)
    v_pages = rng.standard_normal((16, 16, 1, 64)).astype(np.float16)
    before_k, before_v = k_pages.copy(), v_pages.copy()
    cache = ss.PagedKVCache(k_pages, v_pages)

    a, plan = sets.admit(list(range(20)))
    assert plan["cached_tokens"] == 0 and len(sets.pages(a)) == 2
    child = sets.fork(a)
    assert child[1] != a[1]
    plan = sets.append(child, 1)
    assert plan["needs_copy"] and plan["copy_tokens"] == 4
    tags.sync(pool)
    verdicts = ss.copy_pages(cache, tags, [{"src": plan["copy_from"], "dst": plan["copy_to"],
                                            "writer": child[1], "tokens": 4}])
    assert verdicts == [("ok", -1)]
    sets.release_copy_sources()
    src, dst = plan["copy_from"][0], plan["copy_to"][0]
    np.testing.assert_array_equal(k_pages[dst, :4], before_k[src, :4])
    np.testing.assert_array_equal(v_pages[dst, :4], before_v[src, :4])
    np.testing.assert_array_equal(k_pages[dst, 4:], before_k[dst, 4:])  # only the filled slots

    # A's last page is shared with nobody now but A forked: appending into it is denied on the
    # device while the child still reads it; the owned check names the page.
    table = tables.build([(sets.pages(a), 20), (sets.pages(child), 21)])
    tags.sync(pool)
    ss.check_page_tags(table, tags, statuses, writers=[a[1], child[1]], append_indptr=[0, 1, 2])
    verdicts = statuses.to_host(2)
    assert verdicts[1] == ("ok", -1)           # the child's copied page is its own
    assert verdicts[0] == ("write_denied", 1)  # A's last page is read-only after the fork

    sets.preempt(child)
    assert not sets.is_active(child)
    with pytest.raises(ss.SlimserveError) as error:
        sets.append(child, 1)
    assert error.value.code == "failed_precondition"
    resumed, _ = sets.resume(child, list(range(21)))
    assert resumed[1] != child[1] and sets.is_active(resumed)
    sets.finish(resumed)
    sets.finish(a, list(range(20)))
    with pytest.raises(ss.SlimserveError):
        sets.finish(a)


def test_adopt_takes_received_pages_and_refuses_bad_ones_all_or_nothing(rng):
    """adopt: pages filled elsewhere become a request (writable by its identity, its length
    what the caller says); every refusal leaves the caller's pages, the pool and the slots as
    they were. Fills recorded with DeviceTags.record_fills: exactly the received pages' words
    change (the rest keep their poison), and the fill-checked tag check passes for the
    request's length and a one-token append, and fails one token past it."""
    page = 16
    pool = ss.PagePool(32)
    cache = ss.PrefixCache(pool, page)
    sets = ss.RequestSets(pool, cache, 2, page)
    tags, tables, statuses = ss.DeviceTags(32), ss.PageTable(2, 32, page, 32), ss.RequestStatuses(2)
    poison = np.uint64(page << 32 | 0x7EADBEEF)
    poisoned = np.full(32, poison, np.uint64)
    from slimserve import _lib  # the fill words are device memory: poison them through the C ABI
    assert _lib.slimserve_memcpy_async(tags._fills_ptr(), poisoned.ctypes.data, poisoned.nbytes, 0, None) == 0
    available = pool.available

    def writer_of(page_id):
        return _lib.slimserve_page_pool_writer(pool._handle, page_id)
    for num_tokens in (1, page - 1, page, page + 1, 5 * page + 3):
        count = -(-num_tokens // page)
        pages = pool.allocate(count)
        pages = [pages[i] for i in rng.permutation(count)]  # a shuffled page table
        # Refused, nothing changed: wrong count, listed twice, shared, writable, stale.
        for bad, match in (([pages[0]] * (count + 1), "need"), (pages + [pages[0]], "need")):
            with pytest.raises(ss.SlimserveError, match=match):
                sets.adopt(bad, num_tokens)
        if count > 1:
            with pytest.raises(ss.SlimserveError, match="listed twice"):
                sets.adopt([pages[0]] * count, num_tokens)
        with pytest.raises(ss.SlimserveError, match="need"):
            sets.adopt(pages, 0)
        pool.share(pages[-1])
        with pytest.raises(ss.SlimserveError, match="shared"):
            sets.adopt(pages, num_tokens)
        pool.release([pages[-1]])
        writer = pool.new_writer()
        pool.grant_write(pages[0], writer)
        with pytest.raises(ss.SlimserveError, match="writable"):
            sets.adopt(pages, num_tokens)
        pool.revoke_write(pages[0])
        with pytest.raises(ss.SlimserveError, match="stale|released|tag"):
            sets.adopt([(pages[0][0], pages[0][1] + 1)] + pages[1:], num_tokens)
        assert all(writer_of(p) == 0 for p, _ in pages)
        request = sets.adopt(pages, num_tokens)
        assert sets.pages(request) == pages and sets.tokens(request) == num_tokens
        assert all(writer_of(p) == request[1] for p, _ in pages)
        tags.record_fills(pages, num_tokens, page)
        want = poisoned.copy()
        for i, (p, t) in enumerate(pages):
            want[p] = np.uint64(min(page, num_tokens - i * page)) << np.uint64(32) | np.uint64(t)
        np.testing.assert_array_equal(tags.read_fills(32), want)
        poisoned = want
        tags.sync(pool)
        table = tables.build([(pages, num_tokens)])
        ss.check_page_tags(table, tags, statuses, writers=[request[1]], check_fill=True)
        assert statuses.to_host(1) == [("ok", -1)]
        if num_tokens % page:  # the last page has room: a row one token longer claims an unwritten slot
            ss.check_page_tags(tables.build([(pages, num_tokens + 1)]), tags, statuses, writers=[request[1]],
                               check_fill=True)
            assert statuses.to_host(1) == [("unwritten_slots", count - 1)]
        # The decode step after the import appends one token at the next unwritten slot.
        plan = sets.append(request, 1)
        assert not plan["needs_copy"]
        tags.sync(pool)
        grown = sets.pages(request)
        ss.check_page_tags(tables.build([(grown, num_tokens + 1)]), tags, statuses, writers=[request[1]],
                           append_indptr=[0, 1], check_fill=True)
        assert statuses.to_host(1) == [("ok", -1)]
        sets.finish(request)
        assert pool.available == available
    # No free slot: refused, the caller keeps its pages.
    held = [sets.admit(list(range(3)))[0] for _ in range(2)]
    pages = pool.allocate(1)
    with pytest.raises(ss.SlimserveError, match="slots"):
        sets.adopt(pages, 4)
    pool.release(pages)
    for request in held:
        sets.finish(request)
    with pytest.raises(ss.SlimserveValueError, match="twice"):
        tags.record_fills([(3, 1), (3, 1)], 20, page)
    with pytest.raises(ss.SlimserveValueError, match="out_of_range|pages 1..31"):
        tags.record_fills([(40, 1)], 3, page)
    with pytest.raises(ss.SlimserveValueError, match="do not fill"):
        tags.record_fills([(3, 1), (4, 1)], 16, page)
    assert pool.available == available
