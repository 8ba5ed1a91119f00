"""From one kernel's SASS and its problem to the report row: occupancy, the steady-state
iteration's instruction mix, warp-instructions per 16 B of DRAM, pipe cycles, bytes in flight
and the predicted fraction of H200 copy bandwidth. The model is docs/perf/h200-model.md."""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import PurePath

from . import hopper
from .cfg import build_blocks, choose_main_loop, find_loops
from .classify import (CLASSES, NEVER_EXECUTED, PIPES, access_bytes, instruction_class, pipe_of,
                       tensor_fmas)
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


def analyse(function: Function, resources: Resources | None, work: Work) -> dict:
    blocks = build_blocks(function)
    roots = find_loops(blocks)
    main = None if work.whole_kernel else choose_main_loop(function, blocks, roots)

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
                            traffic_per_thread=work.bytes_per_iteration / work.threads)

    # Per-warp counts of one main-loop iteration.
    by_class: Counter = Counter()
    by_opcode: Counter = Counter()
    pipe_cycles: Counter = Counter()
    load_bytes_per_warp = 0.0
    bulk_loads = False
    tensor_cycles = 0.0
    path_instructions = []
    for b, weight in steady.weights.items():
        for instruction in function.instructions[blocks[b].start:blocks[b].end]:
            path_instructions.append(instruction)
            cls = instruction_class(instruction)
            by_class[cls] += weight
            never = instruction.predicate in NEVER_EXECUTED
            by_opcode["never-executed" if never else instruction.opcode] += weight
            pipe = pipe_of(instruction)
            if pipe == "tensor":
                rate = hopper.TENSOR_FMA_PER_CLOCK.get(instruction.opcode, 1024)
                tensor_cycles += weight * tensor_fmas(instruction) / rate
            elif pipe == "lsu":
                moved = 32 * access_bytes(instruction)
                pipe_cycles["lsu"] += weight * max(1.0, moved / hopper.SHARED_BYTES_PER_CLOCK)
            elif pipe is not None:
                pipe_cycles[pipe] += weight / hopper.PIPE_RATE[pipe]
            if instruction.opcode in ("UTMALDG", "UBLKCP"):
                bulk_loads = True  # tile size is in the tensor map: see in_flight_cta below
            elif cls == "global_load":
                # In flight together: one trip of a nested loop (its trips are sequential).
                load_bytes_per_warp += min(weight, 1.0) * 32 * access_bytes(instruction)

    warps = math.ceil(work.threads / 32)
    units = work.bytes_per_iteration / 16  # 16-byte units of DRAM per CTA iteration
    total = sum(by_class.values())
    per16 = warps * total / units
    class_per16 = {cls: round(warps * by_class.get(cls, 0.0) / units, 3) for cls in CLASSES}

    # Cycles per 16 B of DRAM on one SM, per term; the largest binds.
    cycles = {
        MEMORY: 16 / hopper.BYTES_PER_CLOCK_PER_SM,
        "issue": per16 / hopper.SUSTAINED_ISSUE_PER_CLOCK,
    }
    for pipe in PIPES:
        if pipe in pipe_cycles:
            cycles[pipe] = warps * pipe_cycles[pipe] / units
    cycles["tensor"] = warps * tensor_cycles / units

    registers = resources.registers if resources else 0
    static_smem = resources.shared if resources else 0
    # The cubin's static shared memory of a kernel that uses shared memory includes the 1 KiB
    # per-CTA reservation, which occupancy() adds for every CTA.
    static_smem = max(0, static_smem - hopper.SHARED_RESERVED_PER_CTA)
    occ = occupancy(registers, work.threads, work.dynamic_smem + static_smem)
    depth = _pipeline_depth(function, path_instructions)
    in_flight_cta = warps * load_bytes_per_warp * depth
    if bulk_loads:
        # TMA: assume the iteration's DRAM bytes per stage in flight, stages = the formula's
        # pipeline depth (1 unless it says otherwise).
        in_flight_cta += work.bytes_per_iteration * max(1, work.stages_in_flight)
    # A grid smaller than the machine leaves SMs idle and fewer CTAs on the busy ones.
    resident = min(float(occ.ctas_per_sm), work.ctas / hopper.SMS)
    fill = min(1.0, work.ctas / hopper.SMS)
    in_flight_sm = in_flight_cta * max(resident, 1.0 if work.ctas else 0.0)
    cycles["latency"] = (16 * hopper.LATENCY_CYCLES / in_flight_sm) if in_flight_sm else math.inf

    limit = max(cycles.values())
    bound = max(cycles, key=lambda k: cycles[k])
    unfilled = cycles[MEMORY] / limit if limit > 0 else 0.0
    fraction = unfilled * fill
    tensor_fraction = (cycles["tensor"] / limit * fill) if limit > 0 else 0.0
    if fill < unfilled:
        bound = "grid size"
    # The same with ideal issue (4 per clock): what no schedule can beat.
    ideal = dict(cycles, issue=per16 / hopper.ISSUE_PER_CLOCK)
    upper_bound = cycles[MEMORY] / max(ideal.values()) * fill
    spills = sum(1 for i in function.instructions if instruction_class(i) == "local")

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
            "pipeline_depth": depth,
        },
        "dram_bytes_per_iteration": round(work.bytes_per_iteration, 1),
        "bytes_formula": work.bytes_formula,
        "l2_only_bytes": work.l2_only_bytes,
        "warp_instr_per_16B": round(per16, 3),
        "instr_by_class": class_per16,
        "top_opcodes_per_16B": {op: round(warps * n / units, 3)
                                for op, n in by_opcode.most_common(12)},
        "instr_per_iteration_by_class": {  # per warp, one main-loop iteration
            cls: round(by_class[cls], 1) for cls in CLASSES if by_class.get(cls)},
        "tensor_cycles_per_16B": round(cycles["tensor"], 3),
        "cycles_per_16B": {k: (round(v, 3) if v != math.inf else None) for k, v in cycles.items()},
        "bytes_in_flight_per_sm": round(in_flight_sm),
        "bytes_in_flight_needed": round(hopper.BYTES_IN_FLIGHT_NEEDED),
        "grid_fill": round(fill, 3),
        "predicted_copy_bw_fraction": round(fraction, 3),
        "upper_bound_copy_bw_fraction": round(upper_bound, 3),
        "predicted_tensor_fraction": round(tensor_fraction, 3),
        "bound_by": bound,
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
