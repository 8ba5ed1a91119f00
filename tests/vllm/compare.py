"""Checks the plugin runs (JSON from generate.py) against stock vLLM's, prints what it found.

    python compare.py DIR      (DIR holds generate.py's stock_auto.json, slimserve_auto.json,
                                slimserve_fp8_e4m3.json, slimserve_host_fp8_e4m3.json,
                                slimserve_auto_mp.json and
                                stock_fp8_e4m3.json or, where stock vLLM's CPU FP8 cannot
                                run, reference_fp8_e4m3.json)

1. BF16 KV: slimserve's greedy tokens equal stock vLLM's; a request may diverge only at a step
   where stock's top two logprobs are within TIE_BOUND (a near-tie that rounding decides:
   the two backends sum the same BF16 products in different orders), and is compared up to
   that step.
2. FP8 e4m3 KV: on the same token sequences (stock BF16's prompts + continuations, teacher-
   forced), the KL divergence of slimserve-FP8 from stock-BF16 is within FP8_KLD_FACTOR of
   stock-FP8's own (mean and p99), plus a floor. Stock vLLM's CPU FP8 needs AVX-512 or AMX;
   elsewhere the FP8 reference is reference_backend.py (vLLM's FP8 convention in PyTorch).
3. slimserve really ran: forward and cache-update calls counted in the worker, a multiple of
   the layer count, every append planned by the builder.
4. Prefix caching: a prompt whose first block is cached from the previous one (num_cached_tokens
   > 0) gives, through slimserve, the tokens of the same prompt computed whole (near-tie rule).
5. Multiprocess mode (engine core and worker in their own processes, the plugin loaded by its
   entry point) gives the in-process tokens (its first 8), by the near-tie rule of 1 (its
   engine core batches the requests as they arrive, so its sums may be ordered differently).
6. The tag guard: every run checked its steps and aborted nothing; the fault test (one block
   handed to two requests by a patched block pool, on the in-process BF16 engine) aborted the
   stale request alone, with finish_reason "error", and the others kept their tokens.
7. The host attention mode (SLIMSERVE_ATTENTION=host) with FP8 e4m3 KV: the FP8 effect
   measured through it within 25 % of the kernel's, its KL from the kernel run at most that
   effect, every forward call on the host (check_host_mode).
KL over the reference's top-20 tokens plus one bucket for the rest of the vocabulary (a lower
bound of the full-vocabulary KL, close to it when the top 20 hold most of the mass)."""
import json
import math
import os
import sys

# Nats between stock's top-1 and top-2 logprob: two BF16 steps of a logit below 32 (vLLM
# returns BF16 logits, so the logprobs of one step move in multiples of 2^-3 there).
TIE_BOUND = 0.25
FP8_KLD_FACTOR = 2.0
FP8_KLD_FLOOR = 2e-3
NUM_LAYERS = 30
# The host attention mode against the kernel, with FP8 e4m3 KV (check_host_mode): the FP8
# effect measured through each (KL from stock BF16) may differ by this share of the kernel's;
# and the two modes' KL from each other may be at most this share of that effect (mean, p99).
# Why the second is not far smaller: an FP8 cache turns any rounding-level difference upstream
# (here the attention's roundings; the linear layers' summation order does the same) into whole
# FP8 steps of the codes later layers store (docs/accuracy.md, *Host mode against the kernel*).
HOST_EFFECT_FRACTION = 0.25
HOST_KLD_FRACTION = 1.0


def load(folder, name):
    return json.load(open(os.path.join(folder, name)))


def top2_gap(step: dict) -> float:
    values = sorted(step.values(), reverse=True)
    return values[0] - values[1] if len(values) > 1 else math.inf


def kld(ref: dict, cand: dict) -> float:
    floor = min(cand.values())
    p = {t: math.exp(v) for t, v in ref.items()}
    q = {t: math.exp(cand.get(t, floor)) for t in ref}
    p_rest, q_rest = max(1 - sum(p.values()), 1e-12), max(1 - sum(q.values()), 1e-12)
    return sum(pi * (math.log(pi) - math.log(q[t])) for t, pi in p.items() if pi > 0) + \
        p_rest * (math.log(p_rest) - math.log(q_rest))


def forced_klds(ref_run, cand_run):
    values = []
    for ref_seq, cand_seq in zip(ref_run["forced"], cand_run["forced"]):
        for r, c in zip(ref_seq, cand_seq):
            if r is not None and c is not None:
                values.append(kld(r, c))
    return values


def p99(values):
    s = sorted(values)
    return s[min(len(s) - 1, int(math.ceil(0.99 * len(s))) - 1)]


def check_fault(slim: dict) -> list:
    """6. The tag guard's fault test: a block handed to two requests aborts the stale one (its
    output ends with finish_reason "error", no token), and the others' tokens equal the
    unpatched run's."""
    fault = slim.get("fault")
    if fault is None:
        return ["slimserve_auto.json holds no fault test"]
    failures = []
    stale = 0  # the first request's block was handed to the third request as well
    reqs = fault["requests"]
    print(f"fault test: block {fault['block']} handed to requests 0 and 2 ({fault['calls']} allocations); "
          f"request 0: finish_reason {reqs[stale]['finish_reason']!r}, {len(reqs[stale]['token_ids'])} tokens; "
          f"guard verdicts {dict((k, v) for k, v in fault['stats'].items() if k.startswith('guard_abort'))}")
    if reqs[stale]["finish_reason"] != "error" or reqs[stale]["token_ids"]:
        failures.append(f"fault test: the stale request ended {reqs[stale]['finish_reason']!r} with "
                        f"{len(reqs[stale]['token_ids'])} tokens (want 'error', none)")
    if fault["stats"].get("guard_aborted:stale_tag", 0) != 1 or fault["stats"].get("guard_aborted", 0) != 1:
        failures.append(f"fault test: guard verdicts {fault['stats']} (want exactly one stale_tag)")
    same = 0
    for i, (a, b) in enumerate(zip(slim["requests"], reqs)):
        if i == stale:
            continue
        n = len(b["token_ids"])
        if b["finish_reason"] == "length" and n and a["token_ids"][:n] == b["token_ids"]:
            same += 1
        else:
            failures.append(f"fault test: request {i} gave {b['token_ids']} ({b['finish_reason']}), the "
                            f"unpatched run {a['token_ids'][:n]}")
    print(f"fault test: {same}/{len(reqs) - 1} other requests' {len(reqs[1]['token_ids'])} tokens equal the "
          "unpatched run's")
    return failures


def report_guard_cost(slim: dict) -> list:
    """The guard's cost per step, from the greedy run (reported, not checked: timing)."""
    g = slim.get("guard", [{}])[0]
    if not g:
        return ["slimserve_auto.json: no guard summary from the worker"]
    step_us = 1e6 * slim["generate_s"] / max(slim.get("steps", 1), 1)
    print(f"tag guard cost over {g['steps']} checked steps: host bookkeeping {g['host_us_per_step']:.0f} us, "
          f"device tags sync + uploads + check + slot masking {g['check_us_per_step']:.0f} us per step; "
          f"a greedy step takes {step_us / 1000:.0f} ms "
          f"({100 * (g['host_us_per_step'] + g['check_us_per_step']) / step_us:.2f}% of it)")
    return []


def check_host_mode(folder: str, stock: dict, slim8: dict, fp8_effect: list) -> list:
    """7. The host attention mode (SLIMSERVE_ATTENTION=host, the accuracy benchmark's): the same
    FP8 pages read by torch instead of the kernel. What the benchmark uses it for is measuring
    a format's effect, so: on the forced sequences, the FP8 effect measured through it (KL of
    host-mode FP8 from stock BF16) is within HOST_EFFECT_FRACTION of the effect measured through
    the kernel (mean), and its distributions' KL from the kernel run's is at most
    HOST_KLD_FRACTION of that effect (mean and p99); it really ran on the host."""
    host = load(folder, "slimserve_host_fp8_e4m3.json")
    between = forced_klds(slim8, host)
    host_effect = forced_klds(stock, host)
    mean = lambda v: sum(v) / len(v)
    same = sum(a["token_ids"] == b["token_ids"] for a, b in zip(slim8["requests"], host["requests"]))
    top = [max(r, key=r.get) == max(c, key=c.get) for rs, cs in zip(slim8["forced"], host["forced"])
           for r, c in zip(rs, cs) if r is not None and c is not None]
    print(f"host attention mode, FP8 e4m3: KL from the kernel run over {len(between)} positions mean "
          f"{mean(between):.2e} p99 {p99(between):.2e} (the FP8 effect: mean {mean(fp8_effect):.2e} p99 "
          f"{p99(fp8_effect):.2e}); same top token {sum(top)}/{len(top)}; greedy {same}/{len(host['requests'])} "
          "requests token-identical to the kernel run's")
    print(f"host attention mode, FP8 e4m3: KL from stock BF16 mean {mean(host_effect):.2e} p99 {p99(host_effect):.2e} "
          f"(through the kernel: mean {mean(fp8_effect):.2e} p99 {p99(fp8_effect):.2e})")
    failures = []
    if abs(mean(host_effect) - mean(fp8_effect)) > HOST_EFFECT_FRACTION * mean(fp8_effect):
        failures.append(f"host mode: the FP8 effect {mean(host_effect):.2e} differs from the kernel's "
                        f"{mean(fp8_effect):.2e} by more than {HOST_EFFECT_FRACTION:.0%}")
    if mean(between) > HOST_KLD_FRACTION * mean(fp8_effect):
        failures.append(f"host mode: mean KL from the kernel {mean(between):.2e} > {HOST_KLD_FRACTION} x "
                        f"the FP8 effect {mean(fp8_effect):.2e}")
    if p99(between) > HOST_KLD_FRACTION * p99(fp8_effect):
        failures.append(f"host mode: p99 KL from the kernel {p99(between):.2e} > {HOST_KLD_FRACTION} x "
                        f"the FP8 effect's {p99(fp8_effect):.2e}")
    counts = host["stats"][0]
    if counts.get("forward_host", 0) != counts.get("forward", 0) or not counts.get("forward"):
        failures.append(f"host mode: {counts.get('forward_host', 0)} of {counts.get('forward', 0)} forward calls on the host")
    if slim8["stats"][0].get("forward_host", 0):
        failures.append("kernel mode ran forward calls on the host")
    return failures


def main(folder: str) -> int:
    failures = []
    stock, slim = load(folder, "stock_auto.json"), load(folder, "slimserve_auto.json")
    matched = compared = 0
    for i, (a, b) in enumerate(zip(stock["requests"], slim["requests"])):
        ta, tb = a["token_ids"], b["token_ids"]
        first = next((j for j, (x, y) in enumerate(zip(ta, tb)) if x != y), None)
        if first is None:
            matched += 1
            compared += len(ta)
            continue
        gap = top2_gap(a["top_logprobs"][first])
        compared += first
        print(f"  request {i}: diverges at token {first} (stock {ta[first]}, slimserve {tb[first]}); "
              f"stock's top-2 gap there {gap:.4f} nats (bound {TIE_BOUND})")
        if gap > TIE_BOUND:
            failures.append(f"request {i} diverges at token {first} with a top-2 gap of {gap:.4f} > {TIE_BOUND}")
    print(f"BF16 KV greedy: {matched}/{len(stock['requests'])} requests token-identical over "
          f"{len(stock['requests'][0]['token_ids'])} tokens; {compared} tokens compared")

    def first_difference(a, b):
        return next((j for j, (x, y) in enumerate(zip(a["token_ids"], b["token_ids"])) if x != y), None)

    for name, run in (("stock", stock), ("slimserve", slim)):
        fresh, hit = run["prefix"]["fresh"], run["prefix"]["hit"]
        first = first_difference(fresh, hit)
        gap = top2_gap(fresh["top_logprobs"][first]) if first is not None else None
        print(f"prefix hit ({name}): {hit['num_cached_tokens']} of the prompt's tokens cached; the 8 tokens "
              + ("equal the uncached run's" if first is None else f"part from the uncached run's at {first}, gap {gap:.4f}"))
        if hit["num_cached_tokens"] == 0 or fresh["num_cached_tokens"] != 0:
            failures.append(f"{name}: the prefix prompt was not served from cached blocks")
        if name == "slimserve" and first is not None and gap > TIE_BOUND:
            failures.append(f"slimserve's prefix hit changes token {first} (top-2 gap {gap:.4f})")
    # Reported, not checked: on this 231-token prompt the two backends' greedy tokens part at a
    # near-tie; correct BF16 backends differ by a few logit ulps there (docs/vllm.md, measured by
    # logprob_floor.py).
    first = first_difference(stock["prefix"]["fresh"], slim["prefix"]["fresh"])
    print("long prompt, stock vs slimserve: " + ("same 8 tokens" if first is None else f"part at token {first}"))
    fp8_name = "stock_fp8_e4m3.json" if os.path.exists(os.path.join(folder, "stock_fp8_e4m3.json")) \
        else "reference_fp8_e4m3.json"
    stock8, slim8 = load(folder, fp8_name), load(folder, "slimserve_fp8_e4m3.json")
    print(f"FP8 reference: {stock8['backend']}")
    base = forced_klds(stock, stock8)
    ours = forced_klds(stock, slim8)
    between = forced_klds(stock8, slim8)
    mean = lambda v: sum(v) / len(v)
    print(f"FP8 e4m3 KV, KL from stock BF16 over {len(ours)} positions: {stock8['backend']} FP8 mean {mean(base):.2e} "
          f"p99 {p99(base):.2e}; slimserve FP8 mean {mean(ours):.2e} p99 {p99(ours):.2e}; "
          f"slimserve FP8 from {stock8['backend']} FP8 mean {mean(between):.2e} p99 {p99(between):.2e}")
    if mean(ours) > FP8_KLD_FACTOR * mean(base) + FP8_KLD_FLOOR:
        failures.append(f"FP8 mean KL {mean(ours):.2e} > {FP8_KLD_FACTOR} x {mean(base):.2e} + {FP8_KLD_FLOOR}")
    if p99(ours) > FP8_KLD_FACTOR * p99(base) + FP8_KLD_FLOOR:
        failures.append(f"FP8 p99 KL {p99(ours):.2e} > {FP8_KLD_FACTOR} x {p99(base):.2e} + {FP8_KLD_FLOOR}")
    same8 = sum(a["token_ids"] == b["token_ids"] for a, b in zip(stock8["requests"], slim8["requests"]))
    print(f"FP8 e4m3 KV greedy: {same8}/{len(stock8['requests'])} requests token-identical to {stock8['backend']} FP8")

    failures += check_host_mode(folder, stock, slim8, ours)

    for name in ("slimserve_auto.json", "slimserve_fp8_e4m3.json", "slimserve_auto_mp.json", "slimserve_host_fp8_e4m3.json"):
        run = load(folder, name)
        for worker, counts in enumerate(run["stats"]):
            forward, update = counts.get("forward", 0), counts.get("kv_update", 0)
            print(f"{name} worker {worker}: {forward} forward calls, {update} cache updates, "
                  f"{counts.get('build', 0)} plans, {counts.get('append_unplanned', 0)} unplanned appends")
            steps = len(run["requests"][0]["token_ids"])
            if forward < NUM_LAYERS * steps or forward % NUM_LAYERS or update != forward:
                failures.append(f"{name}: {forward} forward / {update} update calls (want a multiple of "
                                f"{NUM_LAYERS}, at least {NUM_LAYERS * steps}, equal)")
            if counts.get("append_unplanned", 0):
                failures.append(f"{name}: {counts['append_unplanned']} appends not planned by the builder")

    for name in ("slimserve_auto.json", "slimserve_fp8_e4m3.json", "slimserve_auto_mp.json"):
        counts = load(folder, name)["stats"][0]
        if not counts.get("guard_checks"):
            failures.append(f"{name}: the tag guard checked no step")
        if counts.get("guard_aborted", 0) or counts.get("guard_unchecked_steps", 0) > 1:
            failures.append(f"{name}: the guard aborted {counts.get('guard_aborted', 0)} requests / left "
                            f"{counts.get('guard_unchecked_steps', 0)} steps unchecked in a run without faults")
    failures += check_fault(slim)
    failures += report_guard_cost(slim)

    mp = load(folder, "slimserve_auto_mp.json")
    same = 0
    for i, (a, b) in enumerate(zip(slim["requests"], mp["requests"])):
        # The multiprocess engine batches requests as they reach its core, so its GEMMs may
        # sum in another order than the in-process run's: the near-tie rule applies here too.
        first = first_difference(a, b)
        if first is None:
            same += 1
            continue
        gap = top2_gap(a["top_logprobs"][first])
        print(f"  multiprocess request {i}: diverges at token {first}; the in-process run's top-2 gap there "
              f"{gap:.4f} nats (bound {TIE_BOUND})")
        if gap > TIE_BOUND:
            failures.append(f"multiprocess request {i} diverges at token {first} with a top-2 gap of {gap:.4f}")
    print(f"multiprocess mode: {same}/{len(mp['requests'])} requests' {len(mp['requests'][0]['token_ids'])} tokens "
          "equal to the in-process run's")
    for run in (stock, slim, stock8, slim8, load(folder, "slimserve_host_fp8_e4m3.json"), mp):
        print(f"  {run['backend']} kv={run['kv_cache_dtype']} mp={int(run['multiprocess'])}: start-up "
              f"{run['startup_s']:.1f} s, generate {run['generate_s']:.1f} s")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
