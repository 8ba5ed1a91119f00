"""Self-test of scripts/sass-report (tools/sass_report) on hand-written SASS: loop finding,
the steady-state path, classes, occupancy, manifest names and the budget messages.
Run: PYTHONPATH=tools python3 -m unittest tests/perf/sass_report_test.py"""

import tempfile
import unittest
from pathlib import Path

from sass_report import budget, cfg, manifest, model, steady
from sass_report.__main__ import compare
from sass_report.classify import instruction_class, tensor_fmas
from sass_report.formulas import Work, explicit, paged_decode, w4a16_gemm, w4a16_stream_k
from sass_report.sass import parse_nvdisasm

# A loop streaming 16 B per thread per iteration: an online-softmax-like rescale block that a
# steady iteration skips, and the shared-memory work it must do.
RESCALE_LOOP = """
.text._Z6kernelv:
        /*0000*/                   S2R R0, SR_TID.X ;
.L_x_0:
        /*0010*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0020*/                   FSETP.GT.AND P0, PT, R4, R5, PT ;
        /*0030*/              @!P0 BRA `(.L_x_1) ;
        /*0040*/                   MUFU.EX2 R6, R4 ;
        /*0050*/                   FMUL R7, R6, R7 ;
        /*0060*/                   FMUL R8, R6, R8 ;
.L_x_1:
        /*0070*/                   LDS.128 R8, [R9] ;
        /*0080*/                   FFMA R10, R8, R9, R10 ;
        /*0090*/                   ISETP.NE.AND P1, PT, R0, RZ, PT ;
        /*00a0*/               @P1 BRA `(.L_x_0) ;
        /*00b0*/                   EXIT ;
"""

# One loop body with two versions of a load: four 16-byte loads (unrolled) or one (remainder).
VERSIONED_LOADS = """
.text._Z6kernelv:
        /*0000*/                   S2R R0, SR_TID.X ;
.L_x_0:
        /*0010*/                   ISETP.GT.AND P0, PT, R0, 0x3, PT ;
        /*0020*/              @!P0 BRA `(.L_x_1) ;
        /*0030*/                   LDGSTS.E.BYPASS.128 [R1], desc[UR4][R2.64] ;
        /*0040*/                   LDGSTS.E.BYPASS.128 [R1+0x10], desc[UR4][R2.64+0x10] ;
        /*0050*/                   LDGSTS.E.BYPASS.128 [R1+0x20], desc[UR4][R2.64+0x20] ;
        /*0060*/                   LDGSTS.E.BYPASS.128 [R1+0x30], desc[UR4][R2.64+0x30] ;
        /*0070*/                   IADD3 R2, R2, 0x40, RZ ;
        /*0080*/                   BRA `(.L_x_2) ;
.L_x_1:
        /*0090*/                   LDGSTS.E.BYPASS.128 [R1], desc[UR4][R2.64] ;
.L_x_2:
        /*00a0*/                   DEPBAR.LE SB0, 0x2 ;
        /*00b0*/                   LDSM.16.M88.4 R4, [R5] ;
        /*00c0*/                   HMMA.16816.F32.BF16 R8, R4, R6, R8 ;
        /*00d0*/              @!PT LDS RZ, [RZ] ;
        /*00e0*/               @P1 BRA `(.L_x_0) ;
        /*00f0*/                   EXIT ;
"""


# A TMA + wgmma loop: one elected thread issues the bulk tensor copy, the warpgroup waits on the
# mbarrier (a spin loop of its own) and issues HGMMA.
TMA_LOOP = """
.text._Z6kernelv:
        /*0000*/                   S2R R0, SR_TID.X ;
.L_x_0:
        /*0010*/                   ELECT P0, URZ, PT ;
        /*0020*/              @!P0 BRA `(.L_x_1) ;
        /*0030*/                   UTMALDG.2D [UR8], [UR4] ;
.L_x_1:
        /*0040*/                   SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR6], R3 ;
        /*0050*/              @!P1 BRA `(.L_x_1) ;
        /*0060*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR12], R24 ;
        /*0070*/                   ISETP.NE.AND P2, PT, R0, RZ, PT ;
        /*0080*/               @P2 BRA `(.L_x_0) ;
        /*0090*/                   EXIT ;
"""


# A loop-free kernel with an early exit: its page-table search loads as many bytes as the
# store path writes, so the byte demand alone is met by a path that stores nothing.
EARLY_EXIT_STORE = """
.text._Z6kernelv:
        /*0000*/                   LDG.E.64 R2, desc[UR4][R2.64] ;
        /*0010*/                   LDG.E.64 R4, desc[UR4][R4.64] ;
        /*0020*/                   ISETP.GE.AND P0, PT, R2, RZ, PT ;
        /*0030*/              @!P0 EXIT ;
        /*0040*/                   MUFU.RCP R6, R4 ;
        /*0050*/                   FFMA R7, R6, R5, RZ ;
        /*0060*/                   FMUL R8, R7, R6 ;
        /*0070*/                   STG.E.64 desc[UR4][R2.64], R8 ;
        /*0080*/                   EXIT ;
"""


def analyse_text(text, traffic):
    function = next(iter(parse_nvdisasm(text).values()))
    blocks = cfg.build_blocks(function)
    roots = cfg.find_loops(blocks)
    main = cfg.choose_main_loop(function, blocks, roots)
    result = steady.steady_weights(function, blocks, steady.loop_region(main), lambda _: 1.0,
                                   traffic_per_thread=traffic)
    opcodes = [i.opcode for b in sorted(result.weights)
               for i in function.instructions[blocks[b].start:blocks[b].end]]
    return function, main, result, opcodes


class LoopsAndPaths(unittest.TestCase):
    def test_main_loop_and_rare_block_skipped(self):
        _, main, result, opcodes = analyse_text(RESCALE_LOOP, traffic=16)
        self.assertIsNotNone(main)
        self.assertTrue(result.covering)
        self.assertIn("LDS", opcodes)
        self.assertIn("LDG", opcodes)
        self.assertNotIn("MUFU", opcodes)  # the rescale is not the steady state
        self.assertEqual(len(opcodes), 7)

    def test_cheapest_version_that_moves_the_bytes(self):
        _, _, small, small_ops = analyse_text(VERSIONED_LOADS, traffic=16)
        self.assertEqual(small_ops.count("LDGSTS"), 1)  # the remainder version suffices
        _, _, big, big_ops = analyse_text(VERSIONED_LOADS, traffic=48)
        self.assertEqual(big_ops.count("LDGSTS"), 4)  # needs the unrolled version
        self.assertTrue(big.met_traffic)
        _, _, too_much, _ = analyse_text(VERSIONED_LOADS, traffic=1000)
        self.assertFalse(too_much.met_traffic)

    def test_loop_free_path_must_store_what_the_problem_writes(self):
        function = next(iter(parse_nvdisasm(EARLY_EXIT_STORE).values()))
        blocks = cfg.build_blocks(function)
        region = steady.function_region(function, blocks, cfg.find_loops(blocks))

        def opcodes(result):
            return [i.opcode for b in sorted(result.weights)
                    for i in function.instructions[blocks[b].start:blocks[b].end]]
        exit_only = steady.steady_weights(function, blocks, region, lambda _: 1.0, traffic_per_thread=16)
        self.assertNotIn("STG", opcodes(exit_only))  # 16 B of loads meet the total demand
        storing = steady.steady_weights(function, blocks, region, lambda _: 1.0,
                                        traffic_per_thread=16, stores_per_thread=8)
        self.assertIn("STG", opcodes(storing))
        self.assertIn("MUFU", opcodes(storing))
        self.assertTrue(storing.met_traffic)
        self.assertEqual(storing.stores, 8)
        too_much = steady.steady_weights(function, blocks, region, lambda _: 1.0,
                                         traffic_per_thread=16, stores_per_thread=64)
        self.assertFalse(too_much.met_traffic)

    def test_explicit_entries_name_their_stored_bytes(self):
        # An explicit entry's dram_store_bytes becomes the loop-free path's store demand (the
        # MLA append's record), and is 0 where the entry gives none.
        problem = {"threads": 64, "ctas": 64, "dram_bytes": 100352, "iterations": 64, "whole_kernel": True}
        self.assertEqual(explicit([], problem).store_bytes_per_iteration, 0.0)
        work = explicit([], dict(problem, dram_store_bytes=26624))
        self.assertEqual(work.store_bytes_per_iteration, 416.0)
        self.assertTrue(work.whole_kernel)

    def test_tma_loop(self):
        _, main, result, opcodes = analyse_text(TMA_LOOP, traffic=4096)
        self.assertEqual(len(main.children), 1)  # the mbarrier wait
        self.assertIn("UTMALDG", opcodes)  # a bulk copy meets any per-thread demand
        self.assertTrue(result.met_traffic)
        self.assertIn("HGMMA", opcodes)
        function = next(iter(parse_nvdisasm(TMA_LOOP).values()))
        work = Work(threads=128, ctas=132, dram_bytes=132 * 100 * 32768, iterations=132 * 100)
        row = model.analyse(function, None, work)
        # HGMMA 64x128x16 per warpgroup: 32768 multiply-adds per warp at 2048 per clock.
        self.assertAlmostEqual(row["tensor_cycles_per_16B"], 4 * 16 / (32768 / 16), places=3)
        self.assertGreaterEqual(row["bytes_in_flight_per_sm"], 32768)

    def test_classes(self):
        function = next(iter(parse_nvdisasm(VERSIONED_LOADS).values()))
        by_opcode = {i.opcode + (i.predicate or ""): instruction_class(i)
                     for i in function.instructions}
        self.assertEqual(by_opcode["LDGSTS"], "global_load")
        self.assertEqual(by_opcode["LDSM"], "shared_load")
        self.assertEqual(by_opcode["HMMA"], "tensor")
        self.assertEqual(by_opcode["LDS!PT"], "control")  # never executes

    def test_hgmma_forms_from_the_wgmma_wrappers(self):
        # What nvcc 13 emits for arch/wgmma.cuh (arch_wgmma_test_gpu): A from shared memory or
        # registers, transposed operands, scale-d as a uniform predicate, f16 without a suffix.
        text = """
.text._Z6kernelv:
        /*0000*/                   WARPGROUP.ARRIVE ;
        /*0010*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8].tnspA.tnspB, R24, UP0, gsb0 ;
        /*0020*/                   HGMMA.64x256x16.F32.BF16 R24, R4, gdesc[UR12].tnspB, R24, gsb0 ;
        /*0030*/                   HGMMA.64x128x16.F32 R24, gdesc[UR8], R24, gsb0 ;
        /*0040*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0050*/                   EXIT ;
"""
        function = next(iter(parse_nvdisasm(text).values()))
        gmma = [i for i in function.instructions if i.opcode == "HGMMA"]
        self.assertEqual([instruction_class(i) for i in gmma], ["tensor"] * 3)
        # Per warp: a quarter of the warpgroup's 64 x N x 16 multiply-adds.
        self.assertEqual([tensor_fmas(i) for i in gmma], [64 * 64 * 4, 64 * 256 * 4, 64 * 128 * 4])
        self.assertEqual([instruction_class(i) for i in function.instructions
                          if i.opcode == "WARPGROUP"], ["control", "control"])

    def test_pipeline_depth_from_depbar(self):
        function, main, result, _ = analyse_text(VERSIONED_LOADS, traffic=16)
        blocks = cfg.build_blocks(function)
        path = [i for b in result.weights for i in function.instructions[blocks[b].start:blocks[b].end]]
        self.assertEqual(model._pipeline_depth(function, path), 3)


class Analyse(unittest.TestCase):
    def test_row_of_a_streaming_loop(self):
        function = next(iter(parse_nvdisasm(RESCALE_LOOP).values()))
        work = Work(threads=128, ctas=1024, dram_bytes=1024 * 100 * 128 * 16,
                    iterations=1024 * 100)
        row = model.analyse(function, None, work)
        # 7 warp-instructions per warp-iteration; 4 warps; 128 threads x 16 B = 128 units.
        self.assertAlmostEqual(row["warp_instr_per_16B"], 4 * 7 / 128, places=3)
        self.assertAlmostEqual(row["instr_by_class"]["shared_load"], 4 / 128, places=3)
        self.assertEqual(row["spills"], 0)

    def test_occupancy(self):
        occ = model.occupancy(114, 128, 17152)
        self.assertEqual((occ.ctas_per_sm, occ.limiter), (4, "registers"))
        occ = model.occupancy(16, 512, 0)
        self.assertEqual((occ.ctas_per_sm, occ.limiter), (4, "warps"))
        occ = model.occupancy(32, 128, 100 * 1024)
        self.assertEqual((occ.ctas_per_sm, occ.limiter), (2, "shared memory"))

    def test_formulas_mirror_the_kernels(self):
        fp8 = paged_decode(["fp8_e4m3", "bf16", "128"],
                           {"batch": 64, "context": 32768, "kv_heads": 8, "group": 8})
        self.assertEqual((fp8.threads, fp8.dynamic_smem, fp8.inner_trips), (128, 17152, 32))
        gemm = w4a16_gemm(["bf16", "GemmTileConfig<16, 128, 1, 4, 4, true>", "(GroupSpan)64"],
                          {"m": 16, "n": 28672, "k": 8192, "group": 128})
        self.assertEqual((gemm.threads, gemm.dynamic_smem), (128, 26624))
        # group 16: four scale and zero rows per stage (GemmSharedStorage<Config, k16>)
        wide = w4a16_gemm(["fp16", "GemmTileConfig<64, 128, 2, 2, 4, false>", "(GroupSpan)16"],
                          {"m": 64, "n": 28672, "k": 8192, "group": 16})
        self.assertEqual((wide.threads, wide.dynamic_smem), (128, 57344))

    def test_stream_k_partials_in_l2(self):
        # Issue shape at m = 16: 130 stored 16 x 256 FP32 slots, written and read (4.26 MB).
        # The decode tile's slots are evict-last and discarded: L2-only, not DRAM bytes.
        decode = ["bf16", "GemmTileConfig<16, 256, 1, 4, 8, true>", "(GroupSpan)64"]
        shape = {"m": 16, "n": 28672, "k": 8192, "group": 128}
        compulsory = 28672 * 8192 // 2 + 28672 * 64 * 2 + 16 * 8192 * 2 + 16 * 28672 * 2
        in_l2 = w4a16_stream_k(decode, shape)
        self.assertEqual(in_l2.l2_only_bytes, 2 * 130 * 16 * 256 * 4)
        self.assertEqual(in_l2.dram_bytes, compulsory)
        to_dram = w4a16_stream_k(decode, dict(shape, partials_in_l2=False))
        self.assertEqual((to_dram.l2_only_bytes, to_dram.dram_bytes),
                         (0, compulsory + 2 * 130 * 16 * 256 * 4))
        too_big = w4a16_stream_k(decode, dict(shape, l2_resident_bytes=1 << 20))
        self.assertEqual(too_big.l2_only_bytes, 0)
        # The wide tile keeps plain stores: its partials are DRAM traffic.
        wide = w4a16_stream_k(["fp16", "GemmTileConfig<64, 128, 2, 2, 4, false>", "(GroupSpan)64"],
                              {"m": 64, "n": 28672, "k": 8192, "group": 128})
        self.assertEqual(wide.l2_only_bytes, 0)
        # Pipeline fills: the decode tile's one pipeline runs across its segments (one fill
        # per CTA, 8 stages of 11 KB: GemmSharedStorage); the wide tile refills per segment.
        self.assertEqual((in_l2.segments_per_cta, in_l2.dynamic_smem), (1.0, 8 * 11264))
        self.assertGreater(wide.segments_per_cta, 1.5)


class ManifestAndBudget(unittest.TestCase):
    def test_simplified_names(self):
        name = manifest.simplify(
            "void slimserve::v0_1::int4::w4a16_gemm_kernel<slimserve::v0_1::bf16, "
            "slimserve::v0_1::int4::GemmTileConfig<16, 128, 1, 4, 4> >"
            "(slimserve::v0_1::int4::GemmParams)")
        self.assertEqual(name, "w4a16_gemm_kernel<bf16, GemmTileConfig<16, 128, 1, 4, 4>>")
        self.assertEqual(manifest.template_args(name), ["bf16", "GemmTileConfig<16, 128, 1, 4, 4>"])

    def test_unknown_formula_is_an_error(self):
        with tempfile.TemporaryDirectory() as scratch:
            path = Path(scratch) / "m.toml"
            path.write_text('[[entry]]\nkernel = "k"\nformula = "nope"\nproblem = { label = "x" }\n')
            with self.assertRaises(manifest.ManifestError):
                manifest.load(path)

    def row(self, per16=2.0, spills=0, fraction=0.5, fp32=1.0):
        return {"key": "k<1> @ p", "warp_instr_per_16B": per16, "spills": spills,
                "predicted_copy_bw_fraction": fraction, "bound_by": "issue",
                "predicted_tensor_fraction": 0.0,
                "instr_by_class": {"fp32": fp32, "integer": 1.0}}

    def test_budget_passes_at_baseline_and_names_the_class_that_grew(self):
        budgets = {"k<1> @ p": budget.budget_for(self.row())}
        self.assertEqual(budget.check([self.row()], budgets), [])
        failures = budget.check([self.row(per16=2.5, fp32=1.5)], budgets)
        self.assertEqual(len(failures), 1)
        self.assertIn("k<1> @ p", failures[0])
        self.assertIn("fp32 1.00 -> 1.50", failures[0])
        self.assertNotIn("integer", failures[0])

    def test_spills_floor_and_vanished_rows_fail(self):
        budgets = {"k<1> @ p": budget.budget_for(self.row())}
        self.assertEqual(len(budget.check([self.row(spills=2)], budgets)), 1)
        self.assertEqual(len(budget.check([self.row(fraction=0.4)], budgets)), 1)
        gone = budget.check([], budgets)
        self.assertEqual(len(gone), 1)
        self.assertIn("renamed", gone[0])
        self.assertIn("no budget", budget.check([self.row()], {})[0])

    def test_compare_lists_moved_new_and_gone_rows(self):
        before = [self.row(), dict(self.row(), key="gone @ p")]
        after = [self.row(per16=3.0, fp32=2.0), dict(self.row(), key="new @ p")]
        table = compare(before, after)
        self.assertIn("| `k<1> @ p` | 2.00 | 3.00 |", table)
        self.assertIn("fp32 1.00 -> 2.00", table)
        self.assertIn("gone |", table)
        self.assertIn("new |", table)
        self.assertEqual(compare(after, after).count("\n"), 1)  # header only

    def test_lowering_a_floor_keeps_the_ceilings_and_says_why(self):
        b = budget.budget_for(self.row(fraction=0.9))
        lower = dict(self.row(fraction=0.55, per16=2.5), moved_by=["clock -20%"])
        self.assertTrue(budget.lower_floor(b, lower, "honest model"))
        self.assertEqual(b["min_predicted_copy_bw_fraction"], 0.55)
        self.assertEqual(b["max_warp_instr_per_16B"], 2.0)  # the ceiling stays: 2.5 still fails
        self.assertIn("was 0.9; moved by clock -20%", b["reason"])
        self.assertEqual(len(budget.check([dict(lower, key="k<1> @ p")], {"k<1> @ p": b})), 1)
        self.assertFalse(budget.lower_floor(b, self.row(fraction=0.7), "again"))  # never raises

    def test_tensor_floor_for_compute_heavy_rows(self):
        heavy = dict(self.row(fraction=0.05), predicted_tensor_fraction=0.45)
        b = budget.budget_for(heavy)
        self.assertEqual(b["min_predicted_tensor_fraction"], 0.45)
        self.assertEqual(budget.check([heavy], {"k<1> @ p": b}), [])
        worse = dict(heavy, predicted_tensor_fraction=0.40)
        failures = budget.check([worse], {"k<1> @ p": b})
        self.assertEqual(len(failures), 1)
        self.assertIn("tensor peak", failures[0])
        self.assertNotIn("min_predicted_tensor_fraction", budget.budget_for(self.row()))

    def test_budget_file_round_trip(self):
        with tempfile.TemporaryDirectory() as scratch:
            path = Path(scratch) / "b.toml"
            budgets = {'w<bf16, C<16, 128>> @ m1 "x"': dict(budget.budget_for(self.row()),
                                                            reason='lowered: "why"')}
            budget.dump(path, budgets)
            self.assertEqual(budget.load(path), budgets)

    def test_rewriting_keeps_the_comment_lines_of_tables_that_stay(self):
        # What --rebaseline / --prune-budget / --update-budget do: load, change, dump.
        with tempfile.TemporaryDirectory() as scratch:
            path = Path(scratch) / "b.toml"
            row = self.row()
            budgets = {key: budget.budget_for(row) for key in ("a @ p", "b @ p", "c @ p")}
            budget.dump(path, budgets)
            text = path.read_text()
            text = text.replace('["a @ p"]\n', '["a @ p"]\n# why a sits here\n# (two lines)\n')
            text = text.replace('\n["b @ p"]', '\n# above b\n["b @ p"]\n# inside b')
            text = text.replace('["c @ p"]\n', '["c @ p"]\n# c goes\n')
            path.write_text(text)
            budgets = budget.load(path)
            rebased = dict(budget.budget_for(row), max_warp_instr_per_16B=9.99)
            budgets["b @ p"] = rebased            # --rebaseline 'b*'
            del budgets["c @ p"]                  # --prune-budget
            budgets["d @ p"] = budget.budget_for(row)  # --update-budget
            budget.dump(path, budgets)
            written = path.read_text()
            self.assertIn('["a @ p"]\n# why a sits here\n# (two lines)\nmax_warp', written)
            self.assertIn('\n# above b\n["b @ p"]\n# inside b\nmax_warp_instr_per_16B = 9.99', written)
            self.assertNotIn("c goes", written)
            self.assertTrue(written.startswith(budget.HEADER))
            self.assertEqual(written.count(budget.HEADER.splitlines()[0]), 1)
            self.assertEqual(budget.load(path), budgets)
            budget.dump(path, budget.load(path))  # and a rewrite changes nothing
            self.assertEqual(path.read_text(), written)


# An SS wgmma loop at N = 16 (A and B from shared memory) and its RS twin.
def wgmma_loop(n, a_operand):
    return f"""
.text._Z6kernelv:
        /*0000*/                   S2R R0, SR_TID.X ;
.L_x_0:
        /*0010*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0020*/                   WARPGROUP.ARRIVE ;
        /*0030*/                   HGMMA.64x{n}x16.F32.BF16 R24, {a_operand}, R24, gsb0 ;
        /*0040*/                   WARPGROUP.DEPBAR.LE gsb0, 0x0 ;
        /*0050*/                   ISETP.NE.AND P1, PT, R0, RZ, PT ;
        /*0060*/               @P1 BRA `(.L_x_0) ;
        /*0070*/                   EXIT ;
"""


# A dependent FFMA chain and the same count of independent FFMA.
def ffma_block(dependent):
    body = "".join(
        f"        /*{16 * (i + 2):04x}*/                   FFMA R{8 if dependent else 8 + i}, "
        f"R{8 if dependent else 8 + i}, R5, R6 ;\n" for i in range(16))
    return f"""
.text._Z6kernelv:
        /*0000*/                   S2R R0, SR_TID.X ;
.L_x_0:
        /*0010*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
{body}        /*0200*/                   ISETP.NE.AND P1, PT, R0, RZ, PT ;
        /*0210*/               @P1 BRA `(.L_x_0) ;
        /*0220*/                   EXIT ;
"""


def row_of(text, **work):
    function = next(iter(parse_nvdisasm(text).values()))
    defaults = dict(threads=128, ctas=132 * 4, dram_bytes=132 * 4 * 1000 * 2048.0,
                    iterations=132 * 4 * 1000)
    defaults.update(work)
    return model.analyse(function, None, Work(**defaults))


class HonestModel(unittest.TestCase):
    def test_ss_wgmma_reads_its_operands_from_shared_memory(self):
        ss = row_of(wgmma_loop(16, "gdesc[UR8]"))
        rs = row_of(wgmma_loop(16, "R4, gdesc[UR8]"))
        # m64n16k16: A 2048 B + B 512 B per warpgroup; at 128 B/clk that is 20 clocks against
        # 8 clocks of tensor pipe: the shared-memory term binds the SS form, not the RS form.
        # Per warp (a quarter of the reads) + the LDG.128 (512 B: 4 clocks); 4 warps, 128 units.
        self.assertAlmostEqual(ss["cycles_per_16B"]["lsu"], 4 * ((2048 + 512) / 4 / 128 + 4) / 128,
                               places=3)
        self.assertAlmostEqual(rs["cycles_per_16B"]["lsu"], 4 * (512 / 4 / 128 + 4) / 128, places=3)
        self.assertGreater(ss["cycles_per_16B"]["lsu"], 2 * ss["cycles_per_16B"]["tensor"])
        wide = row_of(wgmma_loop(64, "gdesc[UR8]"))
        self.assertLess(wide["cycles_per_16B"]["lsu"] / wide["cycles_per_16B"]["tensor"],
                        ss["cycles_per_16B"]["lsu"] / ss["cycles_per_16B"]["tensor"])

    def test_dependent_chains_and_warps_per_scheduler_set_the_issue_rate(self):
        chain = row_of(ffma_block(True))
        free = row_of(ffma_block(False))
        self.assertLess(chain["main_loop"]["one_warp_issue_rate"][0],
                        free["main_loop"]["one_warp_issue_rate"][0] / 3)
        # one CTA of 4 warps per SM: one warp per scheduler, issue at the chain's rate
        alone = row_of(ffma_block(True), ctas=132)
        self.assertLess(alone["issue_per_clock"][0], chain["issue_per_clock"][0])
        self.assertLessEqual(free["issue_per_clock"][0], 4 * 0.75 + 1e-9)

    def test_phases_add_in_one_cta_per_sm(self):
        # wgmma, wait, then as much FFMA issue as tensor time: one CTA per SM runs them in turn
        ffma = "".join(f"        /*0045*/                   FFMA R{40 + i}, R{40 + i}, R5, R6 ;\n"
                       for i in range(64))
        text = wgmma_loop(64, "gdesc[UR8]").replace(
            "        /*0050*/                   ISETP.NE", ffma + "        /*0050*/                   ISETP.NE")
        text = text.replace("        /*0010*/                   LDG.E.128 R4, desc[UR4][R2.64] ;\n", "")
        # no loads: the whole kernel, 1000 trips of the loop, the stores a nominal DRAM figure
        work = dict(dram_bytes=512.0, iterations=1, whole_kernel=True, inner_trips=1000)
        one = row_of(text, ctas=132, **dict(work, dram_bytes=132 * 512.0, iterations=132))
        many = row_of(text, ctas=132 * 4, **dict(work, dram_bytes=528 * 512.0, iterations=528))
        self.assertTrue(one["main_loop"]["phase_wait"])
        self.assertEqual(one["bound_by"], "phases")
        self.assertIn("phases add", " ".join(one["moved_by"]))
        self.assertLess(one["predicted_tensor_fraction"], many["predicted_tensor_fraction"])

    def test_turns_between_two_warpgroups_overlap_their_phases(self):
        # the phased loop with the ping-pong turn barriers around the wgmma issue, two
        # warpgroups per CTA taking turns (turn_groups 2): credited only with the barriers
        ffma = "".join(f"        /*0045*/                   FFMA R{40 + i}, R{40 + i}, R5, R6 ;\n"
                       for i in range(64))
        text = wgmma_loop(64, "gdesc[UR8]").replace(
            "        /*0050*/                   ISETP.NE", ffma + "        /*0050*/                   ISETP.NE")
        text = text.replace("        /*0010*/                   LDG.E.128 R4, desc[UR4][R2.64] ;\n", "")
        turns = text.replace(
            "        /*0020*/                   WARPGROUP.ARRIVE ;\n",
            "        /*0018*/                   BAR.SYNC.DEFER_BLOCKING R2, 0x100 ;\n"
            "        /*0020*/                   WARPGROUP.ARRIVE ;\n").replace(
            "        /*0040*/                   WARPGROUP.DEPBAR",
            "        /*0038*/                   BAR.ARV R3, 0x100 ;\n"
            "        /*0040*/                   WARPGROUP.DEPBAR")
        work = dict(threads=256, loop_threads=128, ctas=132, dram_bytes=264 * 512.0, iterations=264,
                    whole_kernel=True, inner_trips=1000)
        plain = row_of(text, **work)
        claimed = row_of(text, turn_groups=2, **work)  # no barriers in the SASS: no credit
        paired = row_of(turns, turn_groups=2, **work)
        self.assertEqual(plain["main_loop"]["turn_groups"], 1)
        self.assertEqual(claimed["main_loop"]["turn_groups"], 1)
        self.assertEqual(paired["main_loop"]["turn_groups"], 2)
        self.assertAlmostEqual(claimed["predicted_tensor_fraction"], plain["predicted_tensor_fraction"], places=3)
        self.assertGreater(paired["predicted_tensor_fraction"], 1.2 * plain["predicted_tensor_fraction"])
        self.assertEqual(plain["bound_by"], "phases")
        # __syncthreads (barrier 0) is no turn
        zero = turns.replace("BAR.SYNC.DEFER_BLOCKING R2", "BAR.SYNC.DEFER_BLOCKING 0x0")
        self.assertEqual(row_of(zero, turn_groups=2, **work)["main_loop"]["turn_groups"], 1)

    def test_ranges_order_and_the_budget_judges_the_pessimistic_end(self):
        row = row_of(ffma_block(False))
        self.assertLessEqual(row["predicted_copy_bw_fraction"],
                             row["predicted_copy_bw_fraction_optimistic"])
        self.assertLessEqual(row["predicted_copy_bw_fraction_optimistic"],
                             row["upper_bound_copy_bw_fraction"] + 1e-9)
        b = {"k": budget.budget_for(dict(row, key="k"))}
        self.assertEqual(b["k"]["min_predicted_copy_bw_fraction"],
                         budget._floor3(row["predicted_copy_bw_fraction"]))

    def test_bytes_in_flight_per_stage(self):
        # cp.async waited down to 2: two stages in flight (pessimistic), three (optimistic)
        row = row_of(VERSIONED_LOADS, dram_bytes=132 * 4 * 1000 * 128 * 64.0)
        stage = 128 * 64  # the unrolled version: four 16-byte copies per thread
        self.assertEqual(row["bytes_in_flight_per_sm"], 2 * stage * 4)
        self.assertEqual(row["bytes_in_flight_optimistic"][0], 3 * stage * 4)

    def test_fixed_costs_weigh_on_small_problems(self):
        big = row_of(ffma_block(False))
        small = row_of(ffma_block(False), dram_bytes=132 * 4 * 10 * 2048.0,
                       iterations=132 * 4 * 10)
        self.assertLess(small["predicted_copy_bw_fraction"], big["predicted_copy_bw_fraction"])
        self.assertIn("fixed costs", " ".join(small["moved_by"]))

    def test_imad_at_half_the_fp32_rate(self):
        text = ffma_block(False).replace("FFMA", "IMAD")
        row = row_of(text)
        fp = row_of(ffma_block(False))
        self.assertAlmostEqual(row["cycles_per_16B"]["imad"], 2 * fp["cycles_per_16B"]["fma"],
                               places=6)


# A loop whose steady path skips a warp-uniform block of cp.async copies (scale-copy warps).
ROLE_LOOP = """
.text._Z6kernelv:
        /*0000*/                   S2R R0, SR_TID.X ;
.L_x_0:
        /*0010*/                   LDGSTS.E.BYPASS.128 [R1], desc[UR4][R2.64] ;
        /*0020*/                   ISETP.GT.AND P0, PT, R0, 0x3f, PT ;
        /*0030*/               @P0 BRA `(.L_x_1) ;
        /*0040*/                   IADD3 R6, R6, 0x10, RZ ;
        /*0050*/                   IADD3 R7, R7, 0x10, RZ ;
        /*0060*/                   LDGSTS.E.BYPASS.128 [R5], desc[UR4][R6.64] ;
.L_x_1:
        /*0070*/                   LDSM.16.M88.4 R8, [R9] ;
        /*0080*/                   HMMA.16816.F32.BF16 R12, R8, R10, R12 ;
        /*0090*/                   ISETP.NE.AND P1, PT, R0, RZ, PT ;
        /*00a0*/               @P1 BRA `(.L_x_0) ;
        /*00b0*/                   EXIT ;
"""


# Entry, an abort path that never reaches the loop (a long NaN fill), the loop, EXIT.
ABORT_PATH = """
.text._Z6kernelv:
        /*0000*/                   S2R R0, SR_TID.X ;
        /*0010*/                   ISETP.NE.AND P0, PT, R0, RZ, PT ;
        /*0020*/               @P0 BRA `(.L_x_0) ;
""" + "".join(f"        /*{0x30 + 16 * i:04x}*/                   STG.E [R2.64+{4 * i:#x}], R5 ;\n"
              for i in range(40)) + """        /*02b0*/                   EXIT ;
.L_x_0:
        /*02c0*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*02d0*/                   LDS.128 R8, [R9] ;
        /*02e0*/                   ISETP.NE.AND P1, PT, R0, RZ, PT ;
        /*02f0*/               @P1 BRA `(.L_x_0) ;
        /*0300*/                   FADD R5, R5, R6 ;
        /*0310*/                   EXIT ;
"""


class HonestModelWork(unittest.TestCase):
    def test_prologue_is_the_cheapest_way_in_and_out(self):
        row = row_of(ABORT_PATH)
        # in: S2R, ISETP, BRA (3); out: FADD, EXIT (2); the 41-instruction abort path is not
        self.assertEqual(row["main_loop"]["prologue_instructions"], 5)

    def test_off_path_global_work_of_some_warps_counts(self):
        none = row_of(ROLE_LOOP)  # unknown: one warp of four
        half = row_of(ROLE_LOOP, role_warp_fraction=0.5)
        # 3 instructions of the skipped block, by 1 or 2 of 4 warps, per 128 units
        self.assertAlmostEqual(none["role_warp_instr_per_16B"], 4 * 0.25 * 3 / 128, places=3)
        self.assertAlmostEqual(half["role_warp_instr_per_16B"], 4 * 0.5 * 3 / 128, places=3)
        self.assertEqual(none["warp_instr_per_16B"], half["warp_instr_per_16B"])  # counting as before
        self.assertGreater(half["cycles_per_16B"]["issue"], none["cycles_per_16B"]["issue"])

    def test_causal_tail_from_unequal_ctas_in_launch_order(self):
        slots = 4
        self.assertAlmostEqual(model._dispatch_efficiency([1.0] * 8, slots), 1.0)
        # shortest first: the longest tiles start last and run alone
        ascending = [float(c) for c in range(1, 9)]
        longest_first = sorted(ascending, reverse=True)
        self.assertLess(model._dispatch_efficiency(ascending, slots),
                        model._dispatch_efficiency(longest_first, slots))
        self.assertAlmostEqual(model._dispatch_efficiency([1.0] * 5, slots), 5 / 8)

    def test_the_moved_column_names_the_fix(self):
        # eight SS m64n16 wgmma per 2 KB of DRAM: the operand reads bind, and the report says so
        def many(a_operand):
            line = f"HGMMA.64x16x16.F32.BF16 R24, {a_operand}, R24, gsb0 ;"
            text = wgmma_loop(16, a_operand)
            return text.replace(line, " ;\n        /*0030*/                   ".join([line] * 8))
        full = dict(ctas=132 * 16, iterations=132 * 16 * 1000, dram_bytes=132 * 16 * 1000 * 2048.0)
        row = row_of(many("gdesc[UR8]"), **full)  # 16 CTAs per SM: 32 KB in flight
        self.assertEqual(row["bound_by"], "lsu")
        self.assertIn("smem operands", row["moved_by"][0])
        rs = row_of(many("R4, gdesc[UR8]"), **full)
        self.assertNotEqual(rs["bound_by"], "lsu")
        self.assertNotIn("smem operands", " ".join(rs["moved_by"]))


class Fit(unittest.TestCase):
    def test_reads_ncu_csv_and_prints_predicted_vs_measured(self):
        from sass_report import fit
        header = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",'
                  '"Block Size","Grid Size","Device","CC","Section Name","Metric Name",'
                  '"Metric Unit","Metric Value"\n')
        lines = ["==PROF== Connected to process 1\n", header]
        for launch, clock in enumerate((1.71e9, 1.65e9, 1.80e9)):
            name = "void slimserve_calibration::alu_copy16_kernel(const float4*, float4*, long, float, float)"
            for metric, value in ((fit.METRICS["clock"], clock), (fit.METRICS["issue"], 0.71),
                                  (fit.METRICS["dram"], 17.5), (fit.METRICS["dram_rate"], 0.86e12)):
                lines.append(f'"{launch}","1","b","h","{name}","1","7","(256, 1, 1)",'
                             f'"(1056, 1, 1)","0","9.0","s","{metric}","x","{value:,}"\n')
        rows = [{"key": "alu_copy16_kernel @ p", "kernel": "alu_copy16_kernel",
                 "predicted_copy_bw_fraction": 0.14, "predicted_copy_bw_fraction_optimistic": 0.24,
                 "predicted_tensor_fraction": 0.0, "predicted_tensor_fraction_optimistic": 0.0,
                 "bound_by": "issue"}]
        with tempfile.TemporaryDirectory() as scratch:
            path = Path(scratch) / "ncu.csv"
            path.write_text("".join(lines))
            measured = fit.read_ncu([str(path)])
        self.assertEqual(list(measured), ["alu_copy16_kernel"])
        self.assertAlmostEqual(measured["alu_copy16_kernel"]["clock"], 1.71e9)  # the median
        text = "\n".join(fit.fit(rows, measured))
        self.assertIn("| `alu_copy16_kernel @ p` | 14–24% | 20% | 0–0% | — | issue | 18 | 1.71 | 0.71 |",
                      text)
        self.assertIn("SM clock under load: 1.71–1.71 GHz", text)
        self.assertIn("sustained issue per scheduler (alu_copy16): 0.71", text)

    def test_asks_ncu_only_for_metrics_it_lists(self):
        from sass_report import fit
        query = ("Device GH100\n-----\ndram__throughput                 DRAM throughput\n"
                 "sm__cycles_elapsed               cycles\n")
        self.assertEqual(fit.available_metrics(query),
                         "dram__throughput.avg.pct_of_peak_sustained_elapsed,"
                         "sm__cycles_elapsed.avg.per_second")
        self.assertEqual(fit.available_metrics("no metrics here"), fit.NCU_METRICS)

    def test_calibration_table_from_benchmark_json(self):
        import contextlib, io, json
        from sass_report import calibrate
        rows = [{"kernel": "ss_wgmma_loop_kernel<16>", "predicted_copy_bw_fraction": 0.0,
                 "predicted_copy_bw_fraction_optimistic": 0.0, "predicted_tensor_fraction": 0.35,
                 "predicted_tensor_fraction_optimistic": 0.54, "bound_by": "lsu",
                 "warp_instr_per_16B": 1.0}]
        bench = {"benchmarks": [{"name": "BM_SsWgmma<16>/manual_time", "bytes_per_second": 1e9,
                                 "fma_per_second": 0.2 * 2048 * 132 * 1.83e9}]}
        with tempfile.TemporaryDirectory() as scratch:
            (Path(scratch) / "r.json").write_text(json.dumps(rows))
            (Path(scratch) / "b.json").write_text(json.dumps(bench))
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                calibrate.main(["x", str(Path(scratch) / "r.json"), str(Path(scratch) / "b.json")])
        self.assertIn("| `ss_wgmma_loop_kernel<16>` | 35–54% of peak | lsu | 1 | 20% |",
                      out.getvalue())


if __name__ == "__main__":
    unittest.main()
