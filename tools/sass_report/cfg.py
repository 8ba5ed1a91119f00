"""Control-flow graph, natural loops and the choice of a kernel's steady-state main loop.

Method (documented in docs/perf/sass-report.md): basic blocks split at branch targets and
after control transfers; a back edge is an edge to a block that dominates its source; its
natural loop is the header plus every block that reaches the back edge without passing the
header. Loops sharing a header are merged. The main loop is the outermost loop whose body
(with nested loops) holds global loads (LDG, cp.async, TMA); among several, the one with the
most global-load instructions, then the largest. Nothing depends on addresses, so the choice
survives any rewrite that keeps "the loop that streams from DRAM" recognisable.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .classify import instruction_class
from .sass import Function, Instruction

_ENDS_BLOCK = {"BRA", "BRX", "JMP", "JMX", "EXIT", "RET", "KILL", "BREAK"}


@dataclass
class Block:
    index: int
    start: int  # first instruction index
    end: int  # one past the last
    successors: list[int] = field(default_factory=list)
    predecessors: list[int] = field(default_factory=list)


@dataclass
class Loop:
    header: int  # block index
    latches: list[int]
    blocks: set[int]
    children: list["Loop"] = field(default_factory=list)
    parent: "Loop | None" = None

    def own_blocks(self) -> set[int]:
        nested = set()
        for child in self.children:
            nested |= child.blocks
        return self.blocks - nested

    @property
    def depth(self) -> int:
        return 0 if self.parent is None else self.parent.depth + 1


def _unconditional(instruction: Instruction) -> bool:
    return instruction.predicate in (None, "PT", "UPT")


def build_blocks(function: Function) -> list[Block]:
    instructions = function.instructions
    leaders = {0}
    for label_index in function.labels.values():
        if label_index < len(instructions):
            leaders.add(label_index)
    for i, instruction in enumerate(instructions):
        if instruction.opcode in _ENDS_BLOCK or instruction.target is not None:
            if i + 1 < len(instructions):
                leaders.add(i + 1)
    starts = sorted(leaders)
    blocks = [Block(n, start, starts[n + 1] if n + 1 < len(starts) else len(instructions))
              for n, start in enumerate(starts)]
    block_at = {block.start: block.index for block in blocks}
    for block in blocks:
        last = instructions[block.end - 1]
        falls_through = True
        if last.opcode in ("BRA", "JMP", "BRX", "JMX") and _unconditional(last):
            falls_through = False
        if last.opcode in ("EXIT", "RET", "KILL") and _unconditional(last):
            falls_through = False
        if last.target is not None and last.opcode in ("BRA", "JMP"):
            target = function.labels.get(last.target)
            if target is not None and target in block_at:
                block.successors.append(block_at[target])
        if falls_through and block.index + 1 < len(blocks):
            block.successors.append(block.index + 1)
    for block in blocks:
        for successor in block.successors:
            blocks[successor].predecessors.append(block.index)
    return blocks


def dominators(blocks: list[Block]) -> dict[int, int]:
    """Immediate dominators of the blocks reachable from the entry (Cooper, Harvey, Kennedy:
    "A Simple, Fast Dominance Algorithm")."""
    order: list[int] = []
    seen = {0}
    stack = [(0, iter(blocks[0].successors))]
    while stack:  # iterative depth-first search for the postorder
        node, successors = stack[-1]
        advanced = False
        for s in successors:
            if s not in seen:
                seen.add(s)
                stack.append((s, iter(blocks[s].successors)))
                advanced = True
                break
        if not advanced:
            order.append(node)
            stack.pop()
    rpo = order[::-1]
    number = {b: i for i, b in enumerate(rpo)}
    idom = {0: 0}

    def intersect(a: int, b: int) -> int:
        while a != b:
            while number[a] > number[b]:
                a = idom[a]
            while number[b] > number[a]:
                b = idom[b]
        return a

    changed = True
    while changed:
        changed = False
        for b in rpo[1:]:
            preds = [p for p in blocks[b].predecessors if p in idom]
            if not preds:
                continue
            new = preds[0]
            for p in preds[1:]:
                new = intersect(p, new)
            if idom.get(b) != new:
                idom[b] = new
                changed = True
    return idom


def _dominates(idom: dict[int, int], a: int, b: int) -> bool:
    while True:
        if a == b:
            return True
        if b == 0 or b not in idom:
            return False
        b = idom[b]


def find_loops(blocks: list[Block]) -> list[Loop]:
    """Natural loops (merged per header), nested into a forest; returns the top-level loops.
    A back edge is an edge to a block that dominates its source; in code unreachable from the
    entry (device subroutines) an edge to an earlier address stands in for it."""
    idom = dominators(blocks)
    by_header: dict[int, Loop] = {}
    for block in blocks:
        for successor in block.successors:
            if block.index in idom:
                is_back = _dominates(idom, successor, block.index)
            else:
                is_back = blocks[successor].start <= block.start
            if is_back:
                body = {successor, block.index}
                stack = [block.index] if block.index != successor else []
                while stack:
                    node = stack.pop()
                    for predecessor in blocks[node].predecessors:
                        if predecessor not in body:
                            body.add(predecessor)
                            stack.append(predecessor)
                loop = by_header.get(successor)
                if loop is None:
                    by_header[successor] = Loop(successor, [block.index], body)
                else:
                    loop.latches.append(block.index)
                    loop.blocks |= body
    loops = sorted(by_header.values(), key=lambda loop: len(loop.blocks))
    roots: list[Loop] = []
    for i, loop in enumerate(loops):
        parent = next((outer for outer in loops[i + 1:]
                       if loop.blocks < outer.blocks or
                       (loop.blocks <= outer.blocks and outer.header != loop.header)), None)
        if parent is None:
            roots.append(loop)
        else:
            loop.parent = parent
            parent.children.append(loop)
    return roots


def all_loops(roots: list[Loop]) -> list[Loop]:
    out: list[Loop] = []
    stack = list(roots)
    while stack:
        loop = stack.pop()
        out.append(loop)
        stack.extend(loop.children)
    return out


def block_instructions(function: Function, blocks: list[Block], indices) -> list[Instruction]:
    out: list[Instruction] = []
    for index in sorted(indices):
        block = blocks[index]
        out.extend(function.instructions[block.start:block.end])
    return out


def global_loads(instructions: list[Instruction]) -> int:
    return sum(1 for i in instructions if instruction_class(i) == "global_load")


def choose_main_loop(function: Function, blocks: list[Block], roots: list[Loop]) -> Loop | None:
    """The outermost loop streaming from global memory (see the module docstring): among the
    loops with no loading ancestor, the one with the most global loads, then the largest."""
    candidates = []
    stack = list(roots)
    while stack:
        loop = stack.pop()
        loads = global_loads(block_instructions(function, blocks, loop.blocks))
        if loads:
            candidates.append((loads, len(loop.blocks), loop))
        else:
            stack.extend(loop.children)  # a loop without loads may hold one that streams
    if not candidates:
        return None
    candidates.sort(key=lambda c: (c[0], c[1]), reverse=True)
    return candidates[0][2]


def choose_tensor_loop(function: Function, blocks: list[Block], roots: list[Loop]) -> Loop | None:
    """The loop of a warp-specialized kernel's consumers: among the outermost loops that issue
    wgmma, the one with the most wgmma instructions, then the largest."""
    candidates = []
    stack = list(roots)
    while stack:
        loop = stack.pop()
        body = block_instructions(function, blocks, loop.blocks)
        mmas = sum(1 for i in body if i.opcode in ("HGMMA", "QGMMA", "IGMMA", "BGMMA"))
        if mmas:
            candidates.append((mmas, len(loop.blocks), loop))
        else:
            stack.extend(loop.children)
    if not candidates:
        return None
    candidates.sort(key=lambda c: (c[0], c[1]), reverse=True)
    return candidates[0][2]
