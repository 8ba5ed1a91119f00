// Catch2 main for the CPU-emulated and host-only tests.
#include "support/catch_session.hpp"

int main(int argc, char* argv[]) { return slimserve_test::run_catch_session(argc, argv); }
