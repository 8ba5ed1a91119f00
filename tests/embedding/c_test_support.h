/*
 * What the C ABI tests share: the check macros (a failed call ends the test; a failed
 * expectation is counted and the test goes on), the refusal check (the status code and a
 * message naming the problem), device upload/download/fill/release, BF16 bits, the seeded
 * random numbers and the start and end of a test program (the seed is fresh per run and
 * printed; SLIMSERVE_TEST_SEED=<seed> repeats one, as in the C++ and Python tests).
 * Include once per test program, after <slimserve/c/slimserve.h>.
 */
#ifndef SLIMSERVE_TESTS_C_TEST_SUPPORT_H
#define SLIMSERVE_TESTS_C_TEST_SUPPORT_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

/* Whether the last message names `text`. */
static inline int message_has(const char* text) { return strstr(slimserve_last_error(), text) != NULL; }

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
/* `bytes` on the device, every byte `byte_value` (outputs are poisoned before each run). */
static inline void* device_filled(size_t bytes, int32_t byte_value) {
  void* device = NULL;
  CHECK_OK(slimserve_device_alloc(bytes, &device));
  CHECK_OK(slimserve_memset_async(device, byte_value, bytes, NULL));
  return device;
}
static inline void release(void* device) {
  if (device != NULL) CHECK_OK(slimserve_device_free(device));
}

/* ---- BF16 bits (round to nearest even) ---------------------------------------------------- */

static inline uint16_t to_bf16(double value) {
  const float f = (float)value;
  uint32_t bits;
  memcpy(&bits, &f, sizeof bits);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return (uint16_t)(bits >> 16);
}
static inline double from_bf16(uint16_t value) {
  const uint32_t bits = (uint32_t)value << 16;
  float result;
  memcpy(&result, &bits, sizeof result);
  return (double)result;
}

/* ---- numbers ----------------------------------------------------------------------------- */

static uint64_t rng_state;
static inline double uniform(void) { /* [-1, 1) */
  rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
  return (double)(rng_state >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}
static inline int32_t below(int32_t n) { return (int32_t)((uniform() + 1.0) * 0.5 * (double)n) % n; }

/* ---- a test program's start and end ------------------------------------------------------ */

/* Seeds the numbers (SLIMSERVE_TEST_SEED, else fresh) and prints the seed and the backend. */
static inline void start_test(const char* name) {
  const char* seed = getenv("SLIMSERVE_TEST_SEED");
  const uint64_t fresh = (uint64_t)time(NULL) * 2654435761u ^ (uint64_t)clock();
  rng_state = seed != NULL ? strtoull(seed, NULL, 10) : fresh;
  printf("%s (%s): SLIMSERVE_TEST_SEED=%llu\n", name,
         slimserve_is_emulated() ? "CPU emulator" : "GPU", (unsigned long long)rng_state);
}
/* The exit status: 0 when every expectation held. */
static inline int finish_test(const char* name) {
  if (failures != 0) {
    fprintf(stderr, "%s: %d check(s) failed\n", name, failures);
    return 1;
  }
  printf("%s: all checks passed\n", name);
  return 0;
}

#endif /* SLIMSERVE_TESTS_C_TEST_SUPPORT_H */
