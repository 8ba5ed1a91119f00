"""The tag guard inside vLLM: slimserve's generation tags and write owners for vLLM's block ids,
checked on the device before every step's append and attention.

vLLM's scheduler owns the blocks (its KVCacheManager / BlockPool); the worker learns each step
from the SchedulerOutput which blocks every request gained and lost. The guard mirrors that in
a slimserve PagePool with one page per vLLM block (block 0, vLLM's null block, is slimserve's
guard page) and keeps, per request, the (block, tag) handles it holds:

  gained, fresh      a block vLLM allocated for the request (a new request's blocks past its
                     prefix hits, a running request's new_block_ids, a resumed request's
                     blocks): the block gets a new generation (new tag) and the request's
                     write right. A request still holding it under the old tag is stale.
  gained, shared     a prefix-cache hit (a new or resumed request's blocks that cover its
                     num_computed_tokens): the request holds the block under its current tag,
                     read-only (the write right of its earlier writer is revoked).
  lost               finished, or resumed after preemption (vLLM then sends the full new list):
                     the request's handles are dropped and the write rights it held revoked;
                     the blocks keep their tags (a later prefix hit still matches).
  received           blocks a KV connector fills (disaggregated prefill: the decode side's
                     NixlConnector reads them from the prefill server). When the scheduler
                     hands them to the connector (`kv_connector_metadata.reqs_to_recv`) they get
                     a new generation written by the transfer alone, so no earlier holder reads
                     them; the request may hold them only after the connector reports the
                     transfer done (`finished_recving`). Scheduled before that, it is never
                     admitted and the check refuses it. Admitted, its full received blocks are
                     read-only like prefix hits (they count in num_computed_tokens).

Each step, before the first layer: the device tags are synced from the pool (only the changed
entries), the expected tags of every row of vLLM's block table and every request's writer
identity are uploaded into persistent device buffers, and slimserve_check_block_tags runs over
vLLM's own device block table, seq_lens and query_start_loc (the rows' appended positions are
checked for the write right, every other position for reading). Its verdicts go to the
attention run (an aborted request reads no block; its rows are NaN), and the step's
slot_mapping is rewritten on the device with -1 for the tokens of aborted requests (the append
writes nothing for them). None of this synchronizes with the device.

After the step (the sampled tokens are on the host already) the verdicts are read back; an
aborted request is reported to the scheduler on the ModelRunnerOutput (`slimserve_aborted`:
request id -> reason), and hooks.py finishes it with FinishReason.ERROR without the token its
NaN logits gave. Mirroring the pool needs a page to get a new generation on demand: the guard
holds every page once and releases then re-allocates one (the pool's free list is a stack, so
it returns that page; checked, refused with an error otherwise)."""
from __future__ import annotations

import ctypes
import os
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np
import torch

import slimserve as _s

from . import stats

# SLIMSERVE_VLLM_GUARD=0 turns the guard off (the plugin then runs without tags).
ENV_SWITCH = "SLIMSERVE_VLLM_GUARD"
STATE_NAMES = _s.REQUEST_STATES if hasattr(_s, "REQUEST_STATES") else {}


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "1") not in ("0", "false", "off", "")


@dataclass
class HeldBlocks:
    """One request's blocks in order, the tag it holds each under, its writer identity."""
    writer: int
    blocks: List[int] = field(default_factory=list)
    tags: List[int] = field(default_factory=list)


class BlockGuard:
    """Worker-side bookkeeping of one engine's blocks (one KV cache group)."""

    def __init__(self, *, num_blocks: int, block_size: int, max_num_seqs: int, max_blocks_per_req: int,
                 device=None):
        if num_blocks < 2:
            raise ValueError(f"slimserve vLLM guard: {num_blocks} KV blocks (block 0 is reserved)")
        self.num_blocks, self.block_size = num_blocks, block_size
        self.pool = _s.PagePool(num_blocks)
        self.tags = _s.DeviceTags(num_blocks)
        held = self.pool.allocate(num_blocks - 1)  # the guard holds every page once
        self.page_tag = np.zeros(num_blocks, np.uint32)
        for page, tag in held:
            self.page_tag[page] = tag
        self.page_writer = np.zeros(num_blocks, np.uint32)  # host copy of the write owners
        self.requests: Dict[str, HeldBlocks] = {}
        self.receiving: Dict[str, HeldBlocks] = {}  # connector transfers not reported done
        self.received: set = set()  # requests whose transfer is done, not yet admitted
        self.max_num_seqs, self.width = max_num_seqs, max_blocks_per_req
        device = torch.device("cpu") if device is None else torch.device(device)
        # Persistent device buffers (their addresses never change).
        self._expected = _s.DeviceArray(np.zeros(max_num_seqs * max_blocks_per_req, np.uint32))
        self._writers = _s.DeviceArray(np.zeros(max_num_seqs, np.uint32))
        self.statuses = torch.zeros((max_num_seqs, 2), dtype=torch.int32, device=device)
        self._slots = torch.empty(0, dtype=torch.int64, device=device)
        self._host_expected = np.zeros((max_num_seqs, max_blocks_per_req), np.uint32)
        self._host_writers = np.zeros(max_num_seqs, np.uint32)
        self.rows: List[str] = []  # the request id of each row of the last checked step
        self.host_seconds = 0.0  # bookkeeping (deltas + table of expected tags), all steps
        self.check_seconds = 0.0  # sync + uploads + check launch + slot masking, all steps
        self.steps = 0

    # ---- deltas from the scheduler's output ----------------------------------------------

    def _new_generation(self, block: int, writer: int) -> int:
        """Block `block` has a new owner: a new tag, writable by `writer` only."""
        if not 0 < block < self.num_blocks:
            raise ValueError(f"slimserve vLLM guard: block id {block} outside 1..{self.num_blocks - 1}")
        self.pool.release([(block, int(self.page_tag[block]))])
        (page, tag), = self.pool.allocate(1)
        if page != block:  # the free list handed out another page: the mirror cannot follow
            raise RuntimeError(f"slimserve vLLM guard: the page pool renewed page {page}, not block {block}")
        self.page_tag[block] = tag
        self.pool.grant_write((block, tag), writer)
        self.page_writer[block] = writer
        return tag

    def _share(self, block: int) -> int:
        """A prefix hit: held under its current tag, read-only from now on."""
        if not 0 < block < self.num_blocks:
            raise ValueError(f"slimserve vLLM guard: block id {block} outside 1..{self.num_blocks - 1}")
        if self.page_writer[block]:
            self.pool.revoke_write((block, int(self.page_tag[block])))
            self.page_writer[block] = 0
        return int(self.page_tag[block])

    def _drop(self, req_id: str) -> None:
        held = self.requests.pop(req_id, None)
        if held is None:
            return
        for block, tag in zip(held.blocks, held.tags):
            if self.page_tag[block] == tag and self.page_writer[block] == held.writer:
                self.pool.revoke_write((block, tag))
                self.page_writer[block] = 0

    def _admit(self, req_id: str, block_ids, num_computed_tokens: int) -> None:
        self._drop(req_id)
        if req_id in self.receiving:  # its blocks' bytes are still arriving: refused at the check
            stats.count("guard_transfer_pending")
            return
        self.received.discard(req_id)
        held = self.requests[req_id] = HeldBlocks(writer=self.pool.new_writer())
        hits = num_computed_tokens // self.block_size  # full blocks vLLM found in its prefix cache
        for j, block in enumerate(block_ids):
            tag = self._share(block) if j < hits else self._new_generation(block, held.writer)
            held.blocks.append(block)
            held.tags.append(tag)

    def _extend(self, req_id: str, block_ids) -> None:
        held = self.requests.get(req_id)
        if held is None:  # a request the guard never saw admitted: it is refused at the check
            return
        for block in block_ids:
            held.blocks.append(block)
            held.tags.append(self._new_generation(block, held.writer))

    def _start_transfer(self, req_id: str, block_ids) -> None:
        """A connector will write these blocks: a new generation, writable by the transfer."""
        held = self.receiving[req_id] = HeldBlocks(writer=self.pool.new_writer())
        for block in block_ids:
            held.blocks.append(block)
            held.tags.append(self._new_generation(block, held.writer))

    def transfers_done(self, req_ids) -> None:
        """The connector's finished_recving: those requests' blocks are written; the transfer's
        write right ends (called by the worker hook with each step's transfer results)."""
        for req_id in req_ids or ():
            held = self.receiving.pop(req_id, None)
            if held is None:
                continue
            for block, tag in zip(held.blocks, held.tags):
                if self.page_tag[block] == tag and self.page_writer[block] == held.writer:
                    self.pool.revoke_write((block, tag))
                    self.page_writer[block] = 0
            self.received.add(req_id)

    def observe(self, scheduler_output) -> None:
        """Applies one SchedulerOutput's deltas (called by the worker before it updates its
        own state from the same output)."""
        start = time.perf_counter()
        for req_id in scheduler_output.finished_req_ids:
            self._drop(req_id)
            self.receiving.pop(req_id, None)  # given up while waiting: the late bytes keep the
            self.received.discard(req_id)     # transfer's generation, which nobody holds
        transfers = getattr(getattr(scheduler_output, "kv_connector_metadata", None), "reqs_to_recv", None)
        for req_id, meta in (transfers or {}).items():
            blocks = meta.local_block_ids
            if blocks and isinstance(blocks[0], (list, tuple)):  # one list per KV cache group
                blocks = blocks[0]
            self._start_transfer(req_id, blocks)
        for req_id in getattr(scheduler_output, "preempted_req_ids", None) or ():
            self._drop(req_id)
        for new in scheduler_output.scheduled_new_reqs:
            self._admit(new.req_id, new.block_ids[0], new.num_computed_tokens)
        cached = scheduler_output.scheduled_cached_reqs
        resumed = getattr(cached, "resumed_req_ids", set()) or set()
        for i, req_id in enumerate(cached.req_ids):
            new_ids = cached.new_block_ids[i]
            if req_id in resumed:
                self._admit(req_id, new_ids[0] if new_ids else [], cached.num_computed_tokens[i])
            elif new_ids:
                self._extend(req_id, new_ids[0])
        self.host_seconds += time.perf_counter() - start

    # ---- the check, before the step's first layer ----------------------------------------

    def check(self, req_ids: List[str], *, num_reqs: int, seq_lens: np.ndarray, block_table: torch.Tensor,
              seq_lens_device: torch.Tensor, query_start_loc: torch.Tensor, slot_mapping: torch.Tensor,
              num_tokens: int, stream=None) -> torch.Tensor:
        """Launches the tag check for this step's rows; returns the slot_mapping the append
        is to use (a persistent device tensor: -1 for the tokens of aborted requests)."""
        start = time.perf_counter()
        if num_reqs > self.max_num_seqs:
            raise ValueError(f"slimserve vLLM guard: a step of {num_reqs} requests; the guard holds "
                             f"{self.max_num_seqs} (max_num_seqs)")
        if block_table.shape[1] != self.width:  # vLLM's table is wider than max_model_len needs
            self._resize(int(block_table.shape[1]))
        expected, writers = self._host_expected[:num_reqs], self._host_writers[:num_reqs]
        expected[:] = 0
        for r, req_id in enumerate(req_ids[:num_reqs]):
            held = self.requests.get(req_id)
            if held is None:  # unknown to the guard: tag 0 never matches, the request is refused
                writers[r] = 0
                continue
            used = min(-(-int(seq_lens[r]) // self.block_size), len(held.tags), self.width)
            expected[r, :used] = held.tags[:used]
            writers[r] = held.writer
        self.rows = list(req_ids[:num_reqs])
        middle = time.perf_counter()
        self.host_seconds += middle - start
        self.tags.sync(self.pool, stream)
        self._expected.upload(np.ascontiguousarray(expected), stream)
        self._writers.upload(writers, stream)
        view = _s._capi.BlockTableView(
            block_table.data_ptr(), self._expected.ptr.value, seq_lens_device.data_ptr(), num_reqs,
            self.width, self.block_size)
        if block_table.dtype != torch.int32 or seq_lens_device.dtype != torch.int32 or \
                query_start_loc.dtype != torch.int32 or not block_table.is_contiguous():
            raise TypeError("slimserve vLLM guard: block table, seq_lens and query_start_loc must be "
                            "contiguous int32 tensors")
        _s._check(_s._lib.slimserve_check_block_tags(
            ctypes.byref(view), self.tags._handle, self._writers.ptr, ctypes.c_void_p(query_start_loc.data_ptr()),
            ctypes.c_void_p(self.statuses.data_ptr()), None, _s._stream(stream)))
        slots = self._guarded_slots(slot_mapping[:num_tokens], query_start_loc[: num_reqs + 1], num_reqs)
        self.check_seconds += time.perf_counter() - middle
        self.steps += 1
        stats.count("guard_checks")
        return slots

    def _resize(self, width: int) -> None:
        """Expected-tag buffers for block tables `width` blocks wide (made once per width)."""
        self.width = width
        self._expected = _s.DeviceArray(np.zeros(self.max_num_seqs * width, np.uint32))
        self._host_expected = np.zeros((self.max_num_seqs, width), np.uint32)

    def _guarded_slots(self, slots: torch.Tensor, query_start_loc: torch.Tensor, num_reqs: int) -> torch.Tensor:
        """slot_mapping with -1 for the tokens of requests the check refused (device ops only:
        a token's request from query_start_loc, its verdict from the statuses)."""
        n = slots.shape[0]
        if self._slots.shape[0] < n:
            self._slots = torch.empty(max(n, 2 * self._slots.shape[0]), dtype=torch.int64, device=slots.device)
            self._positions = torch.arange(self._slots.shape[0], dtype=torch.int32, device=slots.device)
        out = self._slots[:n]
        token_request = torch.searchsorted(query_start_loc[1:], self._positions[:n], right=True)
        token_request.clamp_(max=max(num_reqs - 1, 0))
        ok = self.statuses[:, 0].index_select(0, token_request) == 0
        torch.where(ok, slots, torch.full_like(slots, -1), out=out)
        return out

    # ---- after the step ------------------------------------------------------------------

    def verdicts(self) -> Dict[str, str]:
        """Request id -> reason, for the requests the last check refused (reads the device
        verdicts: call after the step's outputs are on the host)."""
        n = len(self.rows)
        if n == 0:
            return {}
        host = self.statuses[:n].cpu().numpy()
        aborted = {}
        for r in np.nonzero(host[:, 0])[0]:
            state = int(host[r, 0])
            name = STATE_NAMES.get(state, str(state))
            aborted[self.rows[r]] = f"slimserve tag guard: {name} at block index {int(host[r, 1])}"
        if aborted:
            stats.count("guard_aborted", len(aborted))
            for reason in aborted.values():
                stats.count("guard_aborted:" + reason.split(": ")[1].split(" ")[0])
        return aborted

    def summary(self) -> dict:
        return {"steps": self.steps, "host_us_per_step": 1e6 * self.host_seconds / max(self.steps, 1),
                "check_us_per_step": 1e6 * self.check_seconds / max(self.steps, 1),
                "requests_held": len(self.requests), "transfers_pending": len(self.receiving)}


# The guard of the engine this process serves (the latest metadata builder's).
ACTIVE: Dict[str, Optional[BlockGuard]] = {"guard": None}
