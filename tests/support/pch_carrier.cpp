// Carrier of the tests' precompiled Catch2 header (tests/CMakeLists.txt); no code of its own.
