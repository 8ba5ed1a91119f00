"""The steady-state path of a loop: which instructions one iteration issues.

A loop body is a DAG once its back edges are removed and its nested loops are collapsed into
single nodes. The counted iteration is the cheapest path from the header to a latch that

  1. passes through every block (and nested loop) holding shared-memory loads or tensor-core
     instructions: the work the loop exists for; and
  2. requests at least as many bytes of global memory (loads, cp.async, TMA, global stores,
     per thread) as one iteration must move to or from DRAM according to the problem formula
     (when no path can, the path that requests the most); and, where the formula also names
     the bytes an iteration must write, at least that many of them in global stores (a
     loop-free kernel's early exit may load as many bytes of metadata as its stores would
     have written: an append kernel's page-table search met the demand of a 4-bit store
     without storing anything).

So rare fix-ups (the online-softmax rescale when a new maximum appears, error paths) and the
alternative versions a compiler makes of a loop (unrolled body vs. remainder) are not summed
together; the path does what an iteration of the problem must do, and no more. When the
required blocks cannot lie on one path every block is counted (pessimistic) and the report
says so. A nested loop counts its own steady path times its trip count; its path requests as
much global traffic as one path through it can.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .cfg import Block, Loop
from .classify import NEVER_EXECUTED, access_bytes, instruction_class
from .sass import Function

_WORK_CLASSES = {"shared_load", "tensor"}
_MOST = float("inf")  # traffic demand meaning "as much as one path can request"
_GLOBAL_TRAFFIC = {"LDG", "LDGSTS", "STG", "RED", "ATOM", "ATOMG", "REDG", "UTMALDG",
                   "UTMASTG", "UBLKCP", "LD", "ST"}
_GLOBAL_STORES = {"STG", "RED", "ATOM", "ATOMG", "REDG", "UTMASTG", "ST"}


@dataclass
class Region:
    """A loop body, or the loop-free part of a whole function."""
    blocks: set[int]
    entry: int
    targets: set[int]  # blocks the path may end in
    children: list[Loop]


@dataclass
class Steady:
    weights: dict[int, float]  # block -> executions per iteration of the region
    covering: bool  # False: the required blocks were not on one path; every block counted
    traffic: float  # global bytes requested per thread along the path
    met_traffic: bool
    stores: float = 0.0  # of which global stores


# A bulk/tensor copy (TMA) moves a whole tile whose size lives in the tensor map, not in the
# instruction: it counts as meeting any per-thread demand.
_BULK = {"UTMALDG", "UTMASTG", "UBLKCP", "UBLKRED", "UTMAREDG"}
BULK_TRAFFIC = 1 << 20


def _block_traffic(function: Function, block: Block, stores_only: bool = False) -> int:
    total = 0
    for i in function.instructions[block.start:block.end]:
        if i.predicate in NEVER_EXECUTED:
            continue
        if stores_only and i.opcode not in _GLOBAL_STORES:
            continue
        if i.opcode in _BULK:
            total += BULK_TRAFFIC
        elif i.opcode in _GLOBAL_TRAFFIC:
            total += access_bytes(i)
    return total


def _block_has_work(function: Function, block: Block) -> bool:
    return any(instruction_class(i) in _WORK_CLASSES
               for i in function.instructions[block.start:block.end])


def steady_weights(function: Function, blocks: list[Block], region: Region, child_trips,
                   traffic_per_thread: float = 0.0, stores_per_thread: float = 0.0) -> Steady:
    """child_trips(loop) -> trips of that nested loop per iteration of the region;
    traffic_per_thread: global bytes one thread must request per iteration (0: no demand);
    stores_per_thread: of those, the bytes it must store (0: no separate demand)."""
    node_of: dict[int, tuple] = {}
    child_steady: dict[int, Steady] = {}
    for n, child in enumerate(region.children):
        for b in child.blocks:
            node_of[b] = ("loop", n)
        # A nested loop's iteration does all the global traffic one path through it can.
        child_steady[n] = steady_weights(function, blocks, loop_region(child), child_trips,
                                         traffic_per_thread=_MOST)
    for b in region.blocks:
        node_of.setdefault(b, ("block", b))
    nodes = set(node_of.values())

    def size(b: int) -> int:
        return blocks[b].end - blocks[b].start

    def cost(node) -> float:
        kind, key = node
        if kind == "block":
            return float(size(key))
        return child_trips(region.children[key]) * sum(
            w * size(b) for b, w in child_steady[key].weights.items())

    def traffic(node) -> float:
        kind, key = node
        if kind == "block":
            return float(_block_traffic(function, blocks[key]))
        return child_trips(region.children[key]) * child_steady[key].traffic

    def stores(node) -> float:
        kind, key = node
        if kind == "block":
            return float(_block_traffic(function, blocks[key], stores_only=True))
        return child_trips(region.children[key]) * child_steady[key].stores

    def has_work(node) -> bool:
        kind, key = node
        if kind == "block":
            return _block_has_work(function, blocks[key])
        return any(_block_has_work(function, blocks[b]) for b in child_steady[key].weights)

    entry = node_of[region.entry]
    successors: dict[tuple, set] = {node: set() for node in nodes}
    for b in region.blocks:
        for s in blocks[b].successors:
            if s not in region.blocks or s == region.entry:
                continue  # leaves the region, or a back edge to the header
            if node_of[s] != node_of[b]:
                successors[node_of[b]].add(node_of[s])
    targets = {node_of[t] for t in region.targets if t in node_of}

    def weights_of(path_nodes) -> dict[int, float]:
        weights: dict[int, float] = {}
        for node in path_nodes:
            kind, key = node
            if kind == "block":
                weights[key] = weights.get(key, 0.0) + 1.0
            else:
                trips = child_trips(region.children[key])
                for b, w in child_steady[key].weights.items():
                    weights[b] = weights.get(b, 0.0) + trips * w
        return weights

    def everything() -> Steady:
        total = sum(traffic(node) for node in nodes)
        stored = sum(stores(node) for node in nodes)
        return Steady(weights_of(nodes), False, total,
                      total >= traffic_per_thread and stored >= stores_per_thread, stored)

    # Topological order (Kahn); a cycle left over means an irreducible region.
    indegree = {node: 0 for node in nodes}
    for node in nodes:
        for s in successors[node]:
            indegree[s] += 1
    order, ready = [], sorted((n for n in nodes if indegree[n] == 0), key=str)
    while ready:
        node = ready.pop()
        order.append(node)
        for s in sorted(successors[node], key=str):
            indegree[s] -= 1
            if indegree[s] == 0:
                ready.append(s)
    if len(order) != len(nodes) or entry not in order:
        return everything()
    position = {node: i for i, node in enumerate(order)}

    if traffic_per_thread == _MOST:
        traffic_per_thread = sum(traffic(node) for node in nodes)
    cap = math.ceil(traffic_per_thread) if traffic_per_thread > 0 else 0
    store_cap = math.ceil(stores_per_thread) if stores_per_thread > 0 else 0

    # States: (node, capped traffic, capped stores) -> (cost, previous state). Waypoints
    # (required nodes, in topological order) split the search into segments that must chain.
    required = sorted((n for n in nodes if n != entry and has_work(n)), key=lambda n: position[n])
    start = (entry, min(cap, int(traffic(entry))), min(store_cap, int(stores(entry))))
    previous: dict = {start: None}
    frontier = {start: cost(entry)}
    for stop in required + [None]:  # None: the last segment ends in any target (a latch)
        best = dict(frontier)
        sinks = {stop} if stop is not None else (targets or set(nodes))
        first = min(position[state[0]] for state in frontier)
        for node in order[first:]:
            if stop is not None and position[node] > position[stop]:
                break
            for state in [s for s in best if s[0] == node]:
                if stop is not None and node == stop:
                    continue  # this waypoint ends the segment
                for succ in sorted(successors[node], key=position.__getitem__):
                    if stop is not None and position[succ] > position[stop]:
                        continue
                    new_state = (succ, min(cap, state[1] + int(traffic(succ))),
                                 min(store_cap, state[2] + int(stores(succ))))
                    candidate = best[state] + cost(succ)
                    if new_state not in best or candidate < best[new_state]:
                        best[new_state] = candidate
                        previous[new_state] = state
        frontier = {state: c for state, c in best.items() if state[0] in sinks}
        if not frontier:
            return everything()

    # The cheapest path among those that meet both demands (or come nearest: stores first).
    final = max(frontier, key=lambda state: (state[2], state[1], -frontier[state]))
    path, state = [], final
    while state is not None:
        path.append(state[0])
        state = previous[state]
    path.reverse()
    total = sum(traffic(node) for node in path)
    stored = sum(stores(node) for node in path)
    return Steady(weights_of(path), True, total, final[1] >= cap and final[2] >= store_cap, stored)


def loop_region(loop: Loop) -> Region:
    return Region(blocks=set(loop.blocks), entry=loop.header, targets=set(loop.latches),
                  children=list(loop.children))


def function_region(function: Function, blocks: list[Block], roots: list[Loop]) -> Region:
    """The whole kernel as one iteration (kernels without a loop that streams from DRAM):
    from the entry to any EXIT, top-level loops collapsed."""
    reachable, stack = {0}, [0]
    while stack:
        for s in blocks[stack.pop()].successors:
            if s not in reachable:
                reachable.add(s)
                stack.append(s)
    exits = {b for b in reachable if function.instructions[blocks[b].end - 1].opcode == "EXIT"}
    children = [loop for loop in roots if loop.header in reachable]
    for loop in children:
        reachable |= loop.blocks
    return Region(blocks=reachable, entry=0, targets=exits, children=children)
