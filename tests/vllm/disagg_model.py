"""Prefill/decode disaggregation of a real model on slimserve's own API, without vLLM
(docs/disaggregation.md, "Tests"): SmolLM2-135M in llama_harness, three processes on one host
besides this one, which starts them, relays their NIXL metadata and checks their results.

  A, the prefill engine: the prompt through the model with its unquantized (BF16) weights, K/V
      written by append_kv into FP8 pages (descending, after two held ones), attention by
      PagedAttentionWrapper; its first token from the last logits; the pages offered through
      slimserve.nixl.PrefillSide.
  B, the decode engine: receives the pages through slimserve.nixl.DecodeSide (one NIXL READ,
      UCX over loopback, host memory), then decodes greedily with INT4 weights (quantize_int4 +
      gemm_w4a16) in the layers --int4-layers names, BF16 in the others.
  R, the single-process run: the same prefill and the same decode in one process, on pages that
      never move.

Checked: every byte B received equals A's source page's (K and V, every layer), and every slot
of B's cache outside the request still holds its poison; A's prefill (logits, page bytes) equals
R's; B's tokens and every decode step's logits equal R's, bit for bit (same bytes in, same code:
same bits out); both pools' free-page counts back where they started. Every wait is bounded.

    python disagg_model.py --model DIR [--decode-tokens 3] [--int4-layers 22-29 | 0-29 | none]
"""
import argparse
import multiprocessing
import os
import resource
import sys
import time

import numpy as np

# MKL (PyTorch's CPU BLAS here) may round differently with its buffers' alignment unless told not
# to, and the checks below compare separate processes bit for bit.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
HERE = os.path.dirname(os.path.abspath(__file__))
# 30 tokens: two pages, the second partly filled (the request's own transfer list); the third
# decode step needs a third page, which the decode engine adds after the transfer.
PROMPT = "France: Paris. Germany: Berlin. Spain: Madrid. Japan: Tokyo. Egypt: Cairo. Canada: Ottawa. Peru: Lima. Italy:"
CALIBRATION = "Calibration text: the quick brown fox jumps over the lazy dog, twice, then rests."
NUM_PAGES, PAGE = 16, 16
TRANSFER_ID = 26
POISON = {"prefill": 0xA5, "decode": 0x5A, "single": 0xA5}


def _setup():
    os.environ["UCX_NET_DEVICES"] = "lo"  # loopback only
    sys.path.insert(0, HERE)
    import torch
    torch.set_num_threads(1)  # one core per process, and the same reduction order in each


def _layers(spec: str, count: int):
    """'0-29' / '20-29' / '3,7' / 'none' -> layer indices."""
    if spec == "none":
        return []
    out = []
    for part in spec.split(","):
        a, _, b = part.partition("-")
        out += range(int(a), int(b or a) + 1)
    if any(i < 0 or i >= count for i in out):
        raise SystemExit(f"--int4-layers {spec}: the model has layers 0-{count - 1}")
    return out


def _prefill(model, kv, pool, prompt):
    """The request's pages (allocated after two held pages, in descending order, as a LIFO
    free list hands them out) and the prompt's logits."""
    from llama_harness import greedy
    held = pool.allocate(2)
    pages = pool.allocate(-(-len(prompt) // PAGE))[::-1]
    logits = model.forward(prompt, 0, kv, pages)
    return held, pages, logits, greedy(logits)


def _decode(model, kv, pool, pages, num_tokens, first, steps):
    """Greedy decode from token `first` at position num_tokens; a page is added when the
    request's last page is full. Returns the tokens after `first` and each step's logits."""
    from llama_harness import greedy
    tokens, logits = [first], []
    for step in range(steps):
        n = num_tokens + step
        if n % PAGE == 0 and n // PAGE == len(pages):
            pages.extend(pool.allocate(1))
        out = model.forward([tokens[-1]], n, kv, pages)
        logits.append(out.numpy())
        tokens.append(greedy(out))
    return tokens[1:], logits


def prefill_engine(conn, model_dir, scales, prompt):
    """Process A."""
    _setup()
    import slimserve as ss
    from llama_harness import KvPages, Model, Weights
    from slimserve.nixl import PrefillSide
    start = time.monotonic()
    weights = Weights(model_dir)
    model = Model(weights)
    pool = ss.PagePool(NUM_PAGES)
    kv = KvPages(weights, NUM_PAGES, *scales, page_size=PAGE, poison=POISON["prefill"])
    side = PrefillSide("prefill", pool, kv.transfer_cache)
    conn.send(side.metadata())
    side.connect(conn.recv())
    free = pool.available
    loaded = time.monotonic()
    held, pages, logits, first = _prefill(model, kv, pool, prompt)
    ids = [p for p, _ in pages]
    side.offer(TRANSFER_ID, pages, len(prompt), timeout_s=120)
    conn.send({"first": first, "logits": logits.numpy(), "ids": ids, "bytes": kv.request_bytes(ids, len(prompt)),
               "load_s": loaded - start, "prefill_s": time.monotonic() - loaded})
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and TRANSFER_ID in side.offers:  # until PUBLISHED releases the pages
        side.poll()
        time.sleep(0.001)
    pool.release(held)
    conn.send({"completed": list(side.completed), "free_before": free, "free_after": pool.available})
    side.close()
    pool.close()


def decode_engine(conn, model_dir, scales, int4_layers):
    """Process B."""
    _setup()
    import slimserve as ss
    from llama_harness import KvPages, Model, Weights
    from slimserve.nixl import DecodeSide
    start = time.monotonic()
    weights = Weights(model_dir)
    model = Model(weights, int4=int4_layers)
    pool = ss.PagePool(NUM_PAGES)
    kv = KvPages(weights, NUM_PAGES, *scales, page_size=PAGE, poison=POISON["decode"])
    side = DecodeSide("decode", pool, kv.transfer_cache)
    conn.send(side.metadata())
    peer = side.connect(conn.recv())
    free = pool.available
    loaded = time.monotonic()
    transfer_id, num_tokens, first, steps = conn.recv()
    t0 = time.monotonic()
    pages = side.receive(peer, transfer_id, num_tokens, timeout_s=60, writer=side.new_writer())
    received = time.monotonic() - t0
    ids = [p for p, _ in pages]
    got = kv.request_bytes(ids, num_tokens)
    # Nothing outside the request was written: the other pages and the last page's later slots.
    untouched = all((a[[p for p in range(NUM_PAGES) if p not in ids]] == POISON["decode"]).all() and
                    (a[ids[-1], :, (num_tokens - 1) % PAGE + 1:] == POISON["decode"]).all() for a in (kv.k, kv.v))
    t0 = time.monotonic()
    tokens, logits = _decode(model, kv, pool, pages, num_tokens, first, steps)
    decoded = time.monotonic() - t0
    pool.release(pages)
    conn.send({"ids": ids, "bytes": got, "untouched": bool(untouched), "tokens": tokens, "logits": logits,
               "free_before": free, "free_after": pool.available, "stats": side.last_stats,
               "load_s": loaded - start, "receive_s": received, "decode_s": decoded})
    side.close()
    pool.close()


def single_process(conn, model_dir, scales, prompt, int4_layers, steps):
    """Process R: prefill and decode in one process and one cache."""
    _setup()
    import slimserve as ss
    from llama_harness import KvPages, Model, Weights
    weights = Weights(model_dir)
    dense, quantized = Model(weights), Model(weights, int4=int4_layers)
    pool = ss.PagePool(NUM_PAGES)
    kv = KvPages(weights, NUM_PAGES, *scales, page_size=PAGE, poison=POISON["single"])
    t0 = time.monotonic()
    held, pages, logits, first = _prefill(dense, kv, pool, prompt)
    ids = [p for p, _ in pages]
    source = kv.request_bytes(ids, len(prompt))
    tokens, step_logits = _decode(quantized, kv, pool, pages, len(prompt), first, steps)
    conn.send({"first": first, "logits": logits.numpy(), "ids": ids, "bytes": source, "tokens": tokens,
               "step_logits": step_logits, "s": time.monotonic() - t0})
    pool.release(held + pages)
    pool.close()


def _recv(conn, process, what, deadline):
    """The next message from a child, or a failure as soon as the child has died or time is up."""
    while not conn.poll(0.2):
        if not process.is_alive():
            raise SystemExit(f"FAIL: the {process.name} process exited ({process.exitcode}) before its {what}")
        if time.monotonic() > deadline:
            raise SystemExit(f"FAIL: no {what} in time")
    return conn.recv()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--decode-tokens", type=int, default=3)
    parser.add_argument("--int4-layers", default="22-29")
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    start = time.monotonic()
    deadline = start + args.timeout
    _setup()
    from tokenizers import Tokenizer
    from llama_harness import Model, Weights, greedy
    tokenizer = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
    prompt = tokenizer.encode(PROMPT).ids
    weights = Weights(args.model)
    int4 = _layers(args.int4_layers, weights.layers)
    reference = Model(weights)
    scales = reference.calibrate_kv_scales(tokenizer.encode(CALIBRATION).ids)

    context = multiprocessing.get_context("spawn")
    pipes = {name: context.Pipe() for name in ("prefill", "decode", "single")}
    targets = {"prefill": (prefill_engine, (args.model, scales, prompt)),
               "decode": (decode_engine, (args.model, scales, int4)),
               "single": (single_process, (args.model, scales, prompt, int4, args.decode_tokens))}
    processes = {name: context.Process(target=fn, args=(pipes[name][1],) + extra, name=name, daemon=True)
                 for name, (fn, extra) in targets.items()}
    for p in processes.values():
        p.start()
    a, b, r = (pipes[name][0] for name in ("prefill", "decode", "single"))
    pa, pb, pr = (processes[name] for name in ("prefill", "decode", "single"))
    try:
        a_meta, b_meta = _recv(a, pa, "metadata", deadline), _recv(b, pb, "metadata", deadline)
        a.send(b_meta)
        b.send(a_meta)
        prefilled = _recv(a, pa, "prefill result", deadline)
        b.send((TRANSFER_ID, len(prompt), prefilled["first"], args.decode_tokens))
        # While the engines work: the same model in plain PyTorch, BF16 all through (for the report).
        torch_tokens = [prefilled["first"]]
        for _ in range(args.decode_tokens):
            torch_tokens.append(greedy(reference.torch_forward(prompt + torch_tokens)[0]))
        decoded = _recv(b, pb, "decode result", deadline)
        released = _recv(a, pa, "release of its pages", deadline)
        single = _recv(r, pr, "result", deadline)
    finally:
        for p in processes.values():
            p.join(max(1.0, min(10.0, deadline - time.monotonic())))
            if p.is_alive():
                p.kill()

    failures = []
    def check(ok, what):
        if not ok:
            failures.append(what)
    moved = sum(len(x) for x in prefilled["bytes"])
    check(decoded["bytes"] == prefilled["bytes"], "a received byte differs from the source page's")
    check(decoded["untouched"], "the decode cache changed outside the request's slots")
    check(prefilled["first"] == single["first"] and np.array_equal(prefilled["logits"], single["logits"]),
          "the prefill engine's logits differ from the single-process run's")
    check(prefilled["bytes"] == single["bytes"], "the prefill engine's pages differ from the single-process run's")
    check(decoded["tokens"] == single["tokens"],
          f"decode tokens {decoded['tokens']} != single-process {single['tokens']}")
    worst = max((float(np.abs(x - y).max()) for x, y in zip(decoded["logits"], single["step_logits"])), default=0.0)
    check(len(decoded["logits"]) == len(single["step_logits"]) == args.decode_tokens and worst == 0.0,
          f"a decode step's logits differ from the single-process run's by up to {worst}")
    check(released["completed"] == [TRANSFER_ID], f"the prefill side completed {released['completed']}")
    for side, result in (("prefill", released), ("decode", decoded)):
        check(result["free_after"] == result["free_before"],
              f"the {side} pool has {result['free_after']} free pages, {result['free_before']} before")
    text = tokenizer.decode([prefilled["first"]] + decoded["tokens"])
    stats = decoded["stats"]
    print(f"disagg_model: prompt {len(prompt)} tokens in pages {prefilled['ids']} -> decode pages {decoded['ids']}; "
          f"{moved} bytes in one READ of {stats.get('descriptors')} descriptors ({decoded['receive_s'] * 1e3:.0f} ms)")
    print(f"disagg_model: prefill (BF16 weights) {prefilled['prefill_s']:.1f} s; decode ({len(int4)} INT4 layers) "
          f"{args.decode_tokens} tokens in {decoded['decode_s']:.1f} s; single-process run {single['s']:.1f} s")
    print(f"disagg_model: tokens {[prefilled['first']] + decoded['tokens']} {text!r}; single-process "
          f"{[single['first']] + single['tokens']}; PyTorch BF16 without the FP8 cache and INT4 {torch_tokens}")
    cpu = sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
              for f in ("ru_utime", "ru_stime"))
    print(f"disagg_model: {'FAIL: ' + '; '.join(failures) if failures else 'ok'} in {time.monotonic() - start:.1f} s "
          f"({cpu:.0f} s of CPU, the four processes together)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
