#pragma once
// Runs the Catch2 session. Defined next to Catch2's implementation (catch_session.cpp), which
// is compiled once per build for both test flavours; each flavour's main() calls it.

namespace slimserve_test {

int run_catch_session(int argc, char* argv[]);

}  // namespace slimserve_test
