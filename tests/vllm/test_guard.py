"""The tag guard's bookkeeping and check without vLLM running: scheduler outputs shaped as
vLLM's (new requests with prefix hits, running requests' new blocks, resumed and finished
requests, blocks a KV connector fills) drive slimserve.vllm.guard.BlockGuard, whose device check
over a vLLM-shaped block table must refuse exactly the stale request of each case (and mask its
tokens' slots).
Run by run.sh in build/vllm-env:  python test_guard.py"""
import os
import sys
from types import SimpleNamespace as NS

import numpy as np
import torch

from slimserve.vllm.guard import BlockGuard

BLOCK = 32


def output(new=(), cached=(), finished=(), resumed=(), receive=None):
    """A SchedulerOutput with the fields the guard reads: new = [(id, blocks, computed)],
    cached = [(id, new blocks or None, computed)], receive = {id: blocks} (the KV connector's
    reqs_to_recv, one block list per KV cache group as vLLM's NixlConnector sends it)."""
    metadata = NS(reqs_to_recv={r: NS(local_block_ids=(list(b),)) for r, b in (receive or {}).items()})
    return NS(finished_req_ids=set(finished), preempted_req_ids=None, kv_connector_metadata=metadata,
              scheduled_new_reqs=[NS(req_id=r, block_ids=(list(b),), num_computed_tokens=c) for r, b, c in new],
              scheduled_cached_reqs=NS(req_ids=[r for r, _, _ in cached], resumed_req_ids=set(resumed),
                                       new_block_ids=[None if b is None else (list(b),) for _, b, _ in cached],
                                       num_computed_tokens=[c for _, _, c in cached]))


def step(g, rows, width=4):
    """One check over rows [(id, blocks, seq_len, new tokens)]; returns {id: state name}."""
    table = torch.zeros((len(rows), width), dtype=torch.int32)
    for r, (_, blocks, _, _) in enumerate(rows):
        table[r, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
    lens = np.array([n for _, _, n, _ in rows], np.int32)
    qo = torch.tensor(np.concatenate([[0], np.cumsum([q for *_, q in rows])]), dtype=torch.int32)
    slots = []
    for _, blocks, n, q in rows:
        slots += [blocks[p // BLOCK] * BLOCK + p % BLOCK for p in range(n - q, n)]
    slot_tensor = torch.tensor(slots, dtype=torch.int64)
    g.statuses.fill_(-7)  # poison: every verdict must be written
    guarded = g.check([r for r, *_ in rows], num_reqs=len(rows), seq_lens=lens, block_table=table,
                      seq_lens_device=torch.from_numpy(lens), query_start_loc=qo, slot_mapping=slot_tensor,
                      num_tokens=len(slots))
    verdicts = g.verdicts()
    states = {r: verdicts.get(r, "ok").split(": ")[-1].split(" ")[0] for r, *_ in rows}
    # Tokens of refused requests write nothing; the others' slots are vLLM's.
    for r, (req, _, _, q) in enumerate(rows):
        a, b = int(qo[r]), int(qo[r + 1])
        want = slot_tensor[a:b] if states[req] == "ok" else torch.full((b - a,), -1, dtype=torch.int64)
        assert torch.equal(guarded[a:b], want), f"{req}: slots {guarded[a:b].tolist()}, want {want.tolist()}"
    return states


def expect(got, want, what):
    assert got == want, f"{what}: verdicts {got}, expected {want}"
    print(f"guard: {what}: {got}")


def main():
    rng = np.random.default_rng(int(os.environ.get("SLIMSERVE_TEST_SEED", np.random.SeedSequence().entropy % 2**32)))
    ids = [int(b) for b in rng.permutation(np.arange(1, 64))]  # shuffled blocks, 0 never used
    a1, a2, b1, c1, d1, e1 = ids[:6]
    g = BlockGuard(num_blocks=64, block_size=BLOCK, max_num_seqs=8, max_blocks_per_req=4)
    # Step 1: A (a 40-token prompt over two fresh blocks) and B (a 5-token prompt).
    g.observe(output(new=[("A", [a1, a2], 0), ("B", [b1], 0)]))
    expect(step(g, [("A", [a1, a2], 40, 40), ("B", [b1], 5, 5)]), {"A": "ok", "B": "ok"}, "fresh blocks")
    # Step 2: C hits A's full first block in the prefix cache and computes 3 tokens in a fresh block.
    g.observe(output(new=[("C", [a1, c1], BLOCK)], cached=[("A", None, 40), ("B", None, 5)]))
    expect(step(g, [("A", [a1, a2], 41, 1), ("B", [b1], 6, 1), ("C", [a1, c1], BLOCK + 3, 3)]),
           {"A": "ok", "B": "ok", "C": "ok"}, "a prefix hit shares a block read-only")
    # Step 3: the scheduler hands B's block to a new request D as a fresh block (the fault):
    # B still holds it under the old tag and is refused; D owns it now.
    g.observe(output(new=[("D", [b1], 0)], cached=[("A", None, 41), ("B", None, 6), ("C", None, BLOCK + 3)]))
    expect(step(g, [("A", [a1, a2], 42, 1), ("B", [b1], 7, 1), ("C", [a1, c1], BLOCK + 4, 1), ("D", [b1], 4, 4)]),
           {"A": "ok", "B": "stale_tag", "C": "ok", "D": "ok"}, "one block handed to two requests")
    # Step 4: B finished (aborted); E hits A's second block while A still appends into it: A's
    # write into a block it no longer owns alone is refused, E reads it.
    g.observe(output(finished=["B"], new=[("E", [a1, a2, e1], 2 * BLOCK)],
                     cached=[("A", None, 42), ("C", None, BLOCK + 4), ("D", None, 4)]))
    expect(step(g, [("A", [a1, a2], 43, 1), ("C", [a1, c1], BLOCK + 5, 1), ("D", [b1], 5, 1),
                    ("E", [a1, a2, e1], 2 * BLOCK + 1, 1)]),
           {"A": "write_denied", "C": "ok", "D": "ok", "E": "ok"}, "a write into a shared block")
    # Step 5: a request the guard never saw admitted, and a resumed one with a new list.
    g.observe(output(finished=["A"], cached=[("C", None, BLOCK + 5), ("D", [d1], BLOCK), ("E", None, 2 * BLOCK + 1)],
                     resumed=[]))
    expect(step(g, [("C", [a1, c1], BLOCK + 6, 1), ("D", [b1, d1], BLOCK + 1, 1), ("X", [e1], 3, 1)]),
           {"C": "ok", "D": "ok", "X": "stale_tag"}, "an unknown request, a request's new block")
    g.observe(output(cached=[("C", [], 0)], resumed=["C"]))  # preempted, resumed, recomputed whole
    fresh = ids[10]
    g.observe(output(cached=[("C", [fresh], 0)], resumed=["C"]))
    expect(step(g, [("C", [fresh], 6, 6)]), {"C": "ok"}, "a resumed request's new blocks")
    g.observe(output(cached=[("C", None, 6)]))
    expect(step(g, [("C", [fresh], 7, 1)], width=6), {"C": "ok"}, "a wider block table")
    # Disaggregated prefill (blocks a KV connector fills). F holds a fresh block; the scheduler
    # then gives it, with another, to R's transfer: F is stale from that step on.
    f1, r1, r2, r3 = ids[20:24]
    g.observe(output(new=[("F", [f1], 0)]))
    expect(step(g, [("F", [f1], 3, 3)]), {"F": "ok"}, "a fresh block before a transfer")
    g.observe(output(cached=[("F", None, 3)], receive={"R": [f1, r1]}))
    expect(step(g, [("F", [f1], 4, 1)]), {"F": "stale_tag"}, "a block handed to a transfer")
    # R scheduled before the connector reports its transfer done: never admitted, refused.
    g.observe(output(finished=["F"], new=[("R", [f1, r1], BLOCK + 9)]))
    expect(step(g, [("R", [f1, r1], BLOCK + 10, 1)]), {"R": "stale_tag"}, "a transfer not reported done")
    assert g.summary()["transfers_pending"] == 1
    # Reported done (the worker hook passes finished_recving): R holds the received blocks, its
    # full first block read-only, the second written by its own next token.
    g.transfers_done(["R", "unknown"])
    g.observe(output(new=[("R", [f1, r1], BLOCK + 9)]))
    expect(step(g, [("R", [f1, r1], BLOCK + 10, 1)]), {"R": "ok"}, "a transfer reported done")
    g.observe(output(cached=[("R", None, BLOCK + 10)], new=[("Q", [f1, r3], BLOCK)]))
    expect(step(g, [("R", [f1, r1], BLOCK + 11, 1), ("Q", [f1, r3], BLOCK + 1, 1)]), {"R": "ok", "Q": "ok"},
           "a received full block shared by a prefix hit")
    # A request that gives up while its transfer is in flight: the late bytes land in blocks
    # that nobody holds under the transfer's generation; the next holder gets a new one.
    g.observe(output(receive={"T": [r2]}))
    g.observe(output(finished=["T"], new=[("U", [r2], 0)]))
    g.transfers_done(["T"])  # late: ignored
    expect(step(g, [("U", [r2], 5, 5)]), {"U": "ok"}, "a transfer given up")
    assert g.summary()["transfers_pending"] == 0
    print(f"guard: host bookkeeping {g.summary()['host_us_per_step']:.0f} us per step, check "
          f"{g.summary()['check_us_per_step']:.0f} us per step (tiny batches)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
