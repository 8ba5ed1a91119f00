/*
 * What the C ABI tests share: the check macros (a failed call ends the test; a failed
 * expectation is counted and the test goes on), the refusal check (the status code and a
 * message naming the problem), and the seeded random numbers.
 * Include once per test program, after <slimserve/c/slimserve.h>.
 */
#ifndef SLIMSERVE_TESTS_C_TEST_SUPPORT_H
#define SLIMSERVE_TESTS_C_TEST_SUPPORT_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <slimserve/c/slimserve.h>

static int failures = 0;

#define CHECK_OK(call)                                                                     \
  do {                                                                                     \
    slimserve_status status_ = (call);                                                     \
    if (status_ != SLIMSERVE_OK) {                                                         \
      fprintf(stderr, "%s:%d: %s failed: %s (%s)\n", __FILE__, __LINE__, #call,            \
              slimserve_status_name(status_), slimserve_last_error());                     \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)

#define EXPECT(condition)                                                                  \
  do {                                                                                     \
    if (!(condition)) {                                                                    \
      fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #condition);             \
      ++failures;                                                                          \
    }                                                                                      \
  } while (0)

/* A refusal: the code, and a message naming the problem. */
#define EXPECT_REFUSED(call, code, text)                                                   \
  do {                                                                                     \
    slimserve_status status_ = (call);                                                     \
    if (status_ != (code) || strstr(slimserve_last_error(), (text)) == NULL) {             \
      fprintf(stderr, "%s:%d: %s gave %s (\"%s\"); expected %s with \"%s\"\n", __FILE__,   \
              __LINE__, #call, slimserve_status_name(status_), slimserve_last_error(),     \
              slimserve_status_name(code), (text));                                        \
      ++failures;                                                                          \
    }                                                                                      \
  } while (0)

/* ---- numbers ----------------------------------------------------------------------------- */

static uint64_t rng_state;
static inline double uniform(void) { /* [-1, 1) */
  rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
  return (double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}
static inline int32_t below(int32_t n) { return (int32_t)((uniform() + 1.0) * 0.5 * (double)n) % n; }

#endif /* SLIMSERVE_TESTS_C_TEST_SUPPORT_H */
