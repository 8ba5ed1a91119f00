"""From one kernel's SASS and its problem to the report row: occupancy, the steady-state
iteration's instruction mix, warp-instructions per 16 B of DRAM, pipe cycles, bytes in flight
and the predicted fraction of H200 copy bandwidth. The model is docs/perf/h200-model.md."""

from __future__ import annotations

import heapq
import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import PurePath

from . import hopper
from .cfg import build_blocks, choose_main_loop, choose_tensor_loop, find_loops
from .classify import (CLASSES, NEVER_EXECUTED, access_bytes, instruction_class, pipe_of,
                       tensor_fmas, wgmma_operand_bytes)
from .ilp import chain_clocks
from .formulas import Work
from .sass import Function
from .steady import function_region, loop_region, steady_weights
from .toolchain import Resources

MEMORY = "dram"  # the name of the bandwidth term in bound_by


@dataclass
class Occupancy:
    ctas_per_sm: int
    limiter: str
    smem_per_cta: int


def occupancy(registers: int, threads: int, smem: int) -> Occupancy:
    warps = math.ceil(threads / 32)
    unit = hopper.REGISTER_ALLOCATION_UNIT
    registers_per_warp = math.ceil(max(registers, 1) * 32 / unit) * unit
    warps_by_registers = hopper.REGISTERS_PER_SM // registers_per_warp
    # Shared memory: the kernel's bytes plus the per-CTA system reservation.
    smem_per_cta = smem + hopper.SHARED_RESERVED_PER_CTA
    limits = {
        "registers": warps_by_registers // warps,
        "warps": hopper.MAX_WARPS_PER_SM // warps,
        "shared memory": hopper.SHARED_PER_SM // smem_per_cta,
        "CTA slots": hopper.MAX_CTAS_PER_SM,
    }
    limiter = min(limits, key=lambda k: (limits[k], list(limits).index(k)))
    return Occupancy(limits[limiter], limiter, smem_per_cta)


_DEPBAR = re.compile(r"SB0,\s*0x([0-9a-f]+)|SB0,\s*(\d+)")


def _pipeline_depth(function: Function, instructions) -> int:
    """Iterations of loads in flight: cp.async groups waited down to N leave N + 1 in flight;
    plain loads issued one iteration ahead leave 1."""
    depth = 1
    for instruction in instructions:
        if instruction.opcode == "DEPBAR" and "LE" in instruction.modifiers:
            match = _DEPBAR.search(instruction.operands)
            if match:
                waited = int(match.group(1), 16) if match.group(1) else int(match.group(2))
                depth = max(depth, waited + 1)
    return depth


def _source_span(path_instructions) -> str:
    """The main loop's source, from -lineinfo: the file most of its instructions come from,
    inlined call sites resolved to the outermost one we can see, and its line range."""
    files: Counter = Counter()
    lines: dict[str, list[int]] = {}
    for instruction in path_instructions:
        where = instruction.call_site or instruction.source
        if where is None:
            continue
        name = PurePath(where[0]).name
        files[name] += 1
        lines.setdefault(name, []).append(where[1])
    if not files:
        return "(no line info: build with -lineinfo)"
    name = files.most_common(1)[0][0]
    return f"{name}:{min(lines[name])}-{max(lines[name])}"


def _loop_source(function: Function, blocks, loop, path_instructions) -> str:
    """file:line of the loop statement (the back-edge branch's line), then the span."""
    span = _source_span(path_instructions)
    if loop is None:
        return span
    branch = function.instructions[blocks[max(loop.latches)].end - 1]
    where = branch.call_site or branch.source  # a branch inlined from a helper: its caller
    if where is None:
        return span
    return f"{PurePath(where[0]).name}:{where[1]} ({span})"


# The fixes of the honest model, by name: each can be switched off (the model as it was before
# them) to attribute how far a row moved to each (the report's "moved by" column).
FIXES = ("smem operands", "warps per scheduler", "phases add", "bytes in flight",
         "role warps", "fixed costs", "clock", "IMAD rate")
PESSIMISTIC, OPTIMISTIC = 0, 1
_PHASE_WAITS = ("BAR", "SYNCS", "WARPGROUP")  # barrier, mbarrier wait, wgmma wait
# a tensor fraction is of the wgmma peak of the same operand type
_WGMMA_OF = {"HMMA": "HGMMA", "HGMMA": "HGMMA", "QGMMA": "QGMMA", "IMMA": "IGMMA",
             "IGMMA": "IGMMA"}
_FP_PIPES = ("fma", "imad", "alu", "conversion", "special", "shuffle")


@dataclass
class Counts:
    """What the SASS says about one CTA-iteration, per warp (before any model constant)."""
    warps: int
    units: float                 # 16-byte units of DRAM per CTA iteration
    per16: float                 # warp-instructions per 16 B (the counted steady path)
    role_per16: float            # off-path work of some warps (scale copies, producers)
    pipes: dict                  # pipe -> warp-instructions per warp-iteration (steady path)
    role_pipes: dict
    smem_cycles: float           # LDS/STS/LDSM bandwidth cycles per warp-iteration
    operand_a: float             # wgmma A bytes from shared memory per warp-iteration
    operand_b: float             # wgmma B bytes per warp-iteration
    tensor_cycles: float         # all tensor instructions
    async_tensor_cycles: float   # wgmma only: runs apart from the issuing warps (a phase)
    peak_tensor_cycles: float    # the same multiply-adds at the wgmma peak of their type
    issue_words: float           # sum of weight x instructions
    chain_words: tuple           # (pessimistic, optimistic) sum of weight x max(count, chain)
    phase_wait: bool
    stage_bytes: float           # bytes one stage of loads requests, per CTA
    load_ratio: float            # bytes the path loads per DRAM byte (> 1: L2 serves re-reads)
    old_in_flight: float         # the model before: every path load x (waited + 1)
    waited: int                  # cp.async groups left in flight by the wait (DEPBAR N)
    bulk_bytes: float
    persistent_trips: float      # pipeline fills per persistent CTA (its segments; 0: not persistent)
    prologue: float              # instructions outside the main loop, per warp, once per CTA
    turn_groups: int = 1         # warpgroups taking turns at the tensor cores, as proven by the
                                 # steady path's turn barriers (Work.turn_groups)
    producer_per16: float = 0.0  # the part of role_per16 a producer loop's own warps issue


def _gather(function: Function, blocks, main, steady, work: Work, heaviest) -> tuple[Counts, dict]:
    by_class: Counter = Counter()
    by_opcode: Counter = Counter()
    pipes: Counter = Counter()
    smem_cycles = operand_a = operand_b = tensor_cycles = async_tensor = peak_tensor = 0.0
    load_bytes_outer = load_bytes_child = 0.0
    waits_outer = waits_child = 0.0  # cp.async waits (DEPBAR.LE): one per stage consumed
    loads_per_iteration = 0.0
    old_loads = 0.0
    bulk = False
    phase_wait = False
    issue_words = 0.0
    chain = [0.0, 0.0]
    path_instructions = []
    child_blocks = heaviest.blocks if heaviest is not None else set()
    child_trips = float(work.inner_trips) if work.inner_trips else 1.0
    for b, weight in steady.weights.items():
        body = function.instructions[blocks[b].start:blocks[b].end]
        count = 0
        for instruction in body:
            path_instructions.append(instruction)
            cls = instruction_class(instruction)
            by_class[cls] += weight
            never = instruction.predicate in NEVER_EXECUTED
            by_opcode["never-executed" if never else instruction.opcode] += weight
            count += 1
            if instruction.opcode in _PHASE_WAITS and not never:
                if instruction.opcode != "WARPGROUP" or "DEPBAR" in instruction.modifiers:
                    phase_wait = True
            pipe = pipe_of(instruction)
            if pipe == "tensor":
                rate = hopper.TENSOR_FMA_PER_CLOCK.get(instruction.opcode, 1024)
                tensor_cycles += weight * tensor_fmas(instruction) / rate
                peak = hopper.TENSOR_FMA_PER_CLOCK[_WGMMA_OF.get(instruction.opcode, "HGMMA")]
                peak_tensor += weight * tensor_fmas(instruction) / peak
                if instruction.opcode in ("HGMMA", "QGMMA", "IGMMA", "BGMMA"):
                    async_tensor += weight * tensor_fmas(instruction) / rate
                a, bb = wgmma_operand_bytes(instruction)
                operand_a += weight * a / 4  # one warp's quarter of the warpgroup's reads
                operand_b += weight * bb / 4
            elif pipe == "lsu":
                moved = 32 * access_bytes(instruction)
                smem_cycles += weight * max(1.0, moved / hopper.SHARED_BYTES_PER_CLOCK)
            elif pipe is not None:
                pipes[pipe] += weight
            if instruction.opcode == "DEPBAR" and "LE" in instruction.modifiers:
                if b in child_blocks:
                    waits_child += weight / child_trips
                elif weight <= 1.0:
                    waits_outer += weight
            if instruction.opcode in ("UTMALDG", "UBLKCP"):
                bulk = True
            elif cls == "global_load" and not never:
                moved = 32 * access_bytes(instruction)
                old_loads += min(weight, 1.0) * moved
                loads_per_iteration += weight * moved
                if b in child_blocks:
                    load_bytes_child += weight / child_trips * moved
                elif weight <= 1.0:
                    load_bytes_outer += weight * moved
        issue_words += weight * count
        for end in (PESSIMISTIC, OPTIMISTIC):
            clocks = chain_clocks(body, hopper.DEPENDENT_LATENCY[end], hopper.SLOW_LATENCY[end],
                                  hopper.SHARED_LATENCY[end])
            chain[end] += weight * max(count, clocks)

    # Off-path blocks of the loop that move global memory: work some warps do every iteration
    # (scale-copy warps, a producer), or another version of the body. Counted once per
    # iteration for the warps the formula names (role_warp_fraction), at least one warp.
    role_pipes: Counter = Counter()
    role_count = 0.0
    region_blocks = main.blocks if main is not None else set()
    nested = set()
    for child in (main.children if main is not None else []):
        nested |= child.blocks
    for b in sorted(region_blocks - set(steady.weights) - nested):
        body = function.instructions[blocks[b].start:blocks[b].end]
        if not any(instruction_class(i) == "global_load" and i.predicate not in NEVER_EXECUTED
                   for i in body):
            continue
        for instruction in body:
            role_count += 1
            pipe = pipe_of(instruction)
            if pipe not in (None, "tensor", "lsu"):
                role_pipes[pipe] += 1
            elif pipe == "lsu":
                role_pipes["lsu"] += 1
    warps = math.ceil((work.loop_threads or work.threads) / 32)
    fraction = work.role_warp_fraction if work.role_warp_fraction is not None else 1.0 / warps
    units = work.bytes_per_iteration / 16
    total = sum(by_class.values())

    depth_waited = 0
    for instruction in path_instructions:
        if instruction.opcode == "DEPBAR" and "LE" in instruction.modifiers:
            match = _DEPBAR.search(instruction.operands)
            if match:
                waited = int(match.group(1), 16) if match.group(1) else int(match.group(2))
                depth_waited = max(depth_waited, waited)
    # One stage: the loads between two cp.async waits (an unrolled loop body holds several)
    if load_bytes_child > 0:
        stage = warps * load_bytes_child / max(1.0, waits_child)
    else:
        stage = warps * load_bytes_outer / max(1.0, waits_outer)
    # a persistent CTA's pipeline drains and refills at each of its segments (the formula
    # knows how many: stream-K); other CTAs fill once per round
    persistent = float(work.segments_per_cta or 0.0)
    prologue = _prologue_epilogue(function, blocks, main) if main is not None else 0.0
    counts = Counts(
        warps=warps, units=units, per16=warps * total / units,
        role_per16=warps * fraction * role_count / units,
        pipes=dict(pipes), role_pipes={k: v * fraction for k, v in role_pipes.items()},
        smem_cycles=smem_cycles, operand_a=operand_a, operand_b=operand_b,
        tensor_cycles=tensor_cycles, async_tensor_cycles=async_tensor,
        peak_tensor_cycles=peak_tensor, issue_words=issue_words, chain_words=tuple(chain),
        phase_wait=phase_wait, stage_bytes=stage,
        load_ratio=max(1.0, warps * loads_per_iteration / work.bytes_per_iteration),
        old_in_flight=warps * old_loads * (depth_waited + 1 if depth_waited else 1),
        waited=depth_waited,
        bulk_bytes=work.bytes_per_iteration * max(1, work.stages_in_flight) if bulk else 0.0,
        persistent_trips=persistent, prologue=float(prologue))
    extra = {"by_class": by_class, "by_opcode": by_opcode, "total": total,
             "path_instructions": path_instructions}
    return counts, extra


_TENSOR_ASYNC = ("HGMMA", "QGMMA", "IGMMA", "BGMMA")


def _named_barrier(instruction, action: str) -> bool:
    """BAR.SYNC / BAR.ARV on a named barrier (not barrier 0, __syncthreads')."""
    if instruction.opcode != "BAR" or action not in instruction.modifiers:
        return False
    first = instruction.operands.split(",")[0].strip()
    return first not in ("0x0", "0")


def turn_barriers(path_instructions) -> bool:
    """The ping-pong signature on a steady path (program order): a bar.sync on a named barrier
    (wait for the turn), then wgmma, then a bar.arrive on a named barrier (pass the turn) before
    the wgmma wait. Then the issuing warpgroup hands the tensor cores over while its products
    run, and its CUDA-core phase can run under another warpgroup's products."""
    state = 0
    for instruction in sorted(path_instructions, key=lambda i: i.address):
        if instruction.predicate in NEVER_EXECUTED:
            continue
        if state == 0 and _named_barrier(instruction, "SYNC"):
            state = 1
        elif state == 1 and instruction.opcode in _TENSOR_ASYNC:
            state = 2
        elif state == 2 and _named_barrier(instruction, "ARV"):
            state = 3
        elif state == 3 and instruction.opcode == "WARPGROUP" and "DEPBAR" in instruction.modifiers:
            return True
    return False


def _producer_loop(function: Function, blocks, roots, main):
    """A warp-specialized kernel's producer: the outermost loop other than the counted one
    with the most global loads."""
    best = None
    for loop in roots:
        if main is not None and (loop is main or main.header in loop.blocks):
            continue
        body = [i for b in sorted(loop.blocks) for i in function.instructions[blocks[b].start:blocks[b].end]]
        loads = sum(1 for i in body if instruction_class(i) == "global_load" and i.predicate not in NEVER_EXECUTED)
        if loads and (best is None or loads > best[0]):
            best = (loads, loop, body)
    return best


def _with_producer(counts: Counts, function: Function, blocks, roots, main, work: Work) -> tuple[Counts, dict]:
    """Fold a producer loop into the counts: each of its warps runs its steady path (chosen
    as the counted loop's: the cheapest path that requests the DRAM bytes of an iteration)
    once per counted iteration, as role work; its loads are the stages in flight (cp.async
    groups waited down to N), and what they load beyond the DRAM bytes is served by L2."""
    found = _producer_loop(function, blocks, roots, main)
    if found is None or not work.producer_warps:
        return counts, {"found": False}
    _, loop, _ = found
    path = steady_weights(function, blocks, loop_region(loop), lambda child: 1.0,
                          traffic_per_thread=work.bytes_per_iteration / (32 * work.producer_warps))
    body = []
    for b, weight in path.weights.items():
        body.extend([i for i in function.instructions[blocks[b].start:blocks[b].end]] * max(1, round(weight)))
    role_pipes = dict(counts.role_pipes)
    share = work.producer_warps / counts.warps
    loaded = 0.0
    waited = 0
    for instruction in body:
        pipe = pipe_of(instruction)
        if pipe not in (None, "tensor"):
            role_pipes[pipe] = role_pipes.get(pipe, 0.0) + share
        if instruction_class(instruction) == "global_load" and instruction.predicate not in NEVER_EXECUTED:
            loaded += 32 * access_bytes(instruction)
        if instruction.opcode == "DEPBAR" and "LE" in instruction.modifiers:
            match = _DEPBAR.search(instruction.operands)
            if match:
                waited = max(waited, int(match.group(1), 16) if match.group(1) else int(match.group(2)))
    stage = work.producer_warps * loaded
    producer_per16 = work.producer_warps * len(body) / counts.units
    replaced = {
        "role_per16": counts.role_per16 + producer_per16,
        "producer_per16": producer_per16,
        "role_pipes": role_pipes,
    }
    if counts.stage_bytes == 0 and stage > 0:
        replaced.update(stage_bytes=stage, waited=waited,
                        load_ratio=max(1.0, stage / work.bytes_per_iteration))
    return Counts(**{**counts.__dict__, **replaced}), {
        "found": True, "instructions": len(body), "stage_bytes": stage, "waited": waited,
        "all_paths_counted": not path.covering}


def _cheapest(blocks, sources: set[int], targets: set[int], avoid: set[int]) -> float:
    """Fewest instructions on a path from any source block to any target block (both
    counted), not entering `avoid`; inf when none."""
    best = {b: float(blocks[b].end - blocks[b].start) for b in sources if b not in avoid}
    queue = [(cost, b) for b, cost in best.items()]
    heapq.heapify(queue)
    while queue:
        cost, b = heapq.heappop(queue)
        if b in targets:
            return cost
        if cost > best.get(b, math.inf):
            continue
        for s in blocks[b].successors:
            if s in avoid:
                continue
            candidate = cost + (blocks[s].end - blocks[s].start)
            if candidate < best.get(s, math.inf):
                best[s] = candidate
                heapq.heappush(queue, (candidate, s))
    return math.inf


def _prologue_epilogue(function: Function, blocks, main) -> float:
    """Instructions a CTA issues outside its main loop, once: the cheapest path from the
    entry to the loop, and from the loop's exits to an EXIT (error and abort paths, and
    other versions of the code, are not on it; a loop on it counts one trip)."""
    inside = set(main.blocks)
    into = {p for p in blocks[main.header].predecessors if p not in inside}
    exits = {b for b in range(len(blocks))
             if function.instructions[blocks[b].end - 1].opcode == "EXIT"}
    before = _cheapest(blocks, {0}, into, inside) if 0 not in inside else 0.0
    after_sources = {s for b in inside for s in blocks[b].successors if s not in inside}
    after = _cheapest(blocks, after_sources, exits, inside)
    total = (before if before != math.inf else 0.0) + (after if after != math.inf else 0.0)
    return float(total)


def _dispatch_efficiency(costs: list[float], slots: int) -> float:
    """CTAs of unequal work handed, in launch order, to whichever CTA slot frees first: the
    work over slots x the time the last one ends (1.0: no tail)."""
    finish = [0.0] * min(slots, len(costs))
    heapq.heapify(finish)
    for cost in costs:
        heapq.heapreplace(finish, finish[0] + cost)
    makespan = max(finish) if finish else 0.0
    return sum(costs) / (slots * makespan) if makespan > 0 else 1.0


def evaluate(c: Counts, work: Work, occ: Occupancy, end: int, off=()) -> dict:
    """The prediction at one end of the ranges; `off`: fixes switched off (FIXES)."""
    clock = hopper.SM_CLOCK_HZ if "clock" in off else hopper.CLOCK_RANGE_HZ[end]
    latency_s = hopper.NOMINAL_LATENCY_S if "bytes in flight" in off else \
        hopper.LATENCY_RANGE_S[end]
    per_sm_clock = hopper.COPY_BANDWIDTH / hopper.SMS / clock
    fill = min(1.0, work.ctas / hopper.SMS)
    resident = max(1.0 if work.ctas else 0.0, min(float(occ.ctas_per_sm), work.ctas / hopper.SMS))
    scale = c.warps / c.units  # per warp-iteration -> per 16 B on one SM

    # issue: warps per scheduler x one warp's rate (its dependent chains), capped
    def issue_rate_of(warps_on_sm: float) -> float:
        if "warps per scheduler" in off:
            return hopper.NOMINAL_SUSTAINED_ISSUE
        per_warp = c.issue_words / c.chain_words[end] if c.chain_words[end] else 1.0
        return hopper.SMSPS * min(hopper.ISSUE_CAP_PER_SMSP[end],
                                  warps_on_sm / hopper.SMSPS * per_warp)
    issue_rate = issue_rate_of(c.warps * c.turn_groups * resident)
    roles = "role warps" not in off
    issued = c.per16 + (c.role_per16 if roles else 0.0)
    cycles = {MEMORY: 16 / per_sm_clock, "issue": issued / issue_rate}
    for pipe in _FP_PIPES:
        n = c.pipes.get(pipe, 0.0) + (c.role_pipes.get(pipe, 0.0) if roles else 0.0)
        if not n:
            continue
        if pipe == "imad":
            # IMAD occupies the FMA datapath, and only its heavy half: half the FP32 rate
            cycles["fma"] = cycles.get("fma", 0.0) + n * scale / hopper.PIPE_RATE["fma"]
            if "IMAD rate" in off:
                continue
        cycles[pipe] = cycles.get(pipe, 0.0) + n * scale / hopper.PIPE_RATE[pipe]
    lsu = (c.smem_cycles + (c.role_pipes.get("lsu", 0.0) if roles else 0.0)) * scale
    operands = 0.0
    if "smem operands" not in off:
        charged = c.operand_a + (c.operand_b if hopper.WGMMA_B_FROM_SHARED_CHARGED[end] else 0)
        operands = charged * scale / hopper.SHARED_BYTES_PER_CLOCK
    cycles["lsu"] = lsu + operands
    cycles["tensor"] = c.tensor_cycles * scale

    # bytes in flight
    if "bytes in flight" in off:
        in_flight_cta = c.old_in_flight + c.bulk_bytes
    else:
        depth = max(1, c.waited + (1 if end == OPTIMISTIC else 0)) if c.waited else 1
        in_flight_cta = c.stage_bytes * depth + c.bulk_bytes
    in_flight_sm = in_flight_cta * resident
    latency_cycles = latency_s * clock
    if "bytes in flight" not in off and c.load_ratio > 1.0:
        # loads beyond the DRAM bytes are L2 hits (row tiles re-reading K/V): they must be in
        # flight too, at the L2 latency
        l2 = hopper.L2_LATENCY_RANGE_S[end] * clock
        latency_cycles = latency_cycles + (c.load_ratio - 1.0) * l2
    if in_flight_sm:
        cycles["latency"] = 16 * latency_cycles / in_flight_sm
    else:  # nothing loaded on the path (compute-only calibration kernels): nothing to wait for
        cycles["latency"] = 0.0 if c.stage_bytes == 0 and not c.bulk_bytes else math.inf

    # phases: a CTA that waits for its wgmma (or at a barrier between them) runs its CUDA-core
    # work (issue, pipes, LDS: C) and its tensor work (wgmma and its operand reads: T) one
    # after the other; R independent units on an SM (resident CTAs; at the optimistic end
    # each warpgroup of a CTA) overlap them at best: per unit-iteration
    # max((C_one + T) / R, T, C_all), C_one issued by one unit's warps alone.
    # (mma.sync is issued inline by the warps: it stays with the core work)
    inline_tensor = (c.tensor_cycles - c.async_tensor_cycles) * scale
    pipes_max = max([lsu, inline_tensor] + [cycles[p] for p in _FP_PIPES if p in cycles])
    core = max(cycles["issue"], pipes_max)
    tensor = max(c.async_tensor_cycles * scale, operands)
    compute = max(core, tensor, cycles["lsu"])
    bound_phases = False
    if "phases add" not in off and c.phase_wait and c.async_tensor_cycles > 0:
        if c.turn_groups > 1:
            # warpgroups taking turns (ping-pong), each running the counted path: one's
            # CUDA-core phase under the others' tensor phases, at both ends
            groups, unit_warps = c.turn_groups, c.warps
        else:
            groups = max(1, c.warps // 4) if end == OPTIMISTIC else 1
            unit_warps = c.warps / groups
        units = resident * groups
        # a producer loop's instructions are issued by its own warps, not by a unit's: they
        # count in the SM's issue term, not in a unit's phase
        unit_issued = issued - (c.producer_per16 if roles else 0.0)
        core_one = max(unit_issued / issue_rate_of(unit_warps), pipes_max)
        phased = (core_one + tensor) / units
        if phased > compute:
            compute, bound_phases = phased, True
    limit = max(cycles[MEMORY], cycles["latency"], compute)
    if bound_phases and limit == compute:
        bound = "phases"
    else:
        bound = max(cycles, key=lambda k: cycles[k])
    steady_fraction = cycles[MEMORY] / limit if limit > 0 else 0.0

    # fixed costs, wave quantization
    waves = 1.0
    fixed_s = 0.0
    if "fixed costs" not in off:
        if work.cta_costs:
            waves = _dispatch_efficiency(work.cta_costs, hopper.SMS * occ.ctas_per_sm)
        elif end == PESSIMISTIC and work.ctas > hopper.SMS:
            # the busiest SM's CTAs, in rounds of the resident CTAs, against the average
            busiest = math.ceil(work.ctas / hopper.SMS)
            rounds = math.ceil(busiest / occ.ctas_per_sm)
            average = work.ctas / hopper.SMS
            waves = average / occ.ctas_per_sm / rounds if rounds > 1 else average / busiest
        fixed_s = hopper.LAUNCH_RAMP_S[end]
        rounds = math.ceil(work.ctas / (hopper.SMS * occ.ctas_per_sm)) if work.ctas else 0
        fills = c.persistent_trips if c.persistent_trips else rounds
        if end == PESSIMISTIC or resident <= 1.0:
            # each fill (a CTA's first stages; a persistent CTA's drain and refill at each
            # segment) waits one DRAM latency; with one CTA per SM nothing hides it
            fixed_s += fills * latency_s
        if end == PESSIMISTIC:
            ctas_per_sm = max(1.0, work.ctas / hopper.SMS)
            fixed_s += ctas_per_sm * c.warps * c.prologue / issue_rate / clock
    effective = fill * waves
    steady_s = (work.dram_bytes / (hopper.COPY_BANDWIDTH * steady_fraction * effective)
                if steady_fraction > 0 and effective > 0 else math.inf)
    total_s = steady_s + fixed_s
    fraction = (work.dram_bytes / hopper.COPY_BANDWIDTH) / total_s if total_s > 0 else 0.0
    if fill < steady_fraction and fill < 1.0 and bound != "phases":
        bound = "grid size"
    tensor_fraction = (c.peak_tensor_cycles * scale / limit * effective * (steady_s / total_s)
                       * clock / hopper.TENSOR_PEAK_CLOCK_HZ) if limit > 0 and total_s > 0 else 0.0
    return {"fraction": fraction, "tensor_fraction": tensor_fraction, "bound": bound,
            "cycles": cycles, "in_flight_sm": in_flight_sm,
            "in_flight_needed": hopper.COPY_BANDWIDTH / hopper.SMS * latency_s,
            "issue_rate": issue_rate, "clock": clock, "steady_s": steady_s, "fixed_s": fixed_s,
            "waves": waves, "fill": fill}


def analyse(function: Function, resources: Resources | None, work: Work) -> dict:
    blocks = build_blocks(function)
    roots = find_loops(blocks)
    chooser = choose_tensor_loop if work.main_loop == "tensor" else choose_main_loop
    main = None if work.whole_kernel else chooser(function, blocks, roots)

    heaviest = None
    outer_children = main.children if main is not None else roots
    if outer_children:
        heaviest = max(outer_children, key=lambda loop: sum(
            blocks[b].end - blocks[b].start for b in loop.blocks))

    def child_trips(loop) -> float:
        if loop is heaviest and work.inner_trips is not None:
            return float(work.inner_trips)
        return float(work.other_child_trips)

    region = loop_region(main) if main is not None else function_region(function, blocks, roots)
    steady = steady_weights(function, blocks, region, child_trips,
                            traffic_per_thread=work.bytes_per_iteration / work.threads,
                            stores_per_thread=work.store_bytes_per_iteration / work.threads)
    counts, extra = _gather(function, blocks, main, steady,
                            work, heaviest if work.inner_trips is not None else None)
    counts, producer = _with_producer(counts, function, blocks, roots, main, work)
    turns = work.turn_groups > 1 and turn_barriers(extra["path_instructions"])
    if turns:
        counts = Counts(**{**counts.__dict__, "turn_groups": work.turn_groups})
    by_class, by_opcode, total = extra["by_class"], extra["by_opcode"], extra["total"]
    path_instructions = extra["path_instructions"]
    warps, units = counts.warps, counts.units
    per16 = counts.per16
    class_per16 = {cls: round(warps * by_class.get(cls, 0.0) / units, 3) for cls in CLASSES}

    registers = resources.registers if resources else 0
    static_smem = resources.shared if resources else 0
    # The cubin's static shared memory of a kernel that uses shared memory includes the 1 KiB
    # per-CTA reservation, which occupancy() adds for every CTA.
    static_smem = max(0, static_smem - hopper.SHARED_RESERVED_PER_CTA)
    occ = occupancy(registers, work.threads, work.dynamic_smem + static_smem)

    low = evaluate(counts, work, occ, PESSIMISTIC)
    high = evaluate(counts, work, occ, OPTIMISTIC)
    ideal_counts = Counts(**{**counts.__dict__, "chain_words": (counts.issue_words,) * 2})
    ideal = evaluate(ideal_counts, work, occ, OPTIMISTIC)
    # How far each fix moved the pessimistic end: of copy bandwidth, or of the tensor peak
    # where that is the larger figure (compute-bound rows)
    def judged(result: dict) -> float:
        return max(result["fraction"], result["tensor_fraction"])
    moved_by = []
    for fix in FIXES:
        without = judged(evaluate(counts, work, occ, PESSIMISTIC, off=(fix,)))
        if without - judged(low) >= 0.02:
            moved_by.append((round(without - judged(low), 3), fix))
    moved_by.sort(reverse=True)
    before = evaluate(counts, work, occ, PESSIMISTIC, off=FIXES)
    spills = sum(1 for i in function.instructions if instruction_class(i) == "local")

    def rounded(cycles):
        return {k: (round(v, 3) if v != math.inf else None) for k, v in cycles.items()}

    return {
        "regs": registers,
        "spills": spills,
        "local_bytes": resources.local if resources else 0,
        "stack_bytes": resources.stack if resources else 0,
        "smem_bytes": occ.smem_per_cta - hopper.SHARED_RESERVED_PER_CTA,
        "threads": work.threads,
        "ctas": work.ctas,
        "ctas_per_sm": occ.ctas_per_sm,
        "occupancy_limit": occ.limiter,
        "main_loop": {
            "found": main is not None,
            "source": _loop_source(function, blocks, main, path_instructions),
            "instructions": len(cfg_instructions(function, blocks, main)) if main else None,
            "steady_path_warp_instructions": round(total, 1),
            "nested_loops": len(main.children) if main else 0,
            "inner_trips": work.inner_trips,
            "all_paths_counted": not steady.covering,
            "path_requests_dram_bytes": steady.met_traffic,
            "pipeline_depth": counts.waited + 1 if counts.waited else 1,
            "phase_wait": counts.phase_wait,
            "one_warp_issue_rate": [round(counts.issue_words / w, 3) if w else 1.0
                                    for w in counts.chain_words],
            "prologue_instructions": counts.prologue,
            "turn_groups": counts.turn_groups,
            "producer": producer,
        },
        "dram_bytes_per_iteration": round(work.bytes_per_iteration, 1),
        "bytes_formula": work.bytes_formula,
        "l2_only_bytes": work.l2_only_bytes,
        "warp_instr_per_16B": round(per16, 3),
        "role_warp_instr_per_16B": round(counts.role_per16, 3),
        "instr_by_class": class_per16,
        "top_opcodes_per_16B": {op: round(warps * n / units, 3)
                                for op, n in by_opcode.most_common(12)},
        "instr_per_iteration_by_class": {  # per warp, one main-loop iteration
            cls: round(by_class[cls], 1) for cls in CLASSES if by_class.get(cls)},
        "tensor_cycles_per_16B": round(low["cycles"]["tensor"], 3),
        "cycles_per_16B": rounded(low["cycles"]),
        "cycles_per_16B_optimistic": rounded(high["cycles"]),
        "issue_per_clock": [round(low["issue_rate"], 3), round(high["issue_rate"], 3)],
        "bytes_in_flight_per_sm": round(low["in_flight_sm"]),
        "bytes_in_flight_needed": round(low["in_flight_needed"]),
        "bytes_in_flight_optimistic": [round(high["in_flight_sm"]), round(high["in_flight_needed"])],
        "grid_fill": round(low["fill"], 3),
        "wave_efficiency": round(low["waves"], 3),
        "fixed_seconds": [low["fixed_s"], high["fixed_s"]],
        "steady_seconds": [low["steady_s"], high["steady_s"]],
        # the budget judges the pessimistic end: predicted_copy_bw_fraction
        "predicted_copy_bw_fraction": round(low["fraction"], 3),
        "predicted_copy_bw_fraction_optimistic": round(high["fraction"], 3),
        "upper_bound_copy_bw_fraction": round(ideal["fraction"], 3),
        "predicted_tensor_fraction": round(low["tensor_fraction"], 3),
        "predicted_tensor_fraction_optimistic": round(high["tensor_fraction"], 3),
        "bound_by": low["bound"],
        "bound_by_optimistic": high["bound"],
        "model_before_fraction": round(before["fraction"], 3),
        "moved_by": [f"{fix} {-delta:+.0%}" for delta, fix in moved_by],
        "notes": work.notes,
        "_path": [(weight, blocks[b].start, blocks[b].end)
                  for b, weight in sorted(steady.weights.items())],
    }



def explain(function: Function, row: dict) -> str:
    """The steady path of a row as annotated SASS: executions per iteration, source line."""
    lines = [f"# {row['key']}: steady path per warp and main-loop iteration "
             f"({row['main_loop']['steady_path_warp_instructions']} warp-instructions)"]
    for weight, start, end in row["_path"]:
        lines.append(f"  -- block at {function.instructions[start].address:#06x}, x{weight:g}")
        for instruction in function.instructions[start:end]:
            where = instruction.source
            source = f"{PurePath(where[0]).name}:{where[1]}" if where else ""
            predicate = f"@{instruction.predicate} " if instruction.predicate else ""
            text = f"{predicate}{instruction.full_opcode} {instruction.operands}"
            lines.append(f"     {instruction.address:06x}  {text[:70]:<70} "
                         f"{instruction_class(instruction):<11} {source}")
    return "\n".join(lines)


def cfg_instructions(function: Function, blocks, loop):
    out = []
    for b in sorted(loop.blocks):
        out.extend(function.instructions[blocks[b].start:blocks[b].end])
    return out
