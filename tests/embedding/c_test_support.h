/*
 * What the C ABI tests share: the check macros (a failed call ends the test; a failed
 * expectation is counted and the test goes on), the refusal check (the status code and a
 * message naming the problem), device upload/download, and the seeded random numbers.
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

/* ---- device memory (the emulated library's allocations) ----------------------------------- */

static inline void* upload(const void* host, size_t bytes) {
  void* device = NULL;
  CHECK_OK(slimserve_device_alloc(bytes > 0 ? bytes : 16, &device));
  if (bytes > 0) CHECK_OK(slimserve_memcpy_async(device, host, bytes, SLIMSERVE_HOST_TO_DEVICE, NULL));
  CHECK_OK(slimserve_stream_synchronize(NULL));
  return device;
}
static inline void download(void* host, const void* device, size_t bytes) {
  CHECK_OK(slimserve_memcpy_async(host, device, bytes, SLIMSERVE_DEVICE_TO_HOST, NULL));
  CHECK_OK(slimserve_stream_synchronize(NULL));
}

/* ---- numbers ----------------------------------------------------------------------------- */

static uint64_t rng_state;
static inline double uniform(void) { /* [-1, 1) */
  rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
  return (double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}
static inline int32_t below(int32_t n) { return (int32_t)((uniform() + 1.0) * 0.5 * (double)n) % n; }

#endif /* SLIMSERVE_TESTS_C_TEST_SUPPORT_H */
