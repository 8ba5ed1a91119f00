"""Named problem formulas: from a kernel's template arguments and a problem shape, the launch
shape and the DRAM bytes the problem must move.

A manifest entry names one of these. Each returns a `Work`; the report divides `dram_bytes` by
`iterations` (main-loop iterations summed over all CTAs; CTAs when the kernel has no loop) to get
the DRAM bytes of one CTA's main-loop iteration. Bytes count what DRAM must deliver or take at
least once (compulsory traffic), never what L2 serves to a second reader.

To add a formula: write a function taking (args, problem) and decorate it with @formula("name");
document it in docs/perf/sass-report.md. Most new kernels fit an existing one (`streaming`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Callable

DTYPE_BYTES = {"fp8_e4m3": 1, "fp8_e5m2": 1, "bf16": 2, "fp16": 2, "float": 4,
               "fp32": 4, "int": 4}


@dataclass
class Work:
    threads: int                 # per CTA
    ctas: int                    # grid size for the problem
    dram_bytes: float            # compulsory DRAM traffic of the whole problem
    iterations: float            # main-loop iterations summed over CTAs (CTAs when loop-free)
    dynamic_smem: int = 0        # bytes per CTA, as the launch asks
    inner_trips: float | None = None  # per main iteration: trips of its heaviest nested loop
    bytes_formula: str = ""      # how dram_bytes was computed, for the report
    l2_only_bytes: float = 0.0   # traffic predicted to stay in L2 (written and read back within
                                 # the launch, never written to DRAM): not in dram_bytes
    other_child_trips: float = 1.0  # trips of every other nested loop
    stages_in_flight: int = 1    # TMA pipelines: iterations of loads in flight (tile bytes are
                                 # in the tensor map, not in the SASS)
    cta_costs: list[float] | None = None  # relative work of each CTA in launch order (blockIdx
                                 # x fastest), when CTAs differ (causal row tiles): the model
                                 # dispatches them greedily to the SMs' CTA slots (the tail)
    segments_per_cta: float | None = None  # persistent kernels: pipeline drains and refills per
                                 # CTA (stream-K segments); None: one fill per round of CTAs
    role_warp_fraction: float | None = None  # share of the warps that run the loop's off-path
                                 # global-traffic blocks every iteration (scale copies, a
                                 # producer); None: one warp
    whole_kernel: bool = False   # one pass through the kernel is the iteration (its loops are
                                 # searches or fix-ups, not the stream)
    notes: list[str] = field(default_factory=list)

    @property
    def bytes_per_iteration(self) -> float:
        return self.dram_bytes / self.iterations


FORMULAS: dict[str, Callable[[list[str], dict], Work]] = {}


def formula(name: str):
    def register(function):
        FORMULAS[name] = function
        return function
    return register


def ints(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"-?\d+", text)]


def dtype_bytes(name: str) -> int:
    try:
        return DTYPE_BYTES[name]
    except KeyError:
        raise ValueError(f"unknown element type '{name}' (known: {', '.join(DTYPE_BYTES)})")


def _pow2_ceil(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def _need(problem: dict, *keys: str) -> list:
    missing = [k for k in keys if k not in problem]
    if missing:
        raise ValueError(f"problem lacks {', '.join(missing)}")
    return [problem[k] for k in keys]


# ---- attention -------------------------------------------------------------------------------
@formula("paged_decode")
def paged_decode(args: list[str], problem: dict) -> Work:
    """decode_kernel<KvT, QT, HeadDim>: one CTA per (request, KV head), tiles of 8 KiB K + 8 KiB V.
    Mirrors decode_block_shape (src/attention/decode_plan.cpp) and DecodeTile/DecodeSharedStorage."""
    kv, q, head_dim = args[0], args[1], int(args[2])
    batch, context, kv_heads, group = _need(problem, "batch", "context", "kv_heads", "group")
    query_tokens = problem.get("query_tokens", 1)
    page_size = problem.get("page_size", 16)
    kv_b, q_b = dtype_bytes(kv), dtype_bytes(q)
    elements = 16 // kv_b
    lanes = head_dim // elements
    rows = query_tokens * group
    padded_rows = _pow2_ceil(rows)
    base = lanes * padded_rows
    token_groups = 1 if base >= 128 else 128 // base
    threads = base * token_groups
    tile_tokens = 8192 // (head_dim * kv_b)
    chunks = tile_tokens * lanes
    tile_bytes = 2 * chunks * 16
    merge_bytes = (128 * elements + 2 * 128) * 4
    smem = max(tile_bytes, merge_bytes) + 3 * 4 * tile_tokens
    ctas = batch * kv_heads
    tiles = math.ceil(context / tile_tokens)
    kv_bytes = batch * kv_heads * context * head_dim * kv_b * 2
    qo_bytes = batch * query_tokens * kv_heads * group * head_dim * q_b * 2
    table_bytes = batch * math.ceil(context / page_size) * 4
    return Work(threads=threads, ctas=ctas, dram_bytes=kv_bytes + qo_bytes + table_bytes,
                iterations=ctas * tiles, dynamic_smem=smem,
                inner_trips=tile_tokens / token_groups,
                bytes_formula="K+V B·ctx·H_kv·D·bytes·2 + Q+O + page ids",
                notes=[f"{threads} threads, tile {tile_tokens} tokens, {token_groups} token group(s)"])


@formula("paged_attention")
def paged_attention(args: list[str], problem: dict) -> Work:
    """paged_attention_kernel<KvT, QT, HeadDim>: the tensor-core kernel, 128 threads, one CTA
    per (request x row tile x KV split, KV head); 3 cp.async stages of ~32 KiB K + V.
    Mirrors PagedAttentionTile / PagedAttentionSharedStorage (kernels/paged_attention_kernel.cuh)
    and the plan (src/attention/paged_attention_plan.cpp): warps_m = 1 / 2 / 4 for <= 16 / 32 /
    more packed rows (query tokens x group); the 4 / warps_m warps split a stage's 4 sub-blocks."""
    kv, q, head_dim = args[0], args[1], int(args[2])
    batch, context, kv_heads, group = _need(problem, "batch", "context", "kv_heads", "group")
    query_tokens = problem.get("query_tokens", 1)
    page_size = problem.get("page_size", 16)
    splits = problem.get("splits", 1)
    kv_b, q_b = dtype_bytes(kv), dtype_bytes(q)
    row_bytes = head_dim * kv_b
    stage_tokens = 64 if 32768 // (2 * row_bytes) < 128 else 128  # PagedAttentionTile::stage_tokens
    rows = query_tokens * group
    warps_m = 1 if rows <= 16 else (2 if rows <= 32 else 4)
    row_tiles = math.ceil(rows / (16 * warps_m))
    stage = 2 * stage_tokens * row_bytes + 3 * 4 * stage_tokens
    stage = (stage + 127) // 128 * 128
    epilogue = 64 * head_dim * 4 + 2 * 64 * 4
    smem = max(3 * stage, epilogue)
    ctas = batch * row_tiles * splits * kv_heads
    tiles = math.ceil(context / splits / stage_tokens)
    kv_bytes = batch * kv_heads * context * head_dim * kv_b * 2 * row_tiles
    qo_bytes = batch * query_tokens * kv_heads * group * head_dim * q_b * 2
    table_bytes = batch * math.ceil(context / page_size) * 4 * row_tiles
    if problem.get("causal", False):
        # Prefill: the query tokens are the request's last ones; row tile r (16 warps_m
        # packed rows) reads K/V up to its last token. Every row tile of a request reads the
        # same K/V: DRAM delivers it once, L2 (50 MiB) serves the re-reads, so K/V counts once.
        cta_rows = 16 * warps_m
        stage_trips = 0
        for r in range(row_tiles):
            last_token = min(query_tokens - 1, (cta_rows * (r + 1) - 1) // group)
            visible = context - query_tokens + last_token + 1
            stage_trips += math.ceil(visible / stage_tokens)
        kv_once = batch * kv_heads * context * head_dim * kv_b * 2
        return Work(threads=128, ctas=ctas, dram_bytes=kv_once + qo_bytes + table_bytes // row_tiles,
                    iterations=batch * kv_heads * stage_trips, dynamic_smem=smem, inner_trips=warps_m,
                    bytes_formula="K+V B·ctx·H_kv·D·bytes·2 once (L2 serves the row tiles) + Q+O",
                    notes=[f"causal prefill, warps {warps_m}x{4 // warps_m}, stage {stage_tokens} tokens, "
                           f"{row_tiles} row tiles, {stage_trips} stage trips per (request, KV head)"])
    return Work(threads=128, ctas=ctas, dram_bytes=kv_bytes + qo_bytes + table_bytes,
                iterations=ctas * tiles, dynamic_smem=smem, inner_trips=warps_m,
                bytes_formula="K+V B·ctx·H_kv·D·bytes·2·row tiles + Q+O + page ids",
                notes=[f"warps {warps_m}x{4 // warps_m}, stage {stage_tokens} tokens, "
                       f"{row_tiles} row tile(s)"])


@formula("paged_prefill_wgmma")
def paged_prefill_wgmma(args: list[str], problem: dict) -> Work:
    """paged_prefill_wgmma_kernel<KvT, QT, HeadDim>: the wgmma prefill kernel, 128 threads (one
    warpgroup) per 64 packed rows, one CTA per (request x row tile x KV split, KV head); 3
    cp.async stages of 64 tokens. Mirrors PagedWgmmaTile (kernels/paged_prefill_wgmma_kernel.cuh):
    16-bit caches stage the swizzled MMA tiles, FP8 caches raw stages plus one converted fp16
    tile pair. Causal prefill counts K/V once (L2 serves the row tiles' re-reads), as
    `paged_attention`."""
    kv, q, head_dim = args[0], args[1], int(args[2])
    batch, context, kv_heads, group = _need(problem, "batch", "context", "kv_heads", "group")
    query_tokens = problem.get("query_tokens", 1)
    page_size = problem.get("page_size", 16)
    kv_b, q_b = dtype_bytes(kv), dtype_bytes(q)
    stage_tokens, cta_rows, stages = 64, 64, 3
    tile = stage_tokens * head_dim * 2  # one K or V tile in the 16-bit mma type
    if kv_b == 1:
        smem = 2 * tile + stages * 2 * stage_tokens * head_dim + stages * stage_tokens * 4
    else:
        smem = stages * 2 * tile + stages * stage_tokens * 4
    rows = query_tokens * group
    row_tiles = math.ceil(rows / cta_rows)
    ctas = batch * row_tiles * kv_heads
    qo_bytes = batch * query_tokens * kv_heads * group * head_dim * q_b * 2
    kv_once = batch * kv_heads * context * head_dim * kv_b * 2
    stage_trips = 0
    tile_trips = []
    for r in range(row_tiles):
        last_token = min(query_tokens - 1, (cta_rows * (r + 1) - 1) // group)
        visible = (context - query_tokens + last_token + 1) if problem.get("causal", False) else context
        tile_trips.append(math.ceil(visible / stage_tokens))
        stage_trips += tile_trips[-1]
    table_bytes = batch * math.ceil(context / page_size) * 4
    # launch order: blockIdx.x = (request, row tile) in the plan's order (row tiles ascending:
    # the longest causal tiles last), blockIdx.y = KV head
    costs = [float(t) for _ in range(kv_heads) for _ in range(batch) for t in tile_trips]
    return Work(threads=128, ctas=ctas, dram_bytes=kv_once + qo_bytes + table_bytes,
                iterations=batch * kv_heads * stage_trips, dynamic_smem=smem, cta_costs=costs,
                bytes_formula="K+V B·ctx·H_kv·D·bytes·2 once (L2 serves the row tiles) + Q+O",
                notes=[f"wgmma, 64 rows per CTA, stage {stage_tokens} tokens, {row_tiles} row tiles, "
                       f"{stage_trips} stage trips per (request, KV head)"])


@formula("kv_append")
def kv_append(args: list[str], problem: dict) -> Work:
    """append_kernel<KvT, InT, HeadDim>: one CTA per (token, head block), 128 threads, no loop."""
    kv, src, head_dim = args[0], args[1], int(args[2])
    tokens, kv_heads = _need(problem, "tokens", "kv_heads")
    threads = 128
    # A head vector's lanes: head_dim / 8 rounded up to a power of two (kernels/kv_store.cuh).
    lanes = 1 << max(0, (head_dim // 8 - 1).bit_length())
    heads_per_block = threads // lanes
    ctas = tokens * math.ceil(kv_heads / heads_per_block)
    in_bytes = tokens * kv_heads * head_dim * dtype_bytes(src) * 2
    out_bytes = tokens * kv_heads * head_dim * dtype_bytes(kv) * 2
    return Work(threads=threads, ctas=ctas, dram_bytes=in_bytes + out_bytes, iterations=ctas,
                bytes_formula="K,V in (T·H·D·in) + K,V out (T·H·D·kv)", whole_kernel=True)


@formula("merge_states")
def merge_states(args: list[str], problem: dict) -> Work:
    """merge_states_kernel<OutT>: one CTA per (request, row), head_dim threads, loop over splits."""
    out = args[0]
    batch, rows, head_dim, splits = _need(problem, "batch", "rows", "head_dim", "splits")
    ctas = batch * rows
    partial = ctas * splits * (head_dim * 4 + 4)
    output = ctas * head_dim * dtype_bytes(out)
    return Work(threads=head_dim, ctas=ctas, dram_bytes=partial + output, iterations=ctas,
                whole_kernel=True, inner_trips=splits, other_child_trips=splits,
                bytes_formula="partials B·rows·splits·(D·4 + 4) + out B·rows·D·out")


@formula("dequantize_pages")
def dequantize_pages(args: list[str], problem: dict) -> Work:
    """dequantize_pages_kernel<KvT, HeadDim>: one CTA per (page, K or V), 128 threads striding
    over the page's 16-byte vectors, BF16 out."""
    kv, head_dim = args[0], int(args[1])
    pages, page_size, kv_heads = _need(problem, "pages", "page_size", "kv_heads")
    kv_b = dtype_bytes(kv)
    vectors = page_size * kv_heads * head_dim * kv_b // 16
    ctas = pages * 2
    elements = ctas * page_size * kv_heads * head_dim
    return Work(threads=128, ctas=ctas, dram_bytes=elements * (kv_b + 2),
                iterations=ctas * math.ceil(vectors / 128),
                bytes_formula="pages·2·P·H·D·(kv + 2)")


# ---- KV tags ---------------------------------------------------------------------------------
@formula("tag_check")
def tag_check(args: list[str], problem: dict) -> Work:
    """check_page_tags_kernel<BlockThreads, Rows>: one CTA per request, one thread per page-table
    entry (entries BlockThreads apart share a thread). Each entry's DevicePageTag (tag + write
    owner, 8 bytes) is gathered at random: each costs a 32-byte DRAM sector."""
    threads = int(args[0])
    batch, pages = _need(problem, "batch", "pages_per_request")
    entries = batch * pages
    table = entries * (4 + 4)           # page id + expected tag, streamed
    gathered = entries * 32             # one sector per (tag, writer) word
    per_request = 4 * 4 + 8             # indptr, last_page_len, writer, append_indptr; status
    return Work(threads=threads, ctas=batch, dram_bytes=table + gathered + batch * per_request,
                dynamic_smem=4, iterations=batch, inner_trips=math.ceil(pages / threads),
                bytes_formula="entries·(4 + 4) + entries·32 (tag sector) + per request 24")


@formula("tag_scatter")
def tag_scatter(args: list[str], problem: dict) -> Work:
    """scatter_page_tags_kernel<Threads>: one thread per changed entry (grid-stride)."""
    threads = int(args[0])
    updates = _need(problem, "updates")[0]
    ctas = math.ceil(updates / threads)
    return Work(threads=threads, ctas=ctas, dram_bytes=updates * (12 + 32),
                iterations=ctas, bytes_formula="updates·(12 read + 32 sector written)")


# ---- INT4 ------------------------------------------------------------------------------------
def _choose_split(tiles: int, sm_count: int, k_steps: int, m: int, k: int) -> int:
    """Mirror of choose_split in cuda/int4/gemm.cu (partials within 2% of the weight bytes)."""
    most = max(1, min(16, min(16, k_steps // 2, k // (800 * m))))
    best, best_cost = 1, float("inf")
    for s in range(1, most + 1):
        waves = (tiles * s + sm_count - 1) // sm_count
        cost = waves / s
        if cost <= best_cost * (1.0 + 1e-9):
            best_cost, best = cost, s
    return best


def _w4a16_stage_bytes(args: list[str]) -> tuple[list[int], int]:
    """GemmSharedStorage<Config, Span>::Stage: A [BM, 64], B [4, BN/16, 32] words, scale and
    zero rows (64 / span of them); 128-byte aligned. Returns the tile ints and the stage bytes."""
    tile = ints(args[1])
    span = ints(args[2])[0] if len(args) > 2 and ints(args[2]) else 64
    block_m, block_n = tile[0], tile[1]
    rows = 64 // span
    stage = block_m * 64 * 2 + 4 * (block_n // 16) * 32 * 4 + 2 * rows * block_n * 2
    return tile, -(-stage // 128) * 128


def _w4a16_group_steps(args: list[str], k: int, group: int) -> int:
    """64-row steps per trip of the mainloop's group loop: kernels with GroupSpan 64 (groups of
    64 rows or more, per-channel) loop over groups, the group's first stage (with the group's
    scale work) in the group loop, its other stages in a nested loop (w4a16_mainloop);
    GroupSpan 16/32 kernels loop over single steps (1)."""
    span = ints(args[2])[0] if len(args) > 2 and ints(args[2]) else 64
    if span < 64:
        return 1
    return max(1, min(group, k) // 64)


def _w4a16_bytes(m: int, n: int, k: int, group: int, zeros: bool) -> tuple[int, str]:
    weights = n * k // 2
    scales = n * (k // group) * 2 * (2 if zeros else 1)
    return weights + scales + m * k * 2 + m * n * 2, "W n·k/2 + scales (+zeros) + A m·k·2 + C m·n·2"


@formula("w4a16_gemm")
def w4a16_gemm(args: list[str], problem: dict) -> Work:
    """w4a16_gemm_kernel<T, GemmTileConfig<BM, BN, WM, WN, Stages, EvictFirst>, GroupSpan>
    (split-K schedule): one CTA per (BM x BN tile, K split); main loop = one 64-row K step, or
    with GroupSpan 64 one group (its other steps a nested loop, _w4a16_group_steps).
    Mirrors GemmSharedStorage and choose_split."""
    tile, stage_bytes = _w4a16_stage_bytes(args)
    block_m, block_n, warps_m, warps_n, stages = tile[:5]
    m, n, k, group = _need(problem, "m", "n", "k", "group")
    zeros = bool(problem.get("zeros", False))
    sms = int(problem.get("sms", 132))
    tiles = math.ceil(n / block_n) * math.ceil(m / block_m)
    k_steps = math.ceil(k / 64)
    splits = _choose_split(tiles, sms, k_steps, m, k)
    compulsory, text = _w4a16_bytes(m, n, k, group, zeros)
    partials = 2 * splits * m * n * 4 if splits > 1 else 0
    group_steps = _w4a16_group_steps(args, k, group)
    return Work(threads=warps_m * warps_n * 32, ctas=tiles * splits,
                dram_bytes=compulsory + partials,
                iterations=tiles * k_steps / group_steps, inner_trips=group_steps - 1,
                dynamic_smem=stage_bytes * stages,
                bytes_formula=text + " + split-K partials",
                notes=[f"split-K {splits}"])


def _stream_k_segments(tiles: int, k_steps: int, blocks: int, shared_only: bool = True) -> int:
    """Segments of tiles that several CTAs share, or (shared_only=False) of all tiles: the
    trips of the persistent loop, summed over CTAs (mirror of StreamKSchedule: the first
    units % blocks CTAs take one unit more)."""
    return _stream_k_tiles(tiles, k_steps, blocks, shared_only)[0]


def _stream_k_tiles(tiles: int, k_steps: int, blocks: int,
                    shared_only: bool = True) -> tuple[int, int]:
    """(segments, tiles) over the tiles several CTAs share (or all tiles)."""
    units = tiles * k_steps
    q, r = divmod(units, blocks)
    long_units = r * (q + 1)

    def block_of(unit: int) -> int:
        return unit // (q + 1) if unit < long_units else r + (unit - long_units) // q

    segments = counted = 0
    for t in range(tiles):
        first, last = block_of(t * k_steps), block_of((t + 1) * k_steps - 1)
        if first != last or not shared_only:
            segments += last - first + 1
            counted += 1
    return segments, counted


@formula("w4a16_stream_k")
def w4a16_stream_k(args: list[str], problem: dict) -> Work:
    """w4a16_gemm_stream_k_kernel<T, Config, GroupSpan>: `sms` persistent CTAs share the
    tiles x 64-row steps; the main loop is the persistent loop over a CTA's tile segments,
    its nested loop the 64-row K steps (inner_trips = steps per segment, on average), or with
    GroupSpan 64 the groups (and theirs the group's other steps, _w4a16_group_steps).
    Partials: a shared tile is reduced in place by the last CTA to finish it, so every other
    segment of it is written once and read once: 2 x (segments - shared tiles) x min(m, BM) x
    BN FP32; the wide tile (warp_m 32) stores every segment, 2 x segments x ... (mirrors
    StreamKSchedule and reduce_shared_tile in gemm_kernel.cuh).
    Where they go: the decode tile's slots are stored with an L2 evict-last policy while the
    weights stream evict-first, and the reducer discards their lines (discard.global.L2) once
    summed (the wide tile, issue-bound, keeps plain stores: its partials count as DRAM), so
    while the stored bytes fit in `l2_resident_bytes` (default half of H200's 50 MB L2) the
    partials are predicted to stay in L2 and never reach DRAM: they are counted in
    `l2_only_bytes`, not `dram_bytes`. A PREDICTION, to confirm with a DRAM byte counter on a
    GPU; `partials_in_l2 = false` in the problem counts them as DRAM traffic instead."""
    tile, stage_bytes = _w4a16_stage_bytes(args)
    block_m, block_n, warps_m, warps_n, stages = tile[:5]
    m, n, k, group = _need(problem, "m", "n", "k", "group")
    zeros = bool(problem.get("zeros", False))
    sms = int(problem.get("sms", 132))
    tiles = math.ceil(n / block_n) * math.ceil(m / block_m)
    k_steps = math.ceil(k / 64)
    units = tiles * k_steps
    blocks = min(sms, units)
    segments, shared_tiles = _stream_k_tiles(tiles, k_steps, blocks)
    # the decode tile (one 16-row A tile per warp) reduces from registers: the reducer's own
    # segment is never stored; the wide tile stores every segment and its reducer reads all
    from_registers = block_m // warps_m == 16
    stored = segments - shared_tiles if from_registers else segments
    stored_bytes = stored * min(m, block_m) * block_n * 4
    partials = 2 * stored_bytes
    # only the decode tile's slots are stored evict-last and discarded (reduce_shared_tile)
    in_l2 = (from_registers and bool(problem.get("partials_in_l2", True))
             and stored_bytes <= int(problem.get("l2_resident_bytes", 25 * 2**20)))
    dram_partials, l2_partials = (0, partials) if in_l2 else (partials, 0)
    compulsory, text = _w4a16_bytes(m, n, k, group, zeros)
    trips = _stream_k_segments(tiles, k_steps, blocks, shared_only=False)
    # per segment: its groups (the group loop), each with group_steps - 1 nested steps
    group_steps = _w4a16_group_steps(args, k, group)
    return Work(threads=warps_m * warps_n * 32, ctas=blocks,
                dram_bytes=compulsory + dram_partials, l2_only_bytes=l2_partials,
                iterations=trips, inner_trips=units / trips / group_steps,
                other_child_trips=group_steps - 1 if group_steps > 1 else 1.0, dynamic_smem=stage_bytes * stages,
                segments_per_cta=trips / blocks,
                bytes_formula=text + (" (shared tiles' FP32 partials, written + read, predicted to stay in L2:"
                                      " evict-last stores, discarded after the reduction)" if in_l2 else
                                      " + shared tiles' FP32 partials but the last CTA's (written + read)"),
                notes=[f"stream-K {blocks} CTAs, {shared_tiles} shared tiles in {segments} segments, "
                       f"partials {partials / (n * k / 2):.1%} of weights: "
                       f"L2 {l2_partials / (n * k / 2):.1%}, DRAM {dram_partials / (n * k / 2):.1%}"
                       + (" (predicted; unmeasured)" if in_l2 else "")])


@formula("moe_w4a16")
def moe_w4a16(args: list[str], problem: dict) -> Work:
    """moe_w4a16_kernel<T, Config, GroupSpan, Epilogue>: one CTA per (16-row tile of one
    expert, column tile); main loop = one 64-row K step. Decode routing: `hit` experts get
    tokens (expected distinct experts of T tokens x top_k of E, uniform), about one row tile
    each. Bytes: the hit experts' weights and scales, the gathered A, the output
    (gate_up: T·top_k·n/2 BF16; down: FP32 partials T·top_k·n)."""
    tile, stage_bytes = _w4a16_stage_bytes(args)
    block_m, block_n, warps_m, warps_n, stages = tile[:5]
    gate_up = args[-1].strip().endswith("0")  # (MoeEpilogue)0 = gate_up_silu
    tokens, top_k, experts, k, n, group = _need(problem, "tokens", "top_k", "experts", "k", "n",
                                                "group")
    pairs = tokens * top_k
    hit = experts * (1.0 - (1.0 - top_k / experts) ** tokens)
    row_tiles = max(hit, math.ceil(pairs / block_m))
    column_tiles = math.ceil((n // 2) / (block_n // 2)) if gate_up else math.ceil(n / block_n)
    k_steps = math.ceil(k / 64)
    weights = hit * (n * k // 2 + n * (k // group) * 2)
    a_bytes = (tokens if gate_up else pairs) * k * 2
    out = pairs * (n // 2) * 2 if gate_up else pairs * n * 4
    group_steps = _w4a16_group_steps(args, k, group)  # the shared mainloop's group loop
    return Work(threads=warps_m * warps_n * 32, ctas=math.ceil(row_tiles) * column_tiles,
                dram_bytes=weights + a_bytes + out,
                iterations=row_tiles * column_tiles * k_steps / group_steps,
                inner_trips=group_steps - 1, dynamic_smem=stage_bytes * stages,
                bytes_formula="hit experts' W + scales + gathered A + output",
                notes=[f"{hit:.0f} of {experts} experts hit, {row_tiles:.0f} row tiles"])


@formula("splitk_reduce")
def splitk_reduce(args: list[str], problem: dict) -> Work:
    """splitk_reduce_kernel<T>: grid-stride over m·n, summing `splits` FP32 partials."""
    m, n, splits = _need(problem, "m", "n", "splits")
    threads = 256
    count = m * n
    ctas = min(2048, math.ceil(count / threads))
    return Work(threads=threads, ctas=ctas, dram_bytes=count * (splits * 4 + 2),
                iterations=math.ceil(count / threads), inner_trips=splits,
                bytes_formula="m·n·(splits·4 + 2)")


@formula("int4_dequantize_dense")
def int4_dequantize_dense(args: list[str], problem: dict) -> Work:
    """dequantize_to_dense_kernel<T>: one thread per packed word (8 codes), grid-stride."""
    n, k, group = _need(problem, "n", "k", "group")
    words = k // 8 * n
    threads = 256
    return Work(threads=threads, ctas=min(math.ceil(words / threads), 4096),
                dram_bytes=words * 4 + n * (k // group) * 2 + k * n * 2,
                iterations=math.ceil(words / threads),
                bytes_formula="codes k·n/2 + scales + dense k·n·2")


# ---- generic ---------------------------------------------------------------------------------
@formula("streaming")
def streaming(args: list[str], problem: dict) -> Work:
    """Any kernel whose CTA-iteration moves threads x bytes_per_thread: problem gives
    threads, elements (thread-iterations in all) and bytes_per_element (read + written)."""
    threads, elements, per = _need(problem, "threads", "elements", "bytes_per_element")
    return Work(threads=threads, ctas=int(problem.get("ctas", math.ceil(elements / threads))),
                dram_bytes=elements * per, iterations=math.ceil(elements / threads),
                dynamic_smem=int(problem.get("smem", 0)),
                inner_trips=problem.get("inner_trips"),
                stages_in_flight=int(problem.get("stages", 1)),
                bytes_formula="elements·bytes_per_element")


@formula("explicit")
def explicit(args: list[str], problem: dict) -> Work:
    """Escape hatch for a kernel no formula fits yet: the launch shape and bytes given as
    numbers (threads, ctas, dram_bytes, iterations; optionally smem, inner_trips,
    other_child_trips, whole_kernel, stages). Write the arithmetic in a comment beside the
    entry, and prefer a named formula once a second kernel needs the same one."""
    threads, ctas, dram_bytes, iterations = _need(problem, "threads", "ctas", "dram_bytes",
                                                  "iterations")
    return Work(threads=int(threads), ctas=int(ctas), dram_bytes=float(dram_bytes),
                iterations=float(iterations), dynamic_smem=int(problem.get("smem", 0)),
                inner_trips=problem.get("inner_trips"),
                other_child_trips=float(problem.get("other_child_trips", 1.0)),
                whole_kernel=bool(problem.get("whole_kernel", False)),
                stages_in_flight=int(problem.get("stages", 1)),
                bytes_formula="given in the manifest")
