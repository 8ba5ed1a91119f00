"""tools/gen_capi.py on small headers: the type mapping it promises, and the refusals (an
unsupported declaration, a struct used before it is defined) that keep a binding from being
silently wrong; plus --check failing when the header gains a field the file lacks."""
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import gen_capi  # noqa: E402

PRELUDE = """#define SLIMSERVE_C_ABI_VERSION 7
#define SLIMSERVE_C_API
typedef int32_t slimserve_status;
typedef struct CUstream_st* slimserve_stream;
typedef struct slimserve_request_status { int32_t state; int32_t failed_slot; } slimserve_request_status;
typedef struct slimserve_page_copy { int32_t src; } slimserve_page_copy;
typedef struct slimserve_page_swap { int32_t page; } slimserve_page_swap;
typedef struct slimserve_record_identity { uint32_t pool; } slimserve_record_identity;
typedef struct slimserve_moe_routing_status { int32_t invalid_pairs; } slimserve_moe_routing_status;
"""


def emit(body: str) -> dict:
    """The generated module for PRELUDE + body, executed."""
    text = gen_capi.Emitter(gen_capi.Header(PRELUDE + body)).emit()
    namespace = {}
    exec(compile(text, "<generated>", "exec"), namespace)
    return namespace


class Mapping(unittest.TestCase):
    def test_scalars_structs_handles_and_pointers(self):
        ns = emit("""
            enum { SLIMSERVE_A = 0, SLIMSERVE_B = 5 };
            typedef struct slimserve_pool slimserve_pool;
            typedef struct slimserve_view {
              const int32_t* ids; /* a device address */
              int64_t a, b;
              float scale;
            } slimserve_view;
            typedef struct slimserve_info { const uint16_t* scales; size_t bytes; const char* reason; } slimserve_info;
            SLIMSERVE_C_API slimserve_status slimserve_f(const slimserve_view* view, slimserve_pool* pool,
                                                        slimserve_pool** out, void** mem,
                                                        slimserve_request_status* statuses,
                                                        slimserve_stream stream);
            SLIMSERVE_C_API void slimserve_g(slimserve_view view);
            SLIMSERVE_C_API const char* slimserve_h(void);
            SLIMSERVE_C_API slimserve_status slimserve_i(slimserve_info* info);
        """)
        import ctypes
        self.assertEqual(ns["ABI_VERSION"], 7)
        self.assertEqual((ns["SLIMSERVE_A"], ns["SLIMSERVE_B"]), (0, 5))
        view, info = ns["View"], ns["Info"]
        self.assertEqual([(n, t) for n, t in view._fields_],
                         [("ids", ctypes.c_void_p), ("a", ctypes.c_int64), ("b", ctypes.c_int64),
                          ("scale", ctypes.c_float)])
        # Only the library writes slimserve_info (non-const pointer everywhere): typed pointers.
        self.assertEqual(info._fields_[0][1], ctypes.POINTER(ctypes.c_uint16))
        self.assertEqual(info._fields_[2][1], ctypes.c_char_p)
        restype, argtypes = ns["SIGNATURES"]["slimserve_f"]
        self.assertIs(restype, ctypes.c_int32)
        self.assertEqual(argtypes, [ctypes.POINTER(view), ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                                    ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_void_p])
        self.assertEqual(ns["SIGNATURES"]["slimserve_g"], (None, [view]))
        self.assertEqual(ns["SIGNATURES"]["slimserve_h"], (ctypes.c_char_p, []))

    def test_refusals(self):
        for body, message in [
                ("typedef struct slimserve_a { int32_t x[4]; } slimserve_a;", "unsupported declaration"),
                ("SLIMSERVE_C_API void slimserve_f(void (*callback)(void));", "unsupported declaration"),
                ("typedef struct slimserve_a { struct slimserve_b inner; } slimserve_a;\n"
                 "typedef struct slimserve_b { int32_t x; } slimserve_b;", "used before"),
                ("typedef struct slimserve_a { unknown_t x; } slimserve_a;", "unknown type"),
                ("int32_t stray;", "unrecognized statement"),
                ("enum { SLIMSERVE_X };", "explicit values")]:
            with self.subTest(body=body):
                with self.assertRaisesRegex(gen_capi.HeaderError, message):
                    emit(body)


class Check(unittest.TestCase):
    def test_check_fails_when_the_header_changes(self):
        with tempfile.TemporaryDirectory() as tmp:
            header, output = os.path.join(tmp, "h.h"), os.path.join(tmp, "out.py")
            with open(header, "w") as f:
                f.write(PRELUDE + "typedef struct slimserve_a { int32_t x; } slimserve_a;\n")
            run = lambda *extra: subprocess.run([sys.executable, os.path.join(ROOT, "tools", "gen_capi.py"),
                                                 "--header", header, "--output", output, *extra],
                                                capture_output=True, text=True)
            self.assertEqual(run().returncode, 0)
            self.assertEqual(run("--check").returncode, 0)
            with open(header, "a") as f:
                f.write("typedef struct slimserve_b { int64_t y; } slimserve_b;\n")
            result = run("--check")
            self.assertEqual(result.returncode, 1)
            self.assertIn('("y", c_int64)', result.stderr)


if __name__ == "__main__":
    unittest.main()
