// Catch2 main for the CPU-emulated and host-only tests.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
