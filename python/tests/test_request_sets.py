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
