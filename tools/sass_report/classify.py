"""Instruction classes (what the report counts) and execution pipes (what the model times).

Classes follow the issue's list; every SASS opcode maps to exactly one class. Pipes group the
classes by the sm_90 hardware unit that bounds their throughput (docs/perf/h200-model.md).
"""

from __future__ import annotations

from .sass import Instruction

# Class names, in report order.
CLASSES = (
    "global_load",   # LDG, LDGSTS (cp.async), UTMALDG / UBLKCP (TMA), global atomics' reads
    "shared_load",   # LDS, LDSM (ldmatrix)
    "store",         # STG, STS, STSM, RED, ATOM(S|G), UTMASTG
    "local",         # LDL / STL: register spills or local arrays
    "tensor",        # HMMA, IMMA, HGMMA, QGMMA, IGMMA, BMMA, DMMA
    "fp32",          # FFMA, FADD, FMUL, FMNMX, FSETP, FSEL, FSET, FCHK
    "fp16x2",        # HADD2, HFMA2, HMUL2, HMNMX2, HSETP2, HSET2
    "conversion",    # F2FP, F2F, I2F, F2I, I2I, I2FP, F2IP, FRND, PRMT
    "special",       # MUFU (exp2, rcp, ...)
    "integer",       # IMAD, IADD3, LEA, SHF, LOP3, ISETP, SEL, ... and uniform-datapath ops
    "move",          # MOV, S2R, S2UR, CS2R, LDC, ULDC, R2UR, UMOV, P2R, R2P
    "shuffle",       # SHFL, VOTE, MATCH, REDUX
    "control",       # BRA, BAR, BSSY, BSYNC, WARPSYNC, EXIT, DEPBAR, fences, NOP, ...
)

_BY_OPCODE = {
    **dict.fromkeys(("LDG", "LDGSTS", "UTMALDG", "UBLKCP", "UTMAPF", "LD"), "global_load"),
    **dict.fromkeys(("LDS", "LDSM", "ULDS"), "shared_load"),
    **dict.fromkeys(("STG", "STS", "STSM", "RED", "ATOM", "ATOMG", "ATOMS", "UTMASTG",
                     "UBLKRED", "UTMAREDG", "ST", "REDG", "REDAS"), "store"),
    **dict.fromkeys(("LDL", "STL"), "local"),
    **dict.fromkeys(("HMMA", "IMMA", "HGMMA", "QGMMA", "IGMMA", "BGMMA", "BMMA", "DMMA"),
                    "tensor"),
    **dict.fromkeys(("FFMA", "FADD", "FMUL", "FMNMX", "FSETP", "FSEL", "FSET", "FCHK", "FSWZADD",
                     "FFMA32I", "FADD32I", "FMUL32I"), "fp32"),
    **dict.fromkeys(("HADD2", "HFMA2", "HMUL2", "HMNMX2", "HSETP2", "HSET2", "HADD2_F32",
                     "HFMA2_MMA"), "fp16x2"),
    **dict.fromkeys(("F2FP", "F2F", "I2F", "F2I", "I2I", "I2FP", "F2IP", "FRND", "PRMT",
                     "UPRMT"), "conversion"),
    **dict.fromkeys(("MUFU",), "special"),
    **dict.fromkeys(("MOV", "S2R", "S2UR", "CS2R", "LDC", "ULDC", "R2UR", "UMOV", "P2R", "R2P",
                     "UP2UR", "UR2UP", "S2UR", "MOV32I", "ULDC", "LDCU"), "move"),
    **dict.fromkeys(("SHFL", "VOTE", "VOTEU", "MATCH", "REDUX", "UVOTE"), "shuffle"),
    **dict.fromkeys(("BRA", "BRX", "JMP", "JMX", "CALL", "RET", "EXIT", "BAR", "BSSY", "BSYNC",
                     "BREAK", "BPT", "WARPSYNC", "NOP", "DEPBAR", "LDGDEPBAR", "MEMBAR",
                     "FENCE", "ERRBAR", "CCTL", "CCTLL", "YIELD", "SYNCS", "ARRIVES", "ELECT",
                     "KILL", "NANOSLEEP", "ACQBULK", "WARPGROUP", "USETMAXREG", "UCGABAR_ARV",
                     "UCGABAR_WAIT", "BMOV", "RPCMOV", "PMTRIG", "CGAERRBAR", "ACQSHMINIT"),
                    "control"),
}


# Predicates that are never true: such an instruction takes an issue slot and does nothing
# (e.g. the `@!PT LDS RZ, [RZ]` padding that follows cp.async).
NEVER_EXECUTED = ("!PT", "!UPT")


def instruction_class(instruction: Instruction) -> str:
    """The class of one instruction; anything unknown counts as integer/address work."""
    opcode = instruction.opcode
    if instruction.predicate in NEVER_EXECUTED:
        return "control"  # a no-op issue slot
    if opcode == "HADD2" and "F32" in instruction.modifiers:
        return "fp16x2"  # f16 -> f32 widening add; same pipe, kept with its family
    return _BY_OPCODE.get(opcode, "integer")


# ---- pipes -----------------------------------------------------------------------------------
# Warp-instructions per clock per SM that each pipe sustains (docs/perf/h200-model.md).
PIPES = ("issue", "fma", "imad", "alu", "conversion", "special", "shuffle", "lsu", "tensor")


def is_uniform(instruction: Instruction) -> bool:
    """Uniform-datapath instructions (one per warp, not per lane)."""
    return instruction.opcode.startswith("U") and instruction.opcode not in (
        "UTMALDG", "UBLKCP", "UTMASTG", "UTMAPF", "UBLKRED", "UTMAREDG")


def pipe_of(instruction: Instruction) -> str | None:
    """The throughput-limiting pipe besides issue, or None (issue slot only)."""
    cls = instruction_class(instruction)
    if is_uniform(instruction) or instruction.predicate in NEVER_EXECUTED:
        return None
    opcode = instruction.opcode
    if cls in ("fp32",):
        return "alu" if opcode in ("FMNMX", "FSETP", "FSEL", "FSET", "FCHK") else "fma"
    if cls == "fp16x2":
        return "fma"
    if cls == "integer":
        # IMAD (and its MOV/IADD/SHL forms) runs on the FMA-heavy half only: the model
        # charges it to "imad" (half rate) and to "fma" (the datapath it shares)
        return "imad" if opcode in ("IMAD", "IMUL", "IDP", "IMADSP") else "alu"
    if cls == "conversion":
        return "alu" if opcode in ("PRMT", "F2FP") else "conversion"
    if cls == "special":
        return "special"
    if cls == "shuffle":
        return "shuffle"
    if cls in ("global_load", "shared_load", "store", "local"):
        return "lsu"
    if cls == "tensor":
        return "tensor"
    if cls == "move":
        return "alu" if opcode in ("MOV", "CS2R", "P2R", "R2P") else None
    return None


# ---- memory widths ---------------------------------------------------------------------------
def access_bytes(instruction: Instruction) -> int:
    """Bytes one thread moves with a load/store (LDG.E.128 -> 16); 4 when unmarked."""
    for modifier in instruction.modifiers:
        if modifier in ("128", "64", "32", "16", "8", "U8", "S8", "U16", "S16"):
            return {"128": 16, "64": 8, "32": 4, "16": 2, "8": 1, "U8": 1, "S8": 1,
                    "U16": 2, "S16": 2}[modifier]
    if instruction.opcode == "LDSM":
        # ldmatrix .x1/.x2/.x4: 8x8 16-bit matrices; per thread 4 bytes per matrix
        for modifier in instruction.modifiers:
            if modifier in ("M88", "MT88"):
                continue
            if modifier in ("2", "4"):
                return 4 * int(modifier)
        return 4
    return 4


def tensor_fmas(instruction: Instruction) -> int:
    """Multiply-adds one warp-level tensor instruction performs (HMMA.16816 -> 2048)."""
    for modifier in instruction.modifiers:
        if modifier.isdigit() and len(modifier) in (3, 4, 5):
            digits = modifier
            if digits == "16816":
                return 16 * 8 * 16
            if digits == "1688":
                return 16 * 8 * 8
            if digits == "16832":
                return 16 * 8 * 32
            if digits == "884":
                return 8 * 8 * 4
    if instruction.opcode in ("HGMMA", "QGMMA", "IGMMA", "BGMMA"):
        # HGMMA.64xNx16: shape in the first modifier, e.g. 64x128x16
        for modifier in instruction.modifiers:
            parts = modifier.split("x")
            if len(parts) == 3 and all(p.isdigit() for p in parts):
                return int(parts[0]) * int(parts[1]) * int(parts[2]) // 4  # per warp of 4
    return 16 * 8 * 16


# ---- wgmma operands --------------------------------------------------------------------------
def wgmma_operand_bytes(instruction: Instruction) -> tuple[int, int]:
    """(A bytes read from shared memory, B bytes) of one warpgroup-wide wgmma (HGMMA.64xNxK):
    A is 64 x K (0 when A comes from registers: the RS form names a register first), B is
    N x K; K elements of 2 bytes for HGMMA (k16), 1 byte for QGMMA/IGMMA (k32)."""
    if instruction.opcode not in ("HGMMA", "QGMMA", "IGMMA", "BGMMA"):
        return 0, 0
    shape = None
    for modifier in instruction.modifiers:
        parts = modifier.split("x")
        if len(parts) == 3 and all(p.isdigit() for p in parts):
            shape = tuple(int(p) for p in parts)
    if shape is None:
        return 0, 0
    m, n, k = shape
    element = 2 if instruction.opcode == "HGMMA" else 1
    if instruction.opcode == "BGMMA":
        element = 1 / 8
    operands = [o.strip() for o in instruction.operands.split(",")]
    a_from_shared = len(operands) > 1 and operands[1].startswith("gdesc")
    return (int(m * k * element) if a_from_shared else 0), int(n * k * element)
