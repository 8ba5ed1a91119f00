"""The tag guard's fault test inside vLLM (tests only): vLLM's block pool is patched so that it
hands one block to two requests, and the test checks that slimserve's guard aborts the stale
one while the others generate exactly their unpatched tokens.

`double_handout(llm, prompts, params)` arms the patch for one generate call on an engine
already made (no extra start-up): during it, the third block the pool hands out is replaced by
the first (the first request's block, which that request still holds; its reference count is
raised so vLLM's own bookkeeping stays consistent, and the displaced block goes back to the
free queue). In-process engines only (the pool lives in the engine core)."""
from __future__ import annotations

import time

from vllm.v1.core.block_pool import BlockPool

REPLACED_CALL = 3  # the call whose first block is replaced: the third request's allocation


def double_handout(llm, prompts, params) -> dict:
    original = BlockPool.get_new_blocks
    seen = {"calls": 0, "victim": None, "displaced": None}

    def get_new_blocks(self, num_blocks):
        blocks = original(self, num_blocks)
        seen["calls"] += 1
        if seen["calls"] == 1 and blocks:
            seen["victim"] = blocks[0]
        elif seen["calls"] == REPLACED_CALL and blocks and seen["victim"] is not None:
            displaced, victim = blocks[0], seen["victim"]
            victim.ref_cnt += 1  # now held by two requests
            blocks[0] = victim
            self.free_blocks([displaced])
            seen["displaced"] = displaced.block_id
        return blocks

    BlockPool.get_new_blocks = get_new_blocks
    try:
        start = time.time()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.time() - start
    finally:
        BlockPool.get_new_blocks = original
    victim = seen["victim"].block_id if seen["victim"] is not None else None
    return {"block": victim, "displaced": seen["displaced"], "calls": seen["calls"], "generate_s": elapsed,
            "requests": [{"token_ids": list(o.outputs[0].token_ids), "finish_reason": o.outputs[0].finish_reason,
                          "stop_reason": o.outputs[0].stop_reason} for o in outputs]}
