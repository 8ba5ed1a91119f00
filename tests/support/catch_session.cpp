// Catch2's implementation (CATCH_CONFIG_RUNNER: everything but main), compiled once per build
// and linked by both test flavours' mains (catch_main.cpp, catch_main_gpu.cpp).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "support/catch_session.hpp"

namespace slimserve_test {

int run_catch_session(int argc, char* argv[]) { return Catch::Session().run(argc, argv); }

}  // namespace slimserve_test
