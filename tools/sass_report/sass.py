"""Parsing `nvdisasm -c -g` output into functions of instructions with source lines."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_FUNCTION = re.compile(r"^\s*\.text\.(\S+):\s*$")
_LABEL = re.compile(r"^\s*(\.L_x_\d+):\s*$")
_INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;\s*(?:/\*.*)?$")
_LINE = re.compile(r'^\s*//## File "([^"]+)", line (\d+)(?: inlined at "([^"]+)", line (\d+))?')
_PREDICATE = re.compile(r"^@(!?U?P[T0-9])\s+")
_LABEL_OPERAND = re.compile(r"`\((\.L_x_\d+)\)")


@dataclass
class Instruction:
    address: int
    predicate: str | None  # e.g. "!P0", None when unconditional
    opcode: str  # base opcode, e.g. "LDG"
    modifiers: tuple[str, ...]  # e.g. ("E", "128")
    operands: str
    target: str | None = None  # branch target label
    source: tuple[str, int] | None = None  # innermost (file, line)
    call_site: tuple[str, int] | None = None  # (file, line) the code was inlined at

    @property
    def full_opcode(self) -> str:
        return ".".join((self.opcode,) + self.modifiers)


@dataclass
class Function:
    name: str  # mangled
    instructions: list[Instruction] = field(default_factory=list)
    labels: dict[str, int] = field(default_factory=dict)  # label -> instruction index


def _parse_instruction(address: int, text: str) -> Instruction:
    predicate = None
    match = _PREDICATE.match(text)
    if match:
        predicate = match.group(1)
        text = text[match.end():]
    head, _, operands = text.partition(" ")
    parts = head.split(".")
    target_match = _LABEL_OPERAND.search(operands)
    return Instruction(address=address, predicate=predicate, opcode=parts[0],
                       modifiers=tuple(parts[1:]), operands=operands.strip(),
                       target=target_match.group(1) if target_match else None)


def parse_nvdisasm(text: str) -> dict[str, Function]:
    """Functions by mangled name. Line comments attach to the instructions that follow them."""
    functions: dict[str, Function] = {}
    current: Function | None = None
    source = call_site = None
    for line in text.splitlines():
        match = _FUNCTION.match(line)
        if match:
            current = functions.setdefault(match.group(1), Function(match.group(1)))
            source = call_site = None
            continue
        if current is None:
            continue
        match = _LINE.match(line)
        if match:
            source = (match.group(1), int(match.group(2)))
            call_site = (match.group(3), int(match.group(4))) if match.group(3) else None
            continue
        match = _LABEL.match(line)
        if match:
            current.labels[match.group(1)] = len(current.instructions)  # the next one
            continue
        match = _INSTRUCTION.match(line)
        if match:
            instruction = _parse_instruction(int(match.group(1), 16), match.group(2))
            instruction.source = source
            instruction.call_site = call_site
            current.instructions.append(instruction)
    return functions
