"""Instruction-level parallelism of a block: the dependent chain through its registers.

One warp issues an instruction only when its operands are ready, so a warp alone needs at
least max(instructions, dependent-chain clocks) clocks for a block. The chain is computed
over the block alone (registers live on entry are ready), from the registers each
instruction writes (its first operand, two predicates for the set-predicate forms, vector
widths from .64/.128) and reads (every other register operand and the guard predicate).
Global loads and wgmma results count as ready at once: their waits are the latency and tensor
terms of the model, not dependent issue.
"""

from __future__ import annotations

import re

from .classify import NEVER_EXECUTED, instruction_class
from .sass import Instruction

_REGISTER = re.compile(r"\b(U?R\d+|U?P\d)(\.64|\.128)?\b")
_NO_DESTINATION = {"STG", "STS", "ST", "STL", "STSM", "RED", "REDG", "REDAS", "BRA", "BRX",
                   "JMP", "EXIT", "BAR", "BSSY", "BSYNC", "WARPSYNC", "NOP", "DEPBAR",
                   "MEMBAR", "FENCE", "ERRBAR", "CCTL", "YIELD", "SYNCS", "ARRIVES",
                   "WARPGROUP", "UTMALDG", "UTMASTG", "UBLKCP", "LDGSTS", "UTMAPF",
                   "NANOSLEEP", "BREAK", "RET", "CALL", "KILL"}
_TWO_PREDICATES = {"ISETP", "FSETP", "HSETP2", "DSETP", "PSETP", "UISETP", "PLOP3", "UPLOP3"}
_READY_AT_ONCE = {"global_load", "tensor"}  # LDG/LDGSTS/TMA and wgmma: other terms wait
_SLOW = {"shared_load": 1, "shuffle": 1, "special": 1, "conversion": 1}


def _registers(text: str) -> list[str]:
    out = []
    for name, width in _REGISTER.findall(text):
        count = {".64": 2, ".128": 4}.get(width, 1)
        if name.startswith(("R", "UR")) and count > 1:
            prefix = "UR" if name.startswith("UR") else "R"
            base = int(name[len(prefix):])
            out.extend(f"{prefix}{base + i}" for i in range(count))
        else:
            out.append(name)
    return out


def _destination_width(instruction: Instruction) -> int:
    for modifier in instruction.modifiers:
        if modifier == "128":
            return 4
        if modifier == "64":
            return 2
    if instruction.opcode == "LDSM":
        for modifier in instruction.modifiers:
            if modifier in ("2", "4"):
                return int(modifier)
    if instruction.opcode in ("HMMA", "IMMA"):
        return 4
    return 1


def reads_writes(instruction: Instruction) -> tuple[list[str], list[str]]:
    operands = [o.strip() for o in instruction.operands.split(",") if o.strip()]
    sources: list[str] = []
    if instruction.predicate:
        sources.append(instruction.predicate.lstrip("!"))
    opcode = instruction.opcode
    if opcode in _NO_DESTINATION or not operands:
        for operand in operands:
            sources.extend(_registers(operand))
        return sources, []
    count = 2 if opcode in _TWO_PREDICATES else 1
    writes: list[str] = []
    for operand in operands[:count]:
        names = _registers(operand)
        if len(names) == 1 and names[0].startswith(("R", "UR")):
            prefix = "UR" if names[0].startswith("UR") else "R"
            base = int(names[0][len(prefix):])
            names = [f"{prefix}{base + i}" for i in range(_destination_width(instruction))]
        writes.extend(names)
    for operand in operands[count:]:
        sources.extend(_registers(operand))
    return sources, writes


def chain_clocks(instructions: list[Instruction], dependent: float, slow: float,
                 shared: float) -> float:
    """Clocks of the longest dependent chain of a block: `dependent` per fixed-latency step,
    `slow` for MUFU, conversions and shuffles, `shared` for shared-memory loads."""
    ready: dict[str, float] = {}
    finish = 0.0
    for instruction in instructions:
        if instruction.predicate in NEVER_EXECUTED:
            continue
        sources, writes = reads_writes(instruction)
        start = max((ready.get(r, 0.0) for r in sources), default=0.0)
        cls = instruction_class(instruction)
        if cls in _READY_AT_ONCE:
            latency = 0.0
        elif cls == "shared_load":
            latency = shared
        elif cls in _SLOW:
            latency = slow
        elif cls in ("store", "control"):
            latency = 0.0
        else:
            latency = dependent
        done = start + latency
        for r in writes:
            if r not in ("RZ", "PT", "URZ", "UPT"):
                ready[r] = done
        finish = max(finish, done)
    return finish
