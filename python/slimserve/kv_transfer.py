"""Cache layouts and page-granular transfer lists: what two engines need so a transfer engine
moves one request's KV pages between their caches in place (see docs/disaggregation.md).

`CacheLayout.of(cache)` describes a `PagedKVCache` (every format, per-token scale arrays
included) or an `MlaCache`; its `to_bytes()` is the wire form (136 bytes) and
`CacheLayout.from_bytes()` checks what a peer sent. `check_compatible(remote)` is what the
receiving side runs before anything moves: a mismatch raises SlimserveValueError naming the
field. `transfer_list(src, src_pages, dst, dst_pages, num_tokens)` gives the (source address,
destination address, bytes) rows, one per page piece, merged where both sides are contiguous.
`regions()` is the memory to register with the transfer engine, once per cache.
"""
from __future__ import annotations

import ctypes
from ctypes import byref, c_size_t
from typing import List, Sequence, Tuple

import numpy as np

from . import _capi, _check, _lib
from ._errors import type_error, value_error

LAYOUT_BYTES = ctypes.sizeof(_capi.CacheLayout)  # the wire form's size (136)
CACHE_KINDS = {0: "paged_kv", 1: "mla_latent"}


def _page_ids(pages, name: str) -> np.ndarray:
    """Page ids as a contiguous int32 array: ids, or (id, tag) handles."""
    if isinstance(pages, np.ndarray):
        ids = pages[:, 0] if pages.ndim == 2 else pages
    else:
        ids = [p[0] if isinstance(p, (tuple, list)) else p for p in pages]
    try:
        array = np.ascontiguousarray(ids, dtype=np.int64)
    except (TypeError, ValueError) as error:
        raise type_error(f"slimserve: {name} must be page ids or (id, tag) handles: {error}") from None
    if array.ndim != 1:
        raise value_error(f"slimserve: {name} must be a flat list of pages, got shape {array.shape}")
    if array.size and (array.min() < 0 or array.max() > np.iinfo(np.int32).max):
        raise value_error(f"slimserve: {name} holds page id {int(array.min() if array.min() < 0 else array.max())}",
                          "out_of_range")
    return array.astype(np.int32)


class CacheLayout:
    """The geometry of one cache (kind, format, layout, scale mode, page size, heads, head_dim,
    token record size) and of its arrays (address, page stride, span), as the C ABI's
    slimserve_cache_layout."""

    def __init__(self, struct: _capi.CacheLayout):
        if not isinstance(struct, _capi.CacheLayout):
            raise type_error("slimserve: CacheLayout wraps a slimserve_cache_layout; use CacheLayout.of(cache) "
                             "or CacheLayout.from_bytes(data)")
        self.struct = struct

    @classmethod
    def of(cls, cache) -> "CacheLayout":
        """The layout of a PagedKVCache or an MlaCache (validated)."""
        from .attention import MlaCache
        from . import PagedKVCache
        out = _capi.CacheLayout()
        if isinstance(cache, PagedKVCache):
            _check(_lib.slimserve_describe_kv_cache(byref(cache.view), cache.page_stride, byref(out)))
        elif isinstance(cache, MlaCache):
            _check(_lib.slimserve_describe_mla_cache(byref(cache.view), byref(out)))
        else:
            raise type_error(f"slimserve: cache must be a PagedKVCache or an MlaCache, got {type(cache).__name__}")
        return cls(out)

    @classmethod
    def from_bytes(cls, data: bytes) -> "CacheLayout":
        """Parses and checks a peer's layout (size, magic, version, enums, geometry, arrays)."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise type_error(f"slimserve: a cache layout arrives as bytes, got {type(data).__name__}")
        data = bytes(data)
        out = _capi.CacheLayout()
        _check(_lib.slimserve_cache_layout_parse(data, len(data), byref(out)))
        return cls(out)

    def to_bytes(self) -> bytes:
        """The wire form: the struct's LAYOUT_BYTES bytes."""
        return ctypes.string_at(byref(self.struct), LAYOUT_BYTES)

    def check_compatible(self, remote: "CacheLayout") -> None:
        """Raises SlimserveValueError naming the first field that differs (kind, dtype, layout,
        scale_mode, page_size, num_kv_heads, head_dim, token_bytes) unless pages move between
        this cache and `remote` byte for byte. Page counts, addresses and strides may differ."""
        if not isinstance(remote, CacheLayout):
            raise type_error(f"slimserve: remote must be a CacheLayout, got {type(remote).__name__}")
        _check(_lib.slimserve_cache_layout_check_compatible(byref(self.struct), byref(remote.struct)))

    def regions(self) -> List[Tuple[int, int]]:
        """(address, bytes) of the memory to register with a transfer engine, once per cache."""
        out = (_capi.CacheArray * 4)()
        n = _lib.slimserve_cache_registration_regions(byref(self.struct), out)
        return [(int(out[i].address), int(out[i].bytes)) for i in range(n)]

    def page_pieces(self) -> List[Tuple[int, int, int, int]]:
        """(address, bytes of one full page, page stride, num_pages) of each array, in the
        order transfer lists use (K, V, K scales, V scales; MLA: the records): full page p of
        array a starts at address + p * page stride. A transfer engine that prepares
        descriptor lists once per cache (NIXL's prep_xfer_dlist) prepares these, and a
        request of full pages is then the indices a * num_pages + page."""
        s = self.struct
        arrays = (s.k, s.v, s.k_scales, s.v_scales)[: s.num_arrays]
        return [(int(a.address), int(a.bytes - (s.num_pages - 1) * a.page_stride), int(a.page_stride),
                 int(s.num_pages)) for a in arrays]

    def capacity(self, num_pages: int) -> int:
        """Rows transfer_list may need for a request of `num_pages` pages."""
        return int(_lib.slimserve_transfer_list_capacity(byref(self.struct), int(num_pages)))

    def request_bytes(self, num_tokens: int) -> int:
        """Bytes a request of `num_tokens` tokens moves (its filled slots in every array)."""
        s = self.struct
        scales = 2 * 4 if s.num_arrays == 4 else 0
        per_head = (2 * s.token_bytes if s.num_arrays >= 2 else s.token_bytes) + scales
        return int(num_tokens) * s.num_kv_heads * per_head

    kind = property(lambda self: CACHE_KINDS.get(self.struct.kind, "unknown"), doc="paged_kv or mla_latent")
    num_pages = property(lambda self: self.struct.num_pages, doc="pages of the cache (the guard page included)")
    page_size = property(lambda self: self.struct.page_size, doc="tokens per page")
    num_kv_heads = property(lambda self: self.struct.num_kv_heads, doc="KV heads (MLA: 1)")
    head_dim = property(lambda self: self.struct.head_dim, doc="values per head row (MLA: the latent's 512)")
    token_bytes = property(lambda self: self.struct.token_bytes, doc="bytes of one (token, head) K row or MLA record")

    def __repr__(self) -> str:
        s = self.struct
        return (f"CacheLayout({self.kind}, dtype={s.dtype}, layout={s.layout}, scale_mode={s.scale_mode}, "
                f"num_pages={s.num_pages}, page_size={s.page_size}, heads={s.num_kv_heads}, head_dim={s.head_dim})")


def transfer_list(src: CacheLayout, src_pages: Sequence, dst: CacheLayout, dst_pages: Sequence,
                  num_tokens: int) -> np.ndarray:
    """The (src address, dst address, bytes) rows, uint64 [n, 3], moving a request of
    `num_tokens` tokens from `src_pages` of the cache `src` describes into `dst_pages` of
    `dst` (page ids or (id, tag) handles, in sequence order). Refuses incompatible layouts
    (naming the field), page counts that do not fit num_tokens, ids outside 1..num_pages - 1,
    a page listed twice."""
    if not isinstance(src, CacheLayout) or not isinstance(dst, CacheLayout):
        raise type_error("slimserve: src and dst must be CacheLayout objects")
    s, d = _page_ids(src_pages, "src_pages"), _page_ids(dst_pages, "dst_pages")
    if s.size != d.size:
        raise value_error(f"slimserve: {s.size} source pages and {d.size} destination pages")
    capacity = max(src.capacity(s.size), 1)
    out = np.empty((capacity, 3), dtype=np.uint64)
    count = c_size_t()
    _check(_lib.slimserve_build_transfer_list(
        byref(src.struct), s.ctypes.data, byref(dst.struct), d.ctypes.data, int(s.size), int(num_tokens),
        out.ctypes.data_as(ctypes.POINTER(_capi.TransferEntry)), capacity, byref(count)))
    return out[: count.value]


def coalesce(rows: np.ndarray) -> np.ndarray:
    """The fewest (src, dst, bytes) rows that move the same bytes as `rows` ([n, 3] uint64, any
    order, pieces that do not overlap on either side): sorted by source address, a row merged
    into the previous one when its source and its destination both continue it. That is the
    minimum for any layout: two pieces can be one descriptor only when they touch on both
    sides. It merges across arrays too, which the per-array list cannot: a combined K/V
    allocation's run of pages (K, V, K, V, ...) becomes one row, so a request costs one
    descriptor per run of pages per array that is not adjacent to the others (per-token scale
    arrays: one per run each). slimserve_coalesce_transfer_list in C, kv::coalesce_transfer_list
    in C++."""
    rows = np.asarray(rows, dtype=np.uint64)
    if rows.ndim != 2 or rows.shape[1] != 3:
        raise value_error(f"slimserve: rows must be [n, 3] (src, dst, bytes), got shape {rows.shape}")
    out = np.array(rows, dtype=np.uint64, order="C")  # a copy: the C call works in place
    count = c_size_t()
    _check(_lib.slimserve_coalesce_transfer_list(out.ctypes.data_as(ctypes.POINTER(_capi.TransferEntry)),
                                                 len(out), byref(count)))
    return out[: count.value]


def _runs(sorted_ids: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(index of the first id, length) of each run of consecutive ids in an ascending array."""
    breaks = np.flatnonzero(np.diff(sorted_ids) != 1) + 1
    starts = np.concatenate(([0], breaks)) if sorted_ids.size else np.zeros(0, np.int64)
    return starts, np.diff(np.concatenate((starts, [sorted_ids.size])))


def match_page_runs(src_pages: Sequence, reserved_pages: Sequence) -> np.ndarray:
    """Which reserved page receives each source page: int32 [n], entry i the reserved id for
    src_pages[i] (sequence order). Any one-to-one choice is correct (the request's page table
    records it); this one makes runs of the source's pages (adjacent in its pool, either
    direction) land on runs of the reserved pages, so a transfer list merges each run into
    one piece per array. Source runs go longest first, each into the shortest free run of
    reserved pages that holds it whole (best fit), or, when none does, into the longest free
    run, the rest of the source run continuing the same way."""
    import bisect
    src = _page_ids(src_pages, "src_pages")
    reserved = np.sort(_page_ids(reserved_pages, "reserved_pages"))
    if src.size != reserved.size:
        raise value_error(f"slimserve: {src.size} source pages and {reserved.size} reserved pages")
    by_source = np.argsort(src, kind="stable")
    src_sorted = src[by_source]
    if src.size and np.any(np.diff(src_sorted) == 0):
        raise value_error("slimserve: src_pages lists a page twice")
    if reserved.size and np.any(np.diff(reserved) == 0):
        raise value_error("slimserve: reserved_pages lists a page twice")
    sorted_dst = np.empty(src.size, np.int32)  # destination of src_sorted[j]
    assigned = np.zeros(src.size, bool)
    starts, lengths = _runs(src_sorted)
    longest_first = np.flatnonzero(lengths > 1)
    longest_first = longest_first[np.argsort(-lengths[longest_first], kind="stable")]
    if longest_first.size:
        free_starts, free_lengths = _runs(reserved)
        free = sorted(zip(free_lengths.tolist(), reserved[free_starts].tolist()))  # by length, then id
        pieces = []  # (first position, first reserved id, pages)
        for start, length in zip(starts[longest_first].tolist(), lengths[longest_first].tolist()):
            while length:
                i = bisect.bisect_left(free, (length, -1))
                if i == len(free):
                    i = len(free) - 1  # none holds it whole: the longest, then the rest
                have, first = free.pop(i)
                take = min(have, length)
                pieces.append((start, first, take))
                if have > take:
                    bisect.insort(free, (have - take, first + take))
                start, length = start + take, length - take
        at, first, take = (np.array(column, np.int64) for column in zip(*pieces))
        positions = np.repeat(at - np.cumsum(take) + take, take) + np.arange(int(take.sum()))
        sorted_dst[positions] = positions + np.repeat(first - at, take)
        assigned[positions] = True
    # One-page runs: any page left will do.
    sorted_dst[~assigned] = np.setdiff1d(reserved, sorted_dst[assigned], assume_unique=True)
    out = np.empty(src.size, np.int32)
    out[by_source] = sorted_dst
    return out
