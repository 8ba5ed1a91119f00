"""Prefill/decode disaggregation over NIXL: one request's KV pages move from the prefill
engine's cache into the decode engine's, page by page, in place (docs/disaggregation.md).

NIXL (PyPI `nixl` with `nixl-cu12` or `nixl-cu13`, installed with --no-deps) is imported on
first use, so `import slimserve.nixl` works without it. Each side registers its cache once
(`PrefillSide` / `DecodeSide`: the regions `CacheLayout.regions()` names), as "DRAM" with the
emulated library and "VRAM" with the CUDA build; the UCX backend moves the bytes (on one host,
`UCX_NET_DEVICES=lo` keeps it on loopback). Agent metadata goes over any side channel the
engines have (`metadata()` / `connect()`); the protocol's messages are NIXL notifications.

Protocol (the decode side reads):
  1. prefill `offer(id, pages, num_tokens)`: the binding takes over the engine's reference;
  2. decode `receive(peer, id, num_tokens)`: reserves its pages all or nothing (a pool out of
     pages is refused here, before any message), sends REQUEST (its layout and page list);
  3. prefill checks the layout (a mismatch is refused naming the field), the id (unknown or
     already in progress: refused) and its pages' tags (released pages: refused), answers GRANT
     (its layout and page list);
  4. decode checks the layout, maps its reserved pages onto the source's so runs meet runs
     (match_page_runs), posts one NIXL READ for the request (full pages: page indices
     into the descriptor lists it prepared once per cache; a partly filled last page: the
     request's transfer list, coalesced), its completion notifies the prefill side; a grant
     naming memory the prefill side never registered is refused before any byte moves;
  5. prefill checks its pages' tags again (pages released during the read: the verdict is
     stale) and sends the VERDICT;
  6. decode, only on an ok verdict, grants write ownership to the request's identity and
     publishes the pages (the handles go to the engine; receive_request adopts them into the
     engine's RequestSets instead, and device_tags= records their fills), then sends PUBLISHED;
     only then does the prefill side release its pages.
Every wait is bounded: a decode side that times out (prefill killed, verdict lost) releases its
reservation (the next owner gets new tags), sends CANCEL and raises TransferFailed for that
request alone; a read still in flight keeps its pages out of the pool until NIXL reports it
finished (`quarantined`). A GRANT or VERDICT for a request the decode side gave up is dropped.
"""
from __future__ import annotations

import os
import struct
import time
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import EMULATED, PagePool, SlimserveError, _check, _lib
from .kv_transfer import LAYOUT_BYTES, CacheLayout, _page_ids, coalesce, match_page_runs, transfer_list

_MAGIC = b"SSX1"
REQUEST, GRANT, REFUSE, VERDICT, PUBLISHED, CANCEL, READ_DONE = range(1, 8)
_HEADER = struct.Struct("<4sBQ")  # magic, kind, transfer id


class TransferFailed(SlimserveError):
    """One request's transfer failed; nothing was published and its pages went back to the pool
    (or to quarantine while a read is still in flight). `.transfer_id`, `.reason`."""

    def __init__(self, transfer_id: int, reason: str, code: str = "failed_precondition"):
        super().__init__(f"slimserve.nixl: transfer {transfer_id}: {reason}", code)
        self.transfer_id, self.reason = transfer_id, reason


def load_nixl():
    """NIXL's (nixl_agent, nixl_agent_config), imported on first use."""
    try:
        from nixl._api import nixl_agent, nixl_agent_config
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError("slimserve.nixl needs NIXL: pip install --no-deps nixl==1.5.1 nixl-cu13==1.5.1 "
                          "(scripts/python-env installs it into build/pyenv)") from error
    return nixl_agent, nixl_agent_config


def _message(kind: int, transfer_id: int, payload: bytes = b"") -> bytes:
    return _HEADER.pack(_MAGIC, kind, transfer_id) + payload


def _pages_payload(num_tokens: int, layout: CacheLayout, ids: np.ndarray) -> bytes:
    return struct.pack("<qi", num_tokens, ids.size) + layout.to_bytes() + ids.astype("<i4").tobytes()


def _parse_pages_payload(payload: bytes) -> Tuple[int, CacheLayout, np.ndarray]:
    num_tokens, count = struct.unpack_from("<qi", payload)
    start = 12 + LAYOUT_BYTES
    if count < 0 or len(payload) != start + 4 * count:
        raise SlimserveError(f"slimserve.nixl: a page list of {len(payload)} bytes claims {count} pages", "data_loss")
    layout = CacheLayout.from_bytes(payload[12:start])
    return num_tokens, layout, np.frombuffer(payload, "<i4", count, start).astype(np.int32)


class _Endpoint:
    """A NIXL agent with one cache registered (once, for the agent's lifetime)."""

    def __init__(self, name: str, pool: PagePool, cache, *, device_id: int = 0, mem_type: Optional[str] = None):
        nixl_agent, nixl_agent_config = load_nixl()
        self.name, self.pool, self.device_id = name, pool, int(device_id)
        self.layout = CacheLayout.of(cache)
        self.mem_type = mem_type or ("DRAM" if EMULATED else "VRAM")
        self.agent = nixl_agent(name, nixl_agent_config(backends=["UCX"]))
        self._registered = self.agent.register_memory(
            [(address, size, self.device_id, "") for address, size in self.layout.regions()], self.mem_type)
        self._cache = cache  # the registered memory stays alive with the endpoint
        self._inbox: List[Tuple[str, bytes]] = []

    def metadata(self) -> bytes:
        """This agent's NIXL metadata, for the peer's connect() (any side channel)."""
        return self.agent.get_agent_metadata()

    def connect(self, metadata: bytes) -> str:
        """Adds the peer agent; returns its name."""
        name = self.agent.add_remote_agent(metadata)
        return name.decode() if isinstance(name, bytes) else name

    def _send(self, peer: str, kind: int, transfer_id: int, payload: bytes = b"") -> None:
        self.agent.send_notif(peer, _message(kind, transfer_id, payload))

    def _drain(self) -> None:
        for peer, messages in self.agent.get_new_notifs().items():
            for m in messages:
                if len(m) >= _HEADER.size and m[:4] == _MAGIC:
                    self._inbox.append((peer, bytes(m)))

    def _take(self, want) -> Optional[Tuple[str, int, int, bytes]]:
        """The first message for which want(kind, id) holds, removed from the inbox."""
        self._drain()
        for i, (peer, m) in enumerate(self._inbox):
            _, kind, transfer_id = _HEADER.unpack_from(m)
            if want(kind, transfer_id):
                del self._inbox[i]
                return peer, kind, transfer_id, m[_HEADER.size:]
        return None

    def close(self) -> None:
        """Deregisters the cache's memory (the agent goes with the object)."""
        if getattr(self, "_registered", None) is not None:
            self.agent.deregister_memory(self._registered)
            self._registered = None


class PrefillSide(_Endpoint):
    """The side whose cache holds a request's pages after prefill. `offer` hands a request's
    pages to the binding; `poll` answers the decode side and releases pages once published
    (or cancelled, or expired)."""

    def __init__(self, name: str, pool: PagePool, cache, **kwargs):
        super().__init__(name, pool, cache, **kwargs)
        self.offers: Dict[int, dict] = {}
        self.completed: List[int] = []
        self.refused: List[Tuple[int, str]] = []
        self.release_errors: List[Tuple[int, str]] = []

    def offer(self, transfer_id: int, pages: Sequence[Tuple[int, int]], num_tokens: int,
              timeout_s: float = 30.0) -> None:
        """Offers a prefilled request: `pages` ([num_pages] (id, tag) handles, sequence order)
        now belong to the binding, which releases them once the decode side has published them,
        on a cancel from the decode side it granted them to, or after `timeout_s`."""
        transfer_id = int(transfer_id)
        if transfer_id in self.offers:
            raise SlimserveError(f"slimserve.nixl: transfer id {transfer_id} is already offered", "failed_precondition")
        pages = [(int(p), int(t)) for p, t in pages]
        for page in pages:
            self.pool.validate(page)
        self.offers[transfer_id] = {"pages": pages, "num_tokens": int(num_tokens), "state": "offered",
                                    "deadline": time.monotonic() + timeout_s, "peer": None}

    def _refuse(self, peer: str, transfer_id: int, reason: str) -> None:
        self.refused.append((transfer_id, reason))
        self._send(peer, REFUSE, transfer_id, reason.encode())

    def _pages_live(self, offer) -> Optional[str]:
        for page in offer["pages"]:
            if not self.pool.is_live(page):
                return f"source page {page[0]} (tag {page[1]}) was released or has a new owner"
        return None

    def _finish(self, transfer_id: int, state: str) -> None:
        offer = self.offers.pop(transfer_id)
        try:
            self.pool.release(offer["pages"])
        except SlimserveError as error:  # the engine released them itself: refused, nothing changed
            self.release_errors.append((transfer_id, str(error)))
        if state == "published":
            self.completed.append(transfer_id)

    def poll(self) -> int:
        """Handles the messages that arrived and the offers that expired; returns how many."""
        handled = 0
        while True:
            got = self._take(lambda kind, tid: True)
            if got is None:
                break
            handled += 1
            peer, kind, transfer_id, payload = got
            offer = self.offers.get(transfer_id)
            if kind == REQUEST:
                try:
                    num_tokens, remote, _ = _parse_pages_payload(payload)
                    self.layout.check_compatible(remote)
                except SlimserveError as error:
                    self._refuse(peer, transfer_id, str(error))
                    continue
                if offer is None:
                    self._refuse(peer, transfer_id, "unknown transfer id")
                elif offer["state"] != "offered":
                    self._refuse(peer, transfer_id, "duplicate request: this transfer id is already in progress")
                elif num_tokens != offer["num_tokens"]:
                    self._refuse(peer, transfer_id, f"asks for {num_tokens} tokens; the offer holds {offer['num_tokens']}")
                elif (stale := self._pages_live(offer)) is not None:
                    self._refuse(peer, transfer_id, stale)
                    self._finish(transfer_id, "stale")
                else:
                    offer["state"], offer["peer"] = "granted", peer
                    ids = np.array([p for p, _ in offer["pages"]], np.int32)
                    self._send(peer, GRANT, transfer_id, _pages_payload(offer["num_tokens"], self.layout, ids))
            elif offer is None or offer["peer"] != peer:
                continue  # only the decode side the request was granted to may finish or cancel it
            elif kind == READ_DONE and offer["state"] == "granted":
                stale = self._pages_live(offer)
                offer["state"] = "read" if stale is None else "stale"
                self._send(peer, VERDICT, transfer_id, b"\x01" if stale is None else b"\x00" + stale.encode())
            elif kind == PUBLISHED:
                self._finish(transfer_id, "published")
            elif kind == CANCEL:
                self._finish(transfer_id, "cancelled")
        now = time.monotonic()
        for transfer_id in [t for t, o in self.offers.items() if o["deadline"] < now]:
            self._finish(transfer_id, "expired")
            handled += 1
        return handled


class DecodeSide(_Endpoint):
    """The side that continues a request: `receive` reserves pages, reads the prefill side's
    pages into them over NIXL and returns them published (or raises TransferFailed)."""

    def __init__(self, name: str, pool: PagePool, cache, **kwargs):
        super().__init__(name, pool, cache, **kwargs)
        self.quarantined: List[Tuple[object, List[Tuple[int, int]]]] = []
        self.abandoned: set = set()
        self.late_messages = 0
        self.last_stats: dict = {}
        # NIXL descriptor lists of every full page piece, prepared once: this cache's at
        # construction, a peer cache's on its first grant. A request of full pages is then two
        # index arrays, not a list of descriptors built and checked per request.
        self._prepared: Dict[Tuple[str, bytes, bool], object] = {}
        self._prepared_list("NIXL_INIT_AGENT", self.layout, self._kv_interleaved(self.layout))

    @staticmethod
    def _kv_interleaved(layout: CacheLayout) -> bool:
        """Each page's V piece follows its K piece (one combined K/V allocation)."""
        pieces = layout.page_pieces()
        return (len(pieces) >= 2 and pieces[1][0] == pieces[0][0] + pieces[0][1]
                and pieces[0][2] == pieces[1][2] == 2 * pieces[0][1])

    @staticmethod
    def _pieces(layout: CacheLayout, kv_merged: bool):
        """page_pieces, with a page's K and V as one piece where kv_merged (both caches
        interleave them): one descriptor per page for both, and runs of pages still merge."""
        pieces = layout.page_pieces()
        if kv_merged:
            address, size, stride, count = pieces[0]
            pieces = [(address, 2 * size, stride, count)] + pieces[2:]
        return pieces

    def _prepared_list(self, agent_name: str, layout: CacheLayout, kv_merged: bool):
        key = (agent_name, layout.to_bytes(), kv_merged)  # the bytes hold the arrays' addresses
        if key not in self._prepared:
            rows = np.array([(address, size, self.device_id, stride, count)
                             for address, size, stride, count in self._pieces(layout, kv_merged)], np.uint64)
            self._prepared[key] = self.agent.prep_xfer_dlist(agent_name, rows, self.mem_type)
        return self._prepared[key]

    def _prepared_xfer(self, operation: str, peer: str, remote: CacheLayout, src_ids: np.ndarray,
                       ids: np.ndarray, notification: bytes = b""):
        """(handle, descriptors): one transfer of the full pages src_ids of the peer's cache
        and ids of this one over the prepared lists, indices only: piece a of page p is index
        a * num_pages + p, array by array and, within an array, in the order of the source ids,
        so a run of pages adjacent on both sides is consecutive indices into both lists, which
        NIXL merges into one descriptor. `descriptors` counts them after that merge. The
        source ids are checked as transfer_list checks them."""
        if src_ids.size and (src_ids.min() < 1 or src_ids.max() >= remote.num_pages):
            raise SlimserveError(f"slimserve.nixl: the grant lists a page outside 1..{remote.num_pages - 1}",
                                 "out_of_range")
        if np.unique(src_ids).size != src_ids.size:
            raise SlimserveError("slimserve.nixl: the grant lists a page twice", "invalid_argument")
        merged = self._kv_interleaved(self.layout) and self._kv_interleaved(remote)
        order = np.argsort(src_ids, kind="stable")
        src_ids, ids = src_ids[order], ids[order]
        arrays = np.arange(len(self._pieces(self.layout, merged)), dtype=np.int64)[:, None]
        local = (arrays * self.layout.num_pages + ids[None, :]).ravel().astype(np.int32)
        far = (arrays * remote.num_pages + src_ids[None, :]).ravel().astype(np.int32)
        handle = self.agent.make_prepped_xfer(operation, self._prepared_list("NIXL_INIT_AGENT", self.layout, merged),
                                              local, self._prepared_list(peer, remote, merged), far, notification)
        runs = 1 + int(np.count_nonzero((np.diff(src_ids) != 1) | (np.diff(ids) != 1))) if ids.size else 0
        return handle, runs * arrays.shape[0]

    def poll(self) -> None:
        """Returns quarantined pages whose read NIXL reports finished; drops messages for
        requests given up."""
        still = []
        for handle, pages in self.quarantined:
            if self._state(handle) == "PROC":
                still.append((handle, pages))
            else:
                self._release_handle(handle)
                self.pool.release(pages)
        self.quarantined = still
        while self._take(lambda kind, tid: tid in self.abandoned) is not None:
            self.late_messages += 1

    def _state(self, handle) -> str:
        """DONE, PROC or ERR (NIXL raises on a peer that went away: that is ERR too)."""
        try:
            return self.agent.check_xfer_state(handle)
        except Exception:  # nixlRemoteDisconnectError and kin
            return "ERR"

    def _wait(self, transfer_id: int, kinds, deadline: float):
        while True:
            got = self._take(lambda kind, tid: tid == transfer_id and kind in kinds)
            if got is not None:
                return got
            if time.monotonic() > deadline:
                return None
            time.sleep(0.0002)

    def new_writer(self) -> int:
        """A new write identity of this side's pool (never 0), for receive(writer=...)."""
        return self.pool.new_writer()

    def writer(self, page: int) -> int:
        """The identity holding the write right on `page` (0: read-only)."""
        return int(_lib.slimserve_page_pool_writer(self.pool._handle, int(page)))

    def receive(self, peer: str, transfer_id: int, num_tokens: int, *, timeout_s: float = 10.0,
                writer: Optional[int] = None, device_tags=None, stream=None,
                hold_before_read=None, hold_before_publish=None) -> List[Tuple[int, int]]:
        """Moves offered request `transfer_id` (num_tokens tokens) from `peer` into pages of this
        cache; returns their handles once the prefill side confirmed its pages were unchanged
        through the read, write ownership granted to `writer` (new_writer(); None: the pages stay
        read-only). Until then the reserved pages are nobody's to write. With `device_tags`
        (this pool's DeviceTags) the pages' device fills are recorded (num_tokens tokens), so a
        tag check with check_fill sees their lengths. Bounded by timeout_s; raises
        TransferFailed with nothing published. `hold_before_read(pages)` and
        `hold_before_publish(pages)`, when given, run between the grant and the READ and between
        the verdict and publication (tests stop the prefill process or look at the pages there)."""
        def grant(pages):
            if writer is not None:  # the request's identity may write its pages now
                for page in pages:
                    self.pool.grant_write(page, int(writer))
        return self._receive(peer, transfer_id, num_tokens, timeout_s, grant, device_tags, stream,
                             hold_before_read, hold_before_publish)

    def receive_request(self, sets, peer: str, transfer_id: int, num_tokens: int, *, device_tags=None,
                        stream=None, timeout_s: float = 10.0, hold_before_read=None, hold_before_publish=None):
        """receive(), published into the engine's RequestSets: (request, pages), the pages
        adopted by `sets` as a request of num_tokens tokens (RequestSets.adopt: its identity may
        write them; append, preempt and finish work on it as on an admitted request) and, with
        `device_tags`, their device fills recorded. A refused adoption (no free slot) fails the
        transfer like any other fault: nothing published, the pages back in the pool."""
        adopted = []
        pages = self._receive(peer, transfer_id, num_tokens, timeout_s,
                              lambda pages: adopted.append(sets.adopt(pages, int(num_tokens))),
                              device_tags, stream, hold_before_read, hold_before_publish)
        return adopted[0], pages

    def _receive(self, peer, transfer_id, num_tokens, timeout_s, publish, device_tags, stream,
                 hold_before_read, hold_before_publish) -> List[Tuple[int, int]]:
        self.poll()
        transfer_id = int(transfer_id)
        page_size = self.layout.page_size
        count = -(-int(num_tokens) // page_size)
        pages = self.pool.allocate(count)  # all or nothing: a shortage raises here, before any message
        deadline = time.monotonic() + timeout_s
        handle, published = None, False
        t0 = time.perf_counter()
        try:
            ids = _page_ids(pages, "pages")
            self._send(peer, REQUEST, transfer_id, _pages_payload(int(num_tokens), self.layout, ids))
            got = self._wait(transfer_id, (GRANT, REFUSE), deadline)
            if got is None:
                raise TransferFailed(transfer_id, "no answer from the prefill side in time", "io_error")
            if got[1] == REFUSE:
                raise TransferFailed(transfer_id, "refused by the prefill side: " + got[3].decode(errors="replace"))
            t_grant = time.perf_counter()
            remote_tokens, remote, src_ids = _parse_pages_payload(got[3])
            self.layout.check_compatible(remote)  # the receiver's own check, before any byte moves
            if remote_tokens != num_tokens:
                raise TransferFailed(transfer_id, f"the grant holds {remote_tokens} tokens, not {num_tokens}")
            if src_ids.size != len(pages):
                raise TransferFailed(transfer_id, f"the grant lists {src_ids.size} pages for {len(pages)} reserved")
            # Which reserved page takes which source page: runs of the source's pages land on runs
            # of the reserved ones (match_page_runs), so each run moves as one descriptor per array.
            tags = dict(pages)
            ids = match_page_runs(src_ids, _page_ids(pages, "pages"))
            pages[:] = [(int(p), tags[int(p)]) for p in ids]
            if hold_before_read is not None:
                hold_before_read(pages)
            try:
                if int(num_tokens) % page_size == 0:  # full pages: indices into the prepared lists
                    handle, entries = self._prepared_xfer("READ", peer, remote, src_ids, ids,
                                                          _message(READ_DONE, transfer_id))
                else:  # a partly filled last page: the request's own list (slots past it do not move)
                    rows = coalesce(transfer_list(remote, src_ids, self.layout, ids, int(num_tokens)))
                    dev = np.full(len(rows), self.device_id, np.uint64)
                    local = np.stack([rows[:, 1], rows[:, 2], dev], axis=1)
                    far = np.stack([rows[:, 0], rows[:, 2], dev], axis=1)
                    handle = self.agent.initialize_xfer(
                        "READ", self.agent.get_xfer_descs(local, self.mem_type),
                        self.agent.get_xfer_descs(far, self.mem_type), peer, _message(READ_DONE, transfer_id))
                    entries = len(rows)
            except Exception as error:  # NIXL checks remote descriptors against the peer's registrations
                if "NotFound" not in type(error).__name__:
                    raise
                raise TransferFailed(transfer_id, "the grant's descriptors are not in the memory the prefill side "
                                     f"registered (stale or forged), refused before any byte moved: "
                                     f"{type(error).__name__}: {error}", "failed_precondition") from error
            t_posted = time.perf_counter()
            try:
                state = self.agent.transfer(handle)
            except Exception:  # the peer went away between the grant and the post
                state = "ERR"
            while state == "PROC" and time.monotonic() < deadline:
                state = self._state(handle)
            t_done = time.perf_counter()
            if state != "DONE":
                raise TransferFailed(transfer_id, "the read failed (prefill side gone?)" if state == "ERR"
                                     else "the read did not finish in time", "io_error")
            self._release_handle(handle)
            handle = None
            got = self._wait(transfer_id, (VERDICT,), deadline)
            if got is None:
                raise TransferFailed(transfer_id, "no verdict from the prefill side in time", "io_error")
            if got[3][:1] != b"\x01":
                raise TransferFailed(transfer_id, "the prefill side's tag check refused the read: "
                                     + got[3][1:].decode(errors="replace"), "stale_handle")
            if hold_before_publish is not None:
                hold_before_publish(pages)
            if device_tags is not None:  # fills under the pages' tags: a later owner's check reads 0
                device_tags.record_fills(pages, int(num_tokens), page_size, stream)
            publish(pages)  # the last step that may fail: afterwards the pages are the engine's
            published = True
            try:
                self._send(peer, PUBLISHED, transfer_id)
            except Exception:  # the prefill side is gone: its offer expires there; ours is done
                pass
            self.last_stats = {"descriptors": entries, "bytes": self.layout.request_bytes(int(num_tokens)),
                               "setup_us": (t_posted - t_grant) * 1e6, "read_s": t_done - t_posted,
                               "total_s": time.perf_counter() - t0}
            return pages
        except BaseException as error:
            if published:  # only the statistics below failed: the pages are the engine's
                raise
            self.abandoned.add(transfer_id)
            if handle is not None and not self._abort(handle, pages):
                pass  # quarantined: the read may still land, its pages stay out of the pool
            else:
                self.pool.release(pages)
            try:
                self._send(peer, CANCEL, transfer_id)
            except Exception:  # the peer may be gone; the cancel is a courtesy
                pass
            if isinstance(error, TransferFailed) or not isinstance(error, Exception):
                raise
            code = error.code if isinstance(error, SlimserveError) else "io_error"  # NIXL's own errors
            raise TransferFailed(transfer_id, f"{type(error).__name__}: {error}", code) from error

    def close(self) -> None:
        """Releases the prepared descriptor lists, then deregisters the cache's memory."""
        for handle in getattr(self, "_prepared", {}).values():
            try:
                self.agent.release_dlist_handle(handle)
            except Exception:  # a peer already removed: its list goes with the agent
                pass
        self._prepared = {}
        super().close()

    def _release_handle(self, handle) -> bool:
        try:
            self.agent.release_xfer_handle(handle)
            return True
        except Exception:
            return False

    def _abort(self, handle, pages) -> bool:
        """Releases an unfinished read; False (pages quarantined) when NIXL cannot cancel it yet:
        until it reports the read finished or failed, bytes may still land in those pages."""
        if self._state(handle) != "PROC" and self._release_handle(handle):
            return True
        if self._release_handle(handle):  # NIXL cancelled the read
            return True
        self.quarantined.append((handle, pages))
        return False


def loopback_environment() -> None:
    """Keeps UCX on the loopback device unless the caller chose (UCX_NET_DEVICES=lo)."""
    os.environ.setdefault("UCX_NET_DEVICES", "lo")
