"""tools/gen_kv_formats.py on small lists: what each row becomes (instantiation units, the C
enum, the Python names, the SASS sizes), and the refusals that keep the ABI and the names
unambiguous (renumbered values, a name given to two formats, a row it cannot read)."""
import os
import sys
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import gen_kv_formats as gen  # noqa: E402


def listing(*rows: str) -> str:
    return "#define SLIMSERVE_KV_FORMAT_LIST(X) \\\n" + " \\\n".join(rows) + "\n// after\n"


BF16 = 'X(bf16, 0, 16, "bfloat16", "bfloat16 bf16", "bfloat16 uint16", 0, 0)'
NVFP4 = 'X(nvfp4, 1, 4, "nvfp4", "nvfp4 fp4", "uint8", 16, 8)'


class GenKvFormatsTest(unittest.TestCase):
    def test_rows_become_units_enum_and_names(self):
        formats = gen.read_formats(listing(BF16, NVFP4))
        self.assertEqual([f["name"] for f in formats], ["bf16", "nvfp4"])
        self.assertIn("decode_kernels<nvfp4>();", gen.decode_unit(formats[1]))
        self.assertIn("paged_attention_kernels<nvfp4>();", gen.paged_unit(formats[1]))
        self.assertEqual(gen.c_enum(formats), "enum { SLIMSERVE_KV_BF16 = 0, SLIMSERVE_KV_NVFP4 = 1 };\n")
        names = {}
        exec(gen.python_module(formats), names)
        self.assertEqual(names["KV_DTYPES"], {"bfloat16": 0, "bf16": 0, "nvfp4": 1, "fp4": 1})
        self.assertEqual(names["KV_CODE_NAMES"], {0: "bfloat16", 1: "nvfp4"})
        self.assertEqual(names["KV_TENSOR_DTYPES"][1], {"uint8"})
        self.assertEqual(names["KV_BITS"], {0: 16, 1: 4})
        sizes = {}
        exec(gen.sass_module(formats), sizes)
        self.assertEqual(sizes["KV_FORMAT_BITS"], {"bf16": 16, "nvfp4": 4})
        # The bytes a kernel moves: an E4M3 scale per 16 E2M1 codes is half a bit per element.
        self.assertEqual(sizes["KV_FORMAT_VECTOR_BITS"], {"bf16": 16, "nvfp4": 4.5})

    def test_c_header_enum_line_is_replaced_in_place(self):
        formats = gen.read_formats(listing(BF16, NVFP4))
        header = "a\ntypedef int32_t slimserve_kv_dtype;\nenum { SLIMSERVE_KV_BF16 = 0 };\nb\n"
        self.assertEqual(gen.c_header(header, formats),
                         "a\ntypedef int32_t slimserve_kv_dtype;\n"
                         "enum { SLIMSERVE_KV_BF16 = 0, SLIMSERVE_KV_NVFP4 = 1 };\nb\n")
        with self.assertRaisesRegex(gen.ListError, "not its enum"):
            gen.c_header("typedef int32_t slimserve_kv_dtype;\nint x;\n", formats)

    def test_refusals(self):
        cases = {
            "ABI values must be 0, 1, 2": listing(BF16, NVFP4.replace(", 1, 4,", ", 2, 4,")),
            "already bf16's": listing(BF16, NVFP4.replace('"nvfp4 fp4"', '"nvfp4 bf16"')),
            "must be among its names": listing(BF16, NVFP4.replace('"nvfp4 fp4"', '"fp4"')),
            "cannot read": listing(BF16, "X(nvfp4, 1)"),
            "cannot read the KV format row": listing(BF16, NVFP4.replace(", 16, 8)", ")")),
            "no SLIMSERVE_KV_FORMAT_LIST": "nothing here\n",
        }
        for message, text in cases.items():
            with self.subTest(message):
                with self.assertRaisesRegex(gen.ListError, message):
                    gen.read_formats(text)

    def test_the_committed_list_reads(self):
        with open(gen.LIST_HEADER, encoding="utf-8") as fh:
            formats = gen.read_formats(fh.read())
        self.assertEqual([(f["name"], f["value"]) for f in formats][:4],
                         [("bf16", 0), ("fp16", 1), ("fp8_e4m3", 2), ("fp8_e5m2", 3)])


if __name__ == "__main__":
    unittest.main()
