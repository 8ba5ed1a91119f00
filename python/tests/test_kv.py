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


def test_write_ownership_of_raw_pages():
    # An engine that keeps its own page lists (vLLM's block pool) names its requests and grants
    # them the pages they alone hold; the check with writers then refuses a write elsewhere.
    pool = ss.PagePool(16)
    tags, tables, statuses = ss.DeviceTags(16), ss.PageTable(4, 32, 16, 16), ss.RequestStatuses(4)
    a, b = pool.allocate(2), pool.allocate(1)
    wa, wb = pool.new_writer(), pool.new_writer()
    assert wa != 0 and wb != 0 and wa != wb
    for page in a:
        pool.grant_write(page, wa)
    pool.grant_write(b[0], wb)
    with pytest.raises(ss.SlimserveError) as error:
        pool.grant_write(a[0], wb)  # writable by another request
    assert error.value.code == "failed_precondition" and str(wa) in str(error.value)
    pool.share(b[0])  # a second holder: read-only at once
    with pytest.raises(ss.SlimserveError) as error:
        pool.grant_write(b[0], wb)
    assert error.value.code == "failed_precondition"
    pool.release([b[0]])
    table = tables.build([(a, 20), (b, 5)])
    tags.sync(pool)
    ss.check_page_tags(table, tags, statuses, writers=[wa, wb], append_indptr=[0, 1, 2])
    assert statuses.to_host(2) == [("ok", -1), ("write_denied", 0)]
    pool.revoke_write(a[1])
    table = tables.build([(a, 20)])
    tags.sync(pool)
    ss.check_page_tags(table, tags, statuses, writers=[wa], append_indptr=[0, 1])
    assert statuses.to_host(1) == [("write_denied", 1)]
    pool.release([a[1]])
    with pytest.raises(ss.SlimserveError) as error:
        pool.grant_write(a[1], wa)  # a freed page's handle changes nothing
    assert error.value.code in ("stale_handle", "failed_precondition")


def test_tag_check_fills_and_table_age():
    pool = ss.PagePool(16)
    tags, tables, statuses = ss.DeviceTags(16), ss.PageTable(4, 32, 16, 16), ss.RequestStatuses(4)
    a = pool.allocate(2)
    table = tables.build([(a, 20)])
    built_at = pool.table_age()
    assert built_at[0] > 0
    tags.sync(pool)
    ss.check_page_tags(table, tags, statuses, built_at=built_at)
    assert statuses.to_host(1) == [("ok", -1)]
    # Device-held lengths: nothing was written into these pages.
    ss.check_page_tags(table, tags, statuses, check_fill=True)
    assert statuses.to_host(1) == [("unwritten_slots", 0)]
    # The pool changed after the sync: a table built now is refused before any launch.
    pool.allocate(1)
    with pytest.raises(ss.SlimserveError) as error:
        ss.check_page_tags(table, tags, statuses, built_at=pool.table_age())
    assert error.value.code == "failed_precondition"
    with pytest.raises(ss.SlimserveTypeError):
        ss.check_page_tags(table, tags, statuses, built_at=(1,))
    tags.sync(pool)
    ss.check_page_tags(table, tags, statuses, built_at=pool.table_age())
    assert statuses.to_host(1) == [("ok", -1)]


def test_tag_check_bounded_rows_and_device_age(rng):
    # The C form's num_entries / entry_capacity / device_built_at from Python: a row whose
    # indptr range leaves the entries built for the table is refused, and so is every row of a
    # table whose device age word is newer than the last sync.
    pool = ss.PagePool(32)
    tags, tables, statuses = ss.DeviceTags(32), ss.PageTable(4, 32, 16, 16), ss.RequestStatuses(4)
    lengths = [int(rng.integers(17, 33)), int(rng.integers(1, 17)), int(rng.integers(33, 49))]
    pages = [pool.allocate((n + 15) // 16) for n in lengths]
    table = tables.build(list(zip(pages, lengths)))
    entries = int(table.indptr[-1])
    assert entries == sum(len(p) for p in pages)
    tags.sync(pool)
    age = pool.table_age()
    ss.check_page_tags(table, tags, statuses, num_entries=entries, entry_capacity=32, device_built_at=age)
    assert statuses.to_host(3) == [("ok", -1)] * 3
    # One entry short (an int, then a persistent device word): the last row leaves them.
    ss.check_page_tags(table, tags, statuses, num_entries=entries - 1)
    assert statuses.to_host(3) == [("ok", -1), ("ok", -1), ("bad_page_table", 0)]
    count = ss.DeviceArray(np.array([int(table.indptr[1])], np.int32))
    ss.check_page_tags(table, tags, statuses, num_entries=count)
    assert statuses.to_host(3) == [("ok", -1), ("bad_page_table", 0), ("bad_page_table", 0)]
    count.upload(np.array([entries], np.int32))  # rewritten in place, as a captured step would
    ss.check_page_tags(table, tags, statuses, num_entries=count)
    assert statuses.to_host(3) == [("ok", -1)] * 3
    ss.check_page_tags(table, tags, statuses, entry_capacity=int(table.indptr[2]))
    assert statuses.to_host(3) == [("ok", -1), ("ok", -1), ("bad_page_table", 0)]
    # The pool changes after the sync; a table that saw the change is newer than the device tags.
    pool.allocate(1)
    newer = pool.table_age()
    assert newer[0] > age[0] and newer[1] == age[1]
    ss.check_page_tags(table, tags, statuses, device_built_at=newer)
    assert [s for s, _ in statuses.to_host(3)] == ["tags_not_synced"] * 3
    word = ss.DeviceArray(ss.table_age_word(age))
    ss.check_page_tags(table, tags, statuses, device_built_at=word)
    assert statuses.to_host(3) == [("ok", -1)] * 3
    word.upload(ss.table_age_word(newer))
    ss.check_page_tags(table, tags, statuses, device_built_at=word)
    assert [s for s, _ in statuses.to_host(3)] == ["tags_not_synced"] * 3
    ss.check_page_tags(table, tags, statuses, device_built_at=(newer[0], newer[1] + 1))  # another pool
    assert [s for s, _ in statuses.to_host(3)] == ["tags_not_synced"] * 3
    tags.sync(pool)
    ss.check_page_tags(table, tags, statuses, device_built_at=word, num_entries=entries)
    assert statuses.to_host(3) == [("ok", -1)] * 3
    # Mistakes name the argument, before any launch.
    for bad in ("3", -1, 2.0, True):
        with pytest.raises(ss.SlimserveTypeError, match="num_entries"):
            ss.check_page_tags(table, tags, statuses, num_entries=bad)
    with pytest.raises(ss.SlimserveValueError, match="num_entries"):
        ss.check_page_tags(table, tags, statuses, num_entries=ss.DeviceArray.empty(2))
    for bad in (-1, 1.5, "8"):
        with pytest.raises(ss.SlimserveTypeError, match="entry_capacity"):
            ss.check_page_tags(table, tags, statuses, entry_capacity=bad)
    for bad in ((1,), (1, 2, 3), "age", (-1, 0)):
        with pytest.raises(ss.SlimserveTypeError, match="device_built_at"):
            ss.check_page_tags(table, tags, statuses, device_built_at=bad)
    with pytest.raises(ss.SlimserveValueError, match="device_built_at"):
        ss.check_page_tags(table, tags, statuses, device_built_at=ss.DeviceArray.empty(8))
    with pytest.raises(ss.SlimserveTypeError):
        ss.table_age_word((1,))
    assert ss.table_age_word((5, 7)).tobytes() == (5).to_bytes(8, "little") + (7).to_bytes(4, "little") + bytes(4)


def test_record_identities_refuse_another_requests_records(rng):
    # Swap slots and export buffers carry whose record they are: another request's buffer of
    # the same shape, a stale sequence or another request's slot is refused on the device and
    # the destination (poisoned first) keeps every byte; the right identity moves every byte.
    pool, tags = ss.PagePool(16), ss.DeviceTags(16)
    k = rng.integers(0, 1 << 16, size=(16, 16, 1, 64), dtype=np.uint16)
    v = rng.integers(0, 1 << 16, size=(16, 16, 1, 64), dtype=np.uint16)
    cache = ss.PagedKVCache(k, v, dtype="bfloat16")
    a, b, d = pool.allocate(2), pool.allocate(2), pool.allocate(2)
    wa, wb, wd = pool.new_writer(), pool.new_writer(), pool.new_writer()
    for pages, writer in ((a, wa), (b, wb), (d, wd)):
        for page in pages:
            pool.grant_write(page, writer)
    tags.sync(pool)
    pool_id = pool.table_age()[1]
    id_a, id_b = ss.RecordIdentity(pool_id, wa, 1), ss.RecordIdentity(pool_id, wb, 1)
    tokens = int(rng.integers(17, 32))  # two pages, the last partly filled
    last = tokens - 16
    buf_a = ss.DeviceArray.empty(ss.export_buffer_bytes(cache, 2))
    buf_b = ss.DeviceArray.empty(ss.export_buffer_bytes(cache, 2))
    assert ss.export_request(cache, tags, a, tokens, wa, buf_a, identity=id_a) == ("ok", -1)
    assert ss.export_request(cache, tags, b, tokens, wb, buf_b, identity=id_b) == ("ok", -1)
    assert ss.read_buffer_identity(ss.buffer_header(buf_b)) == id_b
    assert ss.read_buffer_identity(ss.buffer_header(buf_a)) == id_a

    def poison():
        for page, _ in d:
            k[page] = rng.integers(0, 1 << 16, size=k[page].shape, dtype=np.uint16)
            v[page] = rng.integers(0, 1 << 16, size=v[page].shape, dtype=np.uint16)
        return k.copy(), v.copy()

    k0, v0 = poison()
    assert ss.import_request(cache, tags, d, tokens, wd, buf_b, expected=id_a)[0] == "record_mismatch"
    stale = id_a._replace(sequence=0)
    assert ss.import_request(cache, tags, d, tokens, wd, buf_a, expected=stale)[0] == "record_mismatch"
    np.testing.assert_array_equal(k, k0)
    np.testing.assert_array_equal(v, v0)
    with pytest.raises(ss.SlimserveValueError):
        ss.import_request(cache, tags, d, tokens, wd, buf_a, expected=ss.RecordIdentity(pool_id, 0, 1))
    with pytest.raises(ss.SlimserveTypeError):
        ss.import_request(cache, tags, d, tokens, wd, buf_a, expected=(pool_id, wa))
    assert ss.import_request(cache, tags, d, tokens, wd, buf_a, expected=id_a) == ("ok", -1)
    (a0, _), (a1, _), (d0, _), (d1, _) = a[0], a[1], d[0], d[1]
    for after, before in ((k, k0), (v, v0)):
        np.testing.assert_array_equal(after[d0], before[a0])
        np.testing.assert_array_equal(after[d1, :last], before[a1, :last])
        np.testing.assert_array_equal(after[d1, last:], before[d1, last:])  # past the filled slots

    # Swap: A's pages to slots 0-1 and B's to 2-3, each under its identity (sequence 3).
    slots = ss.HostSlots(cache, 4)
    out = [{"page": p, "writer": w, "slot": i}
           for i, (p, w) in enumerate([(a[0], wa), (a[1], wa), (b[0], wb), (b[1], wb)])]
    id_a3, id_b3 = id_a._replace(sequence=3), id_b._replace(sequence=3)
    assert ss.swap_pages(cache, tags, slots, out, "out", identities=[id_a3, id_a3, id_b3, id_b3]) == [("ok", -1)] * 4
    k0, v0 = poison()
    into = [{"page": d[0], "writer": wd, "slot": 2}, {"page": d[1], "writer": wd, "slot": 3}]
    assert [s for s, _ in ss.swap_pages(cache, tags, slots, into, "in", identities=id_a3)] == ["record_mismatch"] * 2
    assert [s for s, _ in ss.swap_pages(cache, tags, slots, into, "in")] == ["record_mismatch"] * 2
    np.testing.assert_array_equal(k, k0)
    np.testing.assert_array_equal(v, v0)
    with pytest.raises(ss.SlimserveValueError):
        ss.swap_pages(cache, tags, slots, into, "sideways")
    with pytest.raises(ss.SlimserveValueError):
        ss.swap_pages(cache, tags, slots, into, "in", identities=[id_a3])
    into = [{"page": d[0], "writer": wd, "slot": 1}, {"page": d[1], "writer": wd, "slot": 0}]
    assert ss.swap_pages(cache, tags, slots, into, "in", identities=id_a3) == [("ok", -1)] * 2
    for after, before in ((k, k0), (v, v0)):
        np.testing.assert_array_equal(after[d0], before[a1])
        np.testing.assert_array_equal(after[d1], before[a0])
