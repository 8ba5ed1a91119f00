#pragma once
// Which of the three builds a test runs in. The ASan+UBSan and TSan builds run a sweep's cases
// that reach every kernel instantiation and code path; the release build (one tenth of their
// cost per case) also runs the cases that only make the same code bigger: more heads, longer
// chunks. A race or an overflow is found within one CTA; it does not need a larger grid.

namespace slimserve_test {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool sanitizer_build = true;
#else
inline constexpr bool sanitizer_build = false;
#endif

}  // namespace slimserve_test
