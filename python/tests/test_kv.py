import numpy as np
import pytest

import slimserve as ss


def test_pool_all_or_nothing_and_stale_handles():
    pool = ss.PagePool(8)
    assert pool.available == 7
    with pytest.raises(ss.SlimserveError) as error:
        pool.allocate(8)
    assert error.value.code == "resource_exhausted"
    assert pool.available == 7  # nothing taken
    pages = pool.allocate(3)
    assert all(page_id > 0 for page_id, _ in pages)
    pool.release([pages[1]])
    assert not pool.is_live(pages[1])
    with pytest.raises(ss.SlimserveError) as error:
        pool.release([pages[0], pages[1]])  # the stale one spoils the whole list
    assert error.value.code in ("stale_handle", "failed_precondition")
    pool.validate(pages[0])  # still live
    pool.release([pages[0], pages[2]])
    assert pool.available == 7


def test_prefix_cache_hits_and_salts():
    pool = ss.PagePool(16)
    cache = ss.PrefixCache(pool, 4)
    tokens = list(range(10))
    pages = pool.allocate(3)
    assert cache.insert(tokens, pages, salt=1) == 2  # two full pages
    pool.release(pages)
    assert cache.match(tokens[:-1], salt=1) == pages[:2]
    assert cache.match(tokens[:-1], salt=2) == []  # another tenant never shares


def test_tag_check_catches_stale_page():
    pool = ss.PagePool(16)
    tags, tables, statuses = ss.DeviceTags(16), ss.PageTable(4, 32, 16, 16), ss.RequestStatuses(4)
    a = pool.allocate(2)
    pool.release([a[1]])
    b = pool.allocate(1)  # a[1]'s page comes back with a new tag
    assert b[0][0] == a[1][0] and b[0][1] != a[1][1]
    table = tables.build([(a, 20), (b, 5), ([], 0)])
    assert table.indptr.tolist() == [0, 2, 3, 3]
    assert table.last_page_len.tolist() == [4, 5, 0]
    tags.sync(pool)
    ss.check_page_tags(table, tags, statuses)
    assert statuses.to_host(3) == [("stale_tag", 1), ("ok", -1), ("ok", -1)]


def test_enum_values_are_range_checked():
    k = np.zeros((4, 16, 1, 64), np.float16)
    cache = ss.PagedKVCache(k, k.copy())
    cache.view.dtype = 9  # as a C caller could pass
    table = ss.PageTable(1, 4, 16, 4).build([([], 0)])
    with pytest.raises(ss.SlimserveError) as error:
        ss.append_kv(cache, table, np.zeros((1, 1, 64), np.float16), np.zeros((1, 1, 64), np.float16),
                     append_indptr=[0, 1])
    assert error.value.code == "invalid_argument" and "9" in str(error.value)
