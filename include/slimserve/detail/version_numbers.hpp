#pragma once
// The one place the version lives; CMake reads these three lines. Include
// <slimserve/version.hpp> instead of this file.
#define SLIMSERVE_VERSION_MAJOR 0
#define SLIMSERVE_VERSION_MINOR 1
#define SLIMSERVE_VERSION_PATCH 0
