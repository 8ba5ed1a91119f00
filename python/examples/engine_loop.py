"""The engine loop in Python, as a PyTorch/NumPy engine drives slimserve:

  admit A (no prefix hit) -> append its prompt -> decode -> append one token -> finish (index
  its full pages, release) -> admit B with A's prompt (prefix hit on 2 pages, A's freed last
  page reused under a new tag) -> append the rest -> decode B together with a "zombie" that
  still holds A's old handles: the tag check aborts the zombie (its rows come back NaN) and B's
  output equals A's, bit for bit.

Host arrays here (NumPy float16); the CPU-emulated library runs the kernels. Run it with
`python engine_loop.py`; the test suite calls main().
"""
from __future__ import annotations

import os
import sys

import numpy as np

import slimserve as ss

PAGE_SIZE, NUM_PAGES, KV_HEADS, QO_HEADS, HEAD_DIM, PROMPT = 16, 64, 2, 4, 64, 40


class Engine:
    def __init__(self, seed: int):
        self.rng_seed = seed
        self.pool = ss.PagePool(NUM_PAGES)
        self.cache = ss.PrefixCache(self.pool, PAGE_SIZE, hash_seed=0x5EED)
        self.tags = ss.DeviceTags(NUM_PAGES)
        self.tables = ss.PageTable(4, 64, PAGE_SIZE, NUM_PAGES)
        self.statuses = ss.RequestStatuses(4)
        shape = (NUM_PAGES, PAGE_SIZE, KV_HEADS, HEAD_DIM)
        self.k_pages = np.full(shape, np.nan, np.float16)
        self.v_pages = np.full(shape, np.nan, np.float16)
        self.kv = ss.PagedKVCache(self.k_pages, self.v_pages, layout="NHD")
        self.salt = 42

    # A stand-in model: K, V and queries as a pure function of (token, position).
    def model(self, token: int, position: int, heads: int, which: int) -> np.ndarray:
        rng = np.random.default_rng([self.rng_seed, token, position, which])
        return rng.uniform(-1, 1, (heads, HEAD_DIM)).astype(np.float16)

    def admit(self, seq: dict) -> int:
        hits = self.cache.match(seq["tokens"][:-1], salt=self.salt)
        needed = -(-len(seq["tokens"]) // PAGE_SIZE)
        seq["pages"] = hits + self.pool.allocate(needed - len(hits))
        seq["stored"] = len(hits) * PAGE_SIZE
        return len(hits)

    def schedule(self, batch):
        table = self.tables.build([(s["pages"], len(s["tokens"])) for s in batch])
        self.tags.sync(self.pool)
        ss.check_page_tags(table, self.tags, self.statuses)
        return table

    def append_pending(self, seq: dict) -> None:
        positions = np.arange(seq["stored"], len(seq["tokens"]), dtype=np.int32)
        k = np.stack([self.model(seq["tokens"][p], p, KV_HEADS, 0) for p in positions])
        v = np.stack([self.model(seq["tokens"][p], p, KV_HEADS, 1) for p in positions])
        table = self.schedule([seq])
        ss.append_kv(self.kv, table, k, v, token_request=np.zeros_like(positions),
                     token_position=positions, statuses=self.statuses)
        seq["stored"] = len(seq["tokens"])

    def decode(self, batch):
        q = np.stack([self.model(s["tokens"][-1], len(s["tokens"]) - 1, QO_HEADS, 2) for s in batch])
        table = self.schedule(batch)
        wrapper = ss.DecodeWrapper()
        wrapper.plan(table.indptr, table.indices, table.last_page_len, QO_HEADS, KV_HEADS,
                     HEAD_DIM, PAGE_SIZE, "float16")
        out = wrapper.run(q, self.kv, statuses=self.statuses, table=table)
        return out, self.statuses.to_host(len(batch))

    def finish(self, seq: dict) -> None:
        self.cache.insert(seq["tokens"], seq["pages"], salt=self.salt)
        self.pool.release(seq["pages"])

    def reference(self, seq: dict) -> np.ndarray:
        """FP64 attention over the FP16 values the cache holds."""
        n = len(seq["tokens"])
        k = np.stack([self.model(seq["tokens"][t], t, KV_HEADS, 0) for t in range(n)]).astype(np.float64)
        v = np.stack([self.model(seq["tokens"][t], t, KV_HEADS, 1) for t in range(n)]).astype(np.float64)
        q = self.model(seq["tokens"][-1], n - 1, QO_HEADS, 2).astype(np.float64)
        group = QO_HEADS // KV_HEADS
        out = np.empty((QO_HEADS, HEAD_DIM))
        for h in range(QO_HEADS):
            scores = k[:, h // group, :] @ q[h] / np.sqrt(HEAD_DIM)
            p = np.exp(scores - scores.max())
            out[h] = (p / p.sum()) @ v[:, h // group, :]
        return out


def main(seed=None) -> None:
    seed = int(os.environ.get("SLIMSERVE_TEST_SEED", np.random.SeedSequence().entropy % 2**32)) if seed is None else seed
    print(f"engine_loop (Python, {'CPU emulator' if ss.EMULATED else 'GPU'}): seed {seed}")
    e = Engine(seed)

    a = {"tokens": [1000 + 7 * i for i in range(PROMPT)]}
    assert e.admit(a) == 0
    e.append_pending(a)
    o_a, verdicts = e.decode([a])
    assert verdicts == [("ok", -1)], verdicts
    np.testing.assert_allclose(o_a[0].astype(np.float64), e.reference(a), rtol=1e-2, atol=2e-3)

    page, copy_from, needs_copy = e.pool.prepare_append(a["pages"][-1])
    assert not needs_copy and page == a["pages"][-1]
    a["tokens"].append(5)
    e.append_pending(a)

    zombie = {"tokens": list(a["tokens"]), "pages": list(a["pages"])}  # a stale copy: an engine bug
    e.finish(a)

    b = {"tokens": a["tokens"][:PROMPT]}
    assert e.admit(b) == 2
    assert b["pages"][:2] == a["pages"][:2]
    assert b["pages"][2][0] == a["pages"][2][0] and b["pages"][2][1] != a["pages"][2][1]
    assert not e.pool.is_live(zombie["pages"][2])
    e.append_pending(b)

    o_b, verdicts = e.decode([b, zombie])
    assert verdicts[0] == ("ok", -1) and verdicts[1] == ("stale_tag", 2), verdicts
    assert np.array_equal(o_b[0].view(np.uint16), o_a[0].view(np.uint16))  # bit for bit
    assert np.isnan(o_b[1]).all()
    e.finish(b)
    print("engine_loop: admit, prefix hit, append, decode, finish, reuse and the stale page: ok")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else None)
