/*
 * The C ABI from a plain C99 program: status codes and messages, range-checked enumerations,
 * all-or-nothing allocation, stale handles, and INT4 quantize + GEMM plan/run against a
 * host reference built from the dequantized weights. (The KV engine loop is
 * examples/engine_loop/engine_loop.c, also run as a test.) Exit status 0 when all checks pass.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <slimserve/c/slimserve.h>

#include "c_test_support.h"

static void test_status_and_pool(void) {
  slimserve_page_pool* pool = NULL;
  slimserve_page pages[8], stale;
  int32_t i;
  EXPECT(strcmp(slimserve_status_name(SLIMSERVE_STALE_HANDLE), "stale handle") == 0);
  EXPECT(strcmp(slimserve_status_name(99), "unknown") == 0);
  EXPECT(slimserve_c_abi_version() == SLIMSERVE_C_ABI_VERSION);
  EXPECT(slimserve_version() >= 100);

  EXPECT(slimserve_page_pool_create(0, &pool) == SLIMSERVE_INVALID_ARGUMENT);
  EXPECT(pool == NULL && slimserve_last_error()[0] != '\0');
  EXPECT(slimserve_page_pool_create(8, NULL) == SLIMSERVE_INVALID_ARGUMENT);
  CHECK_OK(slimserve_page_pool_create(8, &pool)); /* 7 usable pages */
  EXPECT(slimserve_last_error()[0] == '\0');       /* cleared by a success */
  EXPECT(slimserve_page_pool_available(pool) == 7);

  /* All or nothing: 8 pages do not fit, and none is taken. */
  EXPECT(slimserve_page_pool_allocate(pool, pages, 8) == SLIMSERVE_RESOURCE_EXHAUSTED);
  EXPECT(slimserve_page_pool_available(pool) == 7);
  CHECK_OK(slimserve_page_pool_allocate(pool, pages, 3));
  for (i = 0; i < 3; ++i) EXPECT(pages[i].id > 0); /* never the guard page 0 */
  stale = pages[1];
  CHECK_OK(slimserve_page_pool_release(pool, &pages[1], 1));
  EXPECT(slimserve_page_pool_validate(pool, stale) != SLIMSERVE_OK);
  /* A release list with a stale handle changes nothing: pages[0] keeps its reference. */
  pages[1] = stale;
  EXPECT(slimserve_page_pool_release(pool, pages, 2) != SLIMSERVE_OK);
  CHECK_OK(slimserve_page_pool_validate(pool, pages[0]));
  CHECK_OK(slimserve_page_pool_release(pool, &pages[0], 1));
  CHECK_OK(slimserve_page_pool_release(pool, &pages[2], 1));
  EXPECT(slimserve_page_pool_available(pool) == 7);
  slimserve_page_pool_destroy(pool);
  slimserve_page_pool_destroy(NULL); /* accepted */
}

static void test_enum_ranges_and_workspace(void) {
  slimserve_decode_problem problem;
  slimserve_decode_plan* plan = NULL;
  const int32_t indptr[2] = {0, 1}, last_page_len[1] = {5};
  size_t bytes = 0;
  void* workspace = NULL;
  memset(&problem, 0, sizeof problem);
  problem.batch_size = 1;
  problem.num_qo_heads = 4;
  problem.num_kv_heads = 2;
  problem.head_dim = 64;
  problem.page_size = 16;
  problem.query_tokens = 1;
  problem.kv_dtype = 9; /* not a KV dtype */
  EXPECT(slimserve_decode_workspace_size(&problem, indptr, last_page_len, &bytes) ==
         SLIMSERVE_INVALID_ARGUMENT);
  EXPECT(message_has("9"));
  EXPECT(message_has("one of bf16, fp16, fp8_e4m3, fp8_e5m2")); /* the formats, from their list */
  problem.kv_dtype = 300; /* outside the enum's underlying type */
  EXPECT(slimserve_decode_workspace_size(&problem, indptr, last_page_len, &bytes) ==
         SLIMSERVE_INVALID_ARGUMENT);
  problem.kv_dtype = -1;
  EXPECT(slimserve_decode_workspace_size(&problem, indptr, last_page_len, &bytes) ==
         SLIMSERVE_INVALID_ARGUMENT);
  problem.kv_dtype = SLIMSERVE_KV_FP8_E4M3;
  CHECK_OK(slimserve_decode_workspace_size(&problem, indptr, last_page_len, &bytes));
  EXPECT(bytes > 0);
  /* A null workspace is a caller bug (invalid argument), not a shortage. */
  EXPECT(slimserve_decode_plan_create(&problem, indptr, last_page_len, NULL, bytes, NULL, &plan) ==
         SLIMSERVE_INVALID_ARGUMENT);
  EXPECT(plan == NULL);
  CHECK_OK(slimserve_device_alloc(bytes, &workspace));
  EXPECT(slimserve_decode_plan_create(&problem, indptr, last_page_len, workspace, bytes - 1,
                                      NULL, &plan) == SLIMSERVE_RESOURCE_EXHAUSTED);
  CHECK_OK(slimserve_decode_plan_create(&problem, indptr, last_page_len, workspace, bytes, NULL, &plan));
  slimserve_decode_plan_destroy(plan);
  CHECK_OK(slimserve_device_free(workspace));
  EXPECT(slimserve_memcpy_async(NULL, NULL, 0, 7, NULL) == SLIMSERVE_INVALID_ARGUMENT);
}

/* W4A16: quantize a random [k, n] weight, upload the packed form, multiply, compare with
 * A . dequant(W) computed here in double from the same BF16 inputs. */
static void test_int4_gemm(int64_t m, int64_t k, int64_t n, int64_t group_size, int32_t symmetric) {
  float* weight = malloc((size_t)(k * n) * sizeof *weight);
  float* dequantized = malloc((size_t)(k * n) * sizeof *dequantized);
  uint16_t* a = malloc((size_t)(m * k) * sizeof *a);
  uint16_t* c = malloc((size_t)(m * n) * sizeof *c);
  slimserve_quantize_options options;
  slimserve_int4_weights* weights = NULL;
  slimserve_int4_weights_info info;
  slimserve_gemm_args args;
  slimserve_gemm_plan* plan = NULL;
  void *d_packed = NULL, *d_scales = NULL, *d_zeros = NULL, *d_a = NULL, *d_c = NULL, *d_ws = NULL;
  size_t workspace_bytes;
  int64_t i, row, col, bad = 0;
  for (i = 0; i < k * n; ++i) weight[i] = (float)uniform();
  for (i = 0; i < m * k; ++i) a[i] = to_bf16((float)uniform());
  options.group_size = group_size;
  options.symmetric = symmetric;
  options.activation = SLIMSERVE_ACT_BF16;
  CHECK_OK(slimserve_int4_quantize(weight, SLIMSERVE_WEIGHT_F32, SLIMSERVE_WEIGHT_K_BY_N, k, n,
                                   &options, &weights));
  CHECK_OK(slimserve_int4_weights_get_info(weights, &info));
  EXPECT(info.k == k && info.n == n && info.group_size == group_size);
  EXPECT(info.packed_bytes == (size_t)(k * n / 2));
  EXPECT((info.zeros == NULL) == (symmetric != 0));
  CHECK_OK(slimserve_int4_weights_dequantize(weights, dequantized, (size_t)(k * n)));
  for (i = 0; i < k * n; ++i) bad += !(fabsf(dequantized[i] - weight[i]) <= 0.1f);
  EXPECT(bad == 0); /* INT4 of uniform [-1, 1): within half a step (1/7 or 2/15) plus BF16 scale */

  CHECK_OK(slimserve_device_alloc(info.packed_bytes, &d_packed));
  CHECK_OK(slimserve_memcpy_async(d_packed, info.packed, info.packed_bytes, SLIMSERVE_HOST_TO_DEVICE, NULL));
  CHECK_OK(slimserve_device_alloc(info.scales_bytes, &d_scales));
  CHECK_OK(slimserve_memcpy_async(d_scales, info.scales, info.scales_bytes, SLIMSERVE_HOST_TO_DEVICE, NULL));
  if (info.zeros != NULL) {
    CHECK_OK(slimserve_device_alloc(info.zeros_bytes, &d_zeros));
    CHECK_OK(slimserve_memcpy_async(d_zeros, info.zeros, info.zeros_bytes, SLIMSERVE_HOST_TO_DEVICE, NULL));
  }
  CHECK_OK(slimserve_device_alloc((size_t)(m * k) * sizeof *a, &d_a));
  CHECK_OK(slimserve_memcpy_async(d_a, a, (size_t)(m * k) * sizeof *a, SLIMSERVE_HOST_TO_DEVICE, NULL));
  CHECK_OK(slimserve_device_alloc((size_t)(m * n) * sizeof *c, &d_c));

  memset(&args, 0, sizeof args);
  args.activation = SLIMSERVE_ACT_BF16;
  args.m = m;
  args.n = n;
  args.k = k;
  args.group_size = group_size;
  args.a = d_a;
  args.b = d_packed;
  args.scales = d_scales;
  args.zeros = d_zeros;
  args.c = d_c;
  args.activation = 2; /* not an activation dtype */
  EXPECT(slimserve_gemm_plan_create(&args, &plan) == SLIMSERVE_INVALID_ARGUMENT);
  args.activation = SLIMSERVE_ACT_BF16;
  CHECK_OK(slimserve_gemm_plan_create(&args, &plan));
  workspace_bytes = slimserve_gemm_plan_workspace_bytes(plan);
  if (workspace_bytes > 0) CHECK_OK(slimserve_device_alloc(workspace_bytes, &d_ws));
  CHECK_OK(slimserve_gemm_run(plan, &args, d_ws, workspace_bytes, NULL));
  CHECK_OK(slimserve_memcpy_async(c, d_c, (size_t)(m * n) * sizeof *c, SLIMSERVE_DEVICE_TO_HOST, NULL));
  CHECK_OK(slimserve_stream_synchronize(NULL));

  bad = 0;
  for (row = 0; row < m; ++row) {
    for (col = 0; col < n; ++col) {
      double reference = 0.0, scale = 0.0, got;
      for (i = 0; i < k; ++i) {
        const double term = (double)from_bf16(a[row * k + i]) * (double)dequantized[i * n + col];
        reference += term;
        scale += fabs(term);
      }
      got = (double)from_bf16(c[row * n + col]);
      /* FP32 accumulation, one BF16 rounding of the result, and the BF16 rounding of each
         dequantized weight: where the plan applies group scales to the FP32 group sums, the
         GEMM multiplies by the exact (q - z) * s, which `dequantized` holds rounded. */
      if (!(fabs(got - reference) <= scale / 256.0 + fabs(reference) / 128.0 + 1e-6)) ++bad;
    }
  }
  EXPECT(bad == 0);
  if (bad != 0) fprintf(stderr, "gemm m=%lld k=%lld n=%lld: %lld elements off\n", (long long)m,
                        (long long)k, (long long)n, (long long)bad);
  slimserve_gemm_plan_destroy(plan);
  slimserve_int4_weights_destroy(weights);
  CHECK_OK(slimserve_device_free(d_packed));
  CHECK_OK(slimserve_device_free(d_scales));
  CHECK_OK(slimserve_device_free(d_zeros));
  CHECK_OK(slimserve_device_free(d_a));
  CHECK_OK(slimserve_device_free(d_c));
  CHECK_OK(slimserve_device_free(d_ws));
  free(weight);
  free(dequantized);
  free(a);
  free(c);
}


/* ---- Request page sets and page movement ------------------------------------------------- */

enum { MV_PAGES = 16, MV_PAGE = 16, MV_DIM = 64 };
#define MV_PAGE_ELEMS ((size_t)MV_PAGE * MV_DIM) /* one KV head */

static int same_page(const uint16_t* a, int32_t page_a, const uint16_t* b, int32_t page_b, size_t slots) {
  return memcmp(a + (size_t)page_a * MV_PAGE_ELEMS, b + (size_t)page_b * MV_PAGE_ELEMS,
                slots * MV_DIM * sizeof(uint16_t)) == 0;
}

static void test_request_sets_and_page_movement(void) {
  const size_t cache_bytes = (size_t)MV_PAGES * MV_PAGE_ELEMS * sizeof(uint16_t);
  uint16_t* k_image = malloc(cache_bytes);
  uint16_t* v_image = malloc(cache_bytes);
  uint16_t* k_after = malloc(cache_bytes);
  uint16_t* v_after = malloc(cache_bytes);
  slimserve_page_pool* pool = NULL;
  slimserve_prefix_cache* prefix = NULL;
  slimserve_request_sets* sets = NULL;
  slimserve_device_tags* tags = NULL;
  slimserve_kv_cache cache;
  slimserve_request_ref a, child, d, resumed;
  slimserve_page_plan plan;
  slimserve_page a_pages[4], c_pages[4], d_pages[4];
  size_t count = 0, i;
  int32_t tokens_a[20], tokens_d[20];
  slimserve_request_status status, *d_status = NULL;
  slimserve_page_copy copy;
  void *d_copy = NULL, *buffer = NULL, *d_ids = NULL, *d_tags = NULL, *records = NULL, *d_swaps = NULL;
  slimserve_request_pages_view view;
  slimserve_page_swap swaps[2];
  slimserve_request_status swap_statuses[2];
  int64_t buffer_bytes, record_bytes;
  unsigned char header[64];
  int32_t ids[2];
  uint32_t page_tags[2];

  for (i = 0; i < MV_PAGES * MV_PAGE_ELEMS; ++i) {
    k_image[i] = to_bf16((float)uniform());
    v_image[i] = to_bf16((float)uniform());
  }
  for (i = 0; i < 20; ++i) {
    tokens_a[i] = (int32_t)(100 + i);
    tokens_d[i] = (int32_t)(900 + i);
  }
  memset(&cache, 0, sizeof cache);
  cache.k_pages = upload(k_image, cache_bytes);
  cache.v_pages = upload(v_image, cache_bytes);
  cache.num_pages = MV_PAGES;
  cache.page_size = MV_PAGE;
  cache.num_kv_heads = 1;
  cache.head_dim = MV_DIM;
  cache.dtype = SLIMSERVE_KV_BF16;
  CHECK_OK(slimserve_page_pool_create(MV_PAGES, &pool));
  CHECK_OK(slimserve_prefix_cache_create(pool, MV_PAGE, 7, &prefix));
  CHECK_OK(slimserve_request_sets_create(pool, prefix, 4, MV_PAGE, &sets));
  CHECK_OK(slimserve_device_tags_create(MV_PAGES, &tags));
  CHECK_OK(slimserve_device_alloc(sizeof status, (void**)&d_status));

  /* Admit A (20 tokens: 2 pages, both writable by A), fork it, append to the child: its
   * shared last page is copied on write. */
  CHECK_OK(slimserve_request_sets_admit(sets, tokens_a, 20, 0, 0, &a, &plan));
  EXPECT(plan.cached_tokens == 0 && plan.needs_copy == 0);
  CHECK_OK(slimserve_request_sets_pages(sets, a, a_pages, 4, &count));
  EXPECT(count == 2 && slimserve_request_sets_tokens(sets, a) == 20);
  CHECK_OK(slimserve_request_sets_fork(sets, a, &child));
  EXPECT(child.writer != a.writer);
  CHECK_OK(slimserve_request_sets_append(sets, child, 1, &plan));
  EXPECT(plan.needs_copy == 1 && plan.copy_tokens == 4);
  EXPECT(plan.copy_from.id == a_pages[1].id && plan.copy_to.id != a_pages[1].id);
  CHECK_OK(slimserve_request_sets_pages(sets, child, c_pages, 4, &count));
  EXPECT(count == 2 && c_pages[0].id == a_pages[0].id && c_pages[1].id == plan.copy_to.id);

  /* The copy, checked on the host and on the device. */
  copy.src = plan.copy_from.id;
  copy.src_tag = plan.copy_from.tag;
  copy.dst = plan.copy_to.id;
  copy.dst_tag = plan.copy_to.tag;
  copy.writer = child.writer;
  copy.tokens = plan.copy_tokens;
  CHECK_OK(slimserve_check_page_copies(&cache, &copy, 1));
  CHECK_OK(slimserve_device_tags_sync(tags, pool, NULL));
  d_copy = upload(&copy, sizeof copy);
  CHECK_OK(slimserve_copy_pages(&cache, tags, d_copy, 1, d_status, NULL));
  download(&status, d_status, sizeof status);
  EXPECT(status.state == SLIMSERVE_REQUEST_OK);
  slimserve_request_sets_release_copy_sources(sets);
  download(k_after, cache.k_pages, cache_bytes);
  download(v_after, cache.v_pages, cache_bytes);
  EXPECT(same_page(k_after, copy.dst, k_image, copy.src, 4) && same_page(v_after, copy.dst, v_image, copy.src, 4));
  EXPECT(memcmp(k_after + (size_t)copy.dst * MV_PAGE_ELEMS + 4 * MV_DIM,
                k_image + (size_t)copy.dst * MV_PAGE_ELEMS + 4 * MV_DIM,
                (MV_PAGE - 4) * MV_DIM * sizeof(uint16_t)) == 0); /* only the filled slots */

  /* A copy into a page the mover does not own is refused on the device; nothing is written. */
  copy.dst = a_pages[0].id;
  copy.dst_tag = a_pages[0].tag;
  copy.src = c_pages[1].id;
  copy.src_tag = c_pages[1].tag;
  CHECK_OK(slimserve_memcpy_async(d_copy, &copy, sizeof copy, SLIMSERVE_HOST_TO_DEVICE, NULL));
  CHECK_OK(slimserve_copy_pages(&cache, tags, d_copy, 1, d_status, NULL));
  download(&status, d_status, sizeof status);
  EXPECT(status.state == SLIMSERVE_REQUEST_WRITE_DENIED);
  download(k_after, cache.k_pages, cache_bytes);
  EXPECT(same_page(k_after, a_pages[0].id, k_image, a_pages[0].id, MV_PAGE));

  /* Export A's pages; import them into D's fresh pages: byte-exact. */
  CHECK_OK(slimserve_request_sets_admit(sets, tokens_d, 20, 0, 0, &d, NULL));
  CHECK_OK(slimserve_request_sets_pages(sets, d, d_pages, 4, &count));
  CHECK_OK(slimserve_device_tags_sync(tags, pool, NULL));
  buffer_bytes = slimserve_export_buffer_bytes(&cache, 2);
  EXPECT(buffer_bytes >= 64 + 2 * slimserve_page_record_bytes(&cache));
  CHECK_OK(slimserve_device_alloc((size_t)buffer_bytes, &buffer));
  ids[0] = a_pages[0].id;
  ids[1] = a_pages[1].id;
  page_tags[0] = a_pages[0].tag;
  page_tags[1] = a_pages[1].tag;
  d_ids = upload(ids, sizeof ids);
  d_tags = upload(page_tags, sizeof page_tags);
  view.pages = d_ids;
  view.tags = d_tags;
  view.num_pages = 2;
  view.num_tokens = 20;
  view.writer = a.writer;
  CHECK_OK(slimserve_export_request(&cache, tags, &view, buffer, buffer_bytes, d_status, NULL));
  download(&status, d_status, sizeof status);
  EXPECT(status.state == SLIMSERVE_REQUEST_OK);
  download(header, buffer, sizeof header);
  ids[0] = d_pages[0].id;
  ids[1] = d_pages[1].id;
  page_tags[0] = d_pages[0].tag;
  page_tags[1] = d_pages[1].tag;
  CHECK_OK(slimserve_memcpy_async(d_ids, ids, sizeof ids, SLIMSERVE_HOST_TO_DEVICE, NULL));
  CHECK_OK(slimserve_memcpy_async(d_tags, page_tags, sizeof page_tags, SLIMSERVE_HOST_TO_DEVICE, NULL));
  view.writer = d.writer;
  CHECK_OK(slimserve_import_request(&cache, tags, &view, buffer, buffer_bytes, header, sizeof header, d_status, NULL));
  download(&status, d_status, sizeof status);
  EXPECT(status.state == SLIMSERVE_REQUEST_OK);
  download(k_after, cache.k_pages, cache_bytes);
  download(v_after, cache.v_pages, cache_bytes);
  EXPECT(same_page(k_after, d_pages[0].id, k_image, a_pages[0].id, MV_PAGE));
  EXPECT(same_page(v_after, d_pages[0].id, v_image, a_pages[0].id, MV_PAGE));
  /* The last page moves its 4 filled tokens. */
  EXPECT(same_page(k_after, d_pages[1].id, k_image, a_pages[1].id, 4));
  EXPECT(same_page(v_after, d_pages[1].id, v_image, a_pages[1].id, 4));
  header[0] ^= 1u; /* a damaged header is refused before any launch */
  EXPECT(slimserve_import_request(&cache, tags, &view, buffer, buffer_bytes, header, sizeof header, d_status, NULL) != SLIMSERVE_OK);

  /* Swap D's pages out to host records, wipe them, swap them back in. */
  record_bytes = slimserve_page_record_bytes(&cache);
  CHECK_OK(slimserve_host_alloc((size_t)(2 * record_bytes), &records));
  for (i = 0; i < 2; ++i) {
    swaps[i].page = d_pages[i].id;
    swaps[i].tag = d_pages[i].tag;
    swaps[i].writer = d.writer;
    swaps[i].host_slot = (int32_t)(1 - i);
  }
  CHECK_OK(slimserve_check_page_swaps(&cache, swaps, 2, SLIMSERVE_SWAP_OUT, 2));
  EXPECT(slimserve_check_page_swaps(&cache, swaps, 2, SLIMSERVE_SWAP_OUT, 1) != SLIMSERVE_OK);
  d_swaps = upload(swaps, sizeof swaps);
  {
    slimserve_request_status* d_swap_statuses = NULL;
    CHECK_OK(slimserve_device_alloc(sizeof swap_statuses, (void**)&d_swap_statuses));
    CHECK_OK(slimserve_swap_pages(&cache, tags, records, 2, d_swaps, 2, SLIMSERVE_SWAP_OUT, d_swap_statuses, NULL));
    CHECK_OK(slimserve_memset_async((uint16_t*)cache.k_pages + (size_t)d_pages[0].id * MV_PAGE_ELEMS, 0,
                                    MV_PAGE_ELEMS * sizeof(uint16_t), NULL));
    CHECK_OK(slimserve_swap_pages(&cache, tags, records, 2, d_swaps, 2, SLIMSERVE_SWAP_IN, d_swap_statuses, NULL));
    download(swap_statuses, d_swap_statuses, sizeof swap_statuses);
    EXPECT(swap_statuses[0].state == SLIMSERVE_REQUEST_OK && swap_statuses[1].state == SLIMSERVE_REQUEST_OK);
    download(k_after, cache.k_pages, cache_bytes);
    EXPECT(same_page(k_after, d_pages[0].id, k_image, a_pages[0].id, MV_PAGE));
    CHECK_OK(slimserve_device_free(d_swap_statuses));
  }

  /* Preempt D: its pages go back, resume gives it a new identity, and the old reference is
   * refused from then on. */
  CHECK_OK(slimserve_request_sets_preempt(sets, d));
  EXPECT(slimserve_request_sets_is_active(sets, d) == 0);
  EXPECT(slimserve_request_sets_append(sets, d, 1, NULL) == SLIMSERVE_FAILED_PRECONDITION);
  CHECK_OK(slimserve_request_sets_resume(sets, d, tokens_d, 20, 0, 0, &resumed, NULL));
  EXPECT(resumed.writer != d.writer && slimserve_request_sets_is_active(sets, resumed) == 1);
  EXPECT(slimserve_request_sets_finish(sets, d, NULL, 0, 0, 0) == SLIMSERVE_FAILED_PRECONDITION);
  CHECK_OK(slimserve_request_sets_finish(sets, resumed, NULL, 0, 0, 0));
  CHECK_OK(slimserve_request_sets_finish(sets, child, NULL, 0, 0, 0));
  CHECK_OK(slimserve_request_sets_finish(sets, a, tokens_a, 20, 0, 0));
  EXPECT(slimserve_request_sets_finish(sets, a, NULL, 0, 0, 0) == SLIMSERVE_FAILED_PRECONDITION);

  slimserve_request_sets_destroy(sets);
  slimserve_prefix_cache_destroy(prefix);
  slimserve_device_tags_destroy(tags);
  slimserve_page_pool_destroy(pool);
  CHECK_OK(slimserve_host_free(records));
  CHECK_OK(slimserve_device_free(d_swaps));
  CHECK_OK(slimserve_device_free(d_ids));
  CHECK_OK(slimserve_device_free(d_tags));
  CHECK_OK(slimserve_device_free(buffer));
  CHECK_OK(slimserve_device_free(d_copy));
  CHECK_OK(slimserve_device_free(d_status));
  CHECK_OK(slimserve_device_free(cache.k_pages));
  CHECK_OK(slimserve_device_free(cache.v_pages));
  free(k_image);
  free(v_image);
  free(k_after);
  free(v_after);
}

/* Memory refusals: a pointer freed twice is refused (glibc aborted the process before), a
 * page count past the pool is resource_exhausted, not an internal error; the runtime
 * counters see the library's own synchronizations and allocations. */
static void test_memory_refusals_and_counters(void) {
  void* ptr = NULL;
  slimserve_page_pool* pool = NULL;
  slimserve_page page;
  slimserve_runtime_counters before, after;
  memset(&before, 0, sizeof before);
  before.struct_size = sizeof before;
  after = before;
  CHECK_OK(slimserve_get_runtime_counters(&before));
  CHECK_OK(slimserve_device_alloc(64, &ptr));
  CHECK_OK(slimserve_stream_synchronize(NULL));
  CHECK_OK(slimserve_device_free(ptr));
  CHECK_OK(slimserve_get_runtime_counters(&after));
  EXPECT(after.allocations == before.allocations + 1 && after.frees == before.frees + 1);
  EXPECT(after.synchronizations == before.synchronizations + 1);
  if (slimserve_is_emulated()) {
    EXPECT_REFUSED(slimserve_device_free(ptr), SLIMSERVE_FAILED_PRECONDITION, "not a live device allocation");
  }
  CHECK_OK(slimserve_page_pool_create(4, &pool));
  EXPECT_REFUSED(slimserve_page_pool_allocate(pool, &page, (size_t)-1), SLIMSERVE_RESOURCE_EXHAUSTED,
                 "3 are available");
  EXPECT(slimserve_page_pool_available(pool) == 3);
  slimserve_page_pool_destroy(pool);
}

/* slimserve_kv_append: a combined K/V allocation [pages, 2, page] written through its page
 * stride (each token lands in its own page's K and V halves), and vLLM's slot form. */
static void test_kv_append_page_stride_and_slots(void) {
  enum { PAGES = 6, PAGE = 16, HEADS = 2, DIM = 64, TOKENS = 5 };
  const size_t page_elements = (size_t)PAGE * HEADS * DIM;
  const size_t cache_elements = (size_t)PAGES * 2 * page_elements;
  uint16_t* host = (uint16_t*)malloc(cache_elements * sizeof(uint16_t));
  uint16_t* expected = (uint16_t*)malloc(cache_elements * sizeof(uint16_t));
  uint16_t k_new[TOKENS * HEADS * DIM], v_new[TOKENS * HEADS * DIM];
  int64_t slots[TOKENS];
  int32_t indptr[2] = {0, 1}, indices[1] = {3}, last[1] = {TOKENS}, append_indptr[2] = {0, TOKENS};
  slimserve_page_table_view table;
  slimserve_kv_append_args args;
  void* cache;
  void *device_slots, *device_append;
  int32_t t, h, d;
  size_t i;
  for (i = 0; i < (size_t)TOKENS * HEADS * DIM; ++i) {
    k_new[i] = to_bf16((float)uniform());
    v_new[i] = to_bf16((float)uniform());
  }
  for (i = 0; i < cache_elements; ++i) host[i] = expected[i] = 0x7FC0; /* poison: BF16 NaN */
  cache = upload(host, cache_elements * sizeof(uint16_t));
  table.indptr = (const int32_t*)upload(indptr, sizeof indptr);
  table.indices = (const int32_t*)upload(indices, sizeof indices);
  table.last_page_len = (const int32_t*)upload(last, sizeof last);
  table.expected_tags = NULL;
  table.batch_size = 1;
  table.page_size = PAGE;

  memset(&args, 0, sizeof args);
  args.struct_size = sizeof args;
  args.cache.k_pages = cache;
  args.cache.v_pages = (uint16_t*)cache + page_elements;
  args.cache.num_pages = PAGES;
  args.cache.page_size = PAGE;
  args.cache.num_kv_heads = HEADS;
  args.cache.head_dim = DIM;
  args.cache.dtype = SLIMSERVE_KV_BF16;
  args.cache.layout = SLIMSERVE_KV_NHD;
  args.kv_page_stride = (int64_t)(2 * page_elements);
  args.table = &table;
  args.k_new = upload(k_new, sizeof k_new);
  args.v_new = upload(v_new, sizeof v_new);
  args.input_dtype = SLIMSERVE_ACT_BF16;
  args.num_tokens = TOKENS;
  device_append = upload(append_indptr, sizeof append_indptr);
  args.append_indptr = (const int32_t*)device_append;
  CHECK_OK(slimserve_kv_append(&args, NULL));
  for (t = 0; t < TOKENS; ++t) {
    for (h = 0; h < HEADS; ++h) {
      for (d = 0; d < DIM; ++d) {
        const size_t row = ((size_t)t * HEADS + (size_t)h) * DIM + (size_t)d;
        expected[3 * 2 * page_elements + row] = k_new[row];
        expected[3 * 2 * page_elements + page_elements + row] = v_new[row];
      }
    }
  }
  download(host, cache, cache_elements * sizeof(uint16_t));
  EXPECT(memcmp(host, expected, cache_elements * sizeof(uint16_t)) == 0);

  /* The slot form: token t to flat slot slots[t]; -1 and a slot past the cache write nothing. */
  slots[0] = 2 * PAGE + 7;
  slots[1] = -1;
  slots[2] = 5 * PAGE + 15;
  slots[3] = (int64_t)PAGES * PAGE + 3;
  slots[4] = 0;
  args.append_indptr = NULL;
  args.table = NULL;
  device_slots = upload(slots, sizeof slots);
  args.slot_mapping = (const int64_t*)device_slots;
  CHECK_OK(slimserve_kv_append(&args, NULL));
  for (t = 0; t < TOKENS; ++t) {
    const int64_t page = slots[t] / PAGE, offset = slots[t] % PAGE;
    if (slots[t] < 0 || page >= PAGES) continue;
    for (i = 0; i < (size_t)HEADS * DIM; ++i) {
      const size_t at = (size_t)page * 2 * page_elements + (size_t)offset * HEADS * DIM + i;
      expected[at] = k_new[(size_t)t * HEADS * DIM + i];
      expected[at + page_elements] = v_new[(size_t)t * HEADS * DIM + i];
    }
  }
  download(host, cache, cache_elements * sizeof(uint16_t));
  EXPECT(memcmp(host, expected, cache_elements * sizeof(uint16_t)) == 0);

  /* Strided rows (the K and V slices of a fused [tokens, q | k | v] projection): token rows
   * STRIDE elements apart, every gap element NaN. Into a freshly poisoned cache, the same
   * slots must give exactly the slot writes above: no gap element was read. */
  {
    enum { ROW = HEADS * DIM, STRIDE = 3 * ROW + 8 };
    uint16_t* fused = (uint16_t*)malloc((size_t)TOKENS * STRIDE * sizeof(uint16_t));
    uint16_t* strided_expected = (uint16_t*)malloc(cache_elements * sizeof(uint16_t));
    const void* packed_k = args.k_new;
    const void* packed_v = args.v_new;
    void* device_fused;
    for (i = 0; i < (size_t)TOKENS * STRIDE; ++i) fused[i] = 0x7FC0;
    for (t = 0; t < TOKENS; ++t) {
      for (i = 0; i < (size_t)ROW; ++i) {
        fused[(size_t)t * STRIDE + ROW + i] = k_new[(size_t)t * ROW + i];     /* k after a q of one row */
        fused[(size_t)t * STRIDE + 2 * ROW + i] = v_new[(size_t)t * ROW + i]; /* v after k */
      }
    }
    for (i = 0; i < cache_elements; ++i) host[i] = strided_expected[i] = 0x7FC0;
    for (t = 0; t < TOKENS; ++t) {
      const int64_t page = slots[t] / PAGE, offset = slots[t] % PAGE;
      if (slots[t] < 0 || page >= PAGES) continue;
      for (i = 0; i < (size_t)ROW; ++i) {
        const size_t at = (size_t)page * 2 * page_elements + (size_t)offset * ROW + i;
        strided_expected[at] = k_new[(size_t)t * ROW + i];
        strided_expected[at + page_elements] = v_new[(size_t)t * ROW + i];
      }
    }
    CHECK_OK(slimserve_memcpy_async(cache, host, cache_elements * sizeof(uint16_t), SLIMSERVE_HOST_TO_DEVICE, NULL));
    CHECK_OK(slimserve_stream_synchronize(NULL));
    device_fused = upload(fused, (size_t)TOKENS * STRIDE * sizeof(uint16_t));
    args.k_new = (const uint16_t*)device_fused + ROW;
    args.v_new = (const uint16_t*)device_fused + 2 * ROW;
    args.k_row_stride = STRIDE;
    args.v_row_stride = STRIDE;
    CHECK_OK(slimserve_kv_append(&args, NULL));
    download(host, cache, cache_elements * sizeof(uint16_t));
    EXPECT(memcmp(host, strided_expected, cache_elements * sizeof(uint16_t)) == 0);
    /* Refused by name, nothing written: a stride under a row, one that breaks 16-byte loads. */
    args.k_row_stride = ROW - 8;
    EXPECT_REFUSED(slimserve_kv_append(&args, NULL), SLIMSERVE_INVALID_ARGUMENT, "k_row_stride");
    args.k_row_stride = STRIDE;
    args.v_row_stride = STRIDE + 4;
    EXPECT_REFUSED(slimserve_kv_append(&args, NULL), SLIMSERVE_INVALID_ARGUMENT, "v_row_stride");
    download(host, cache, cache_elements * sizeof(uint16_t));
    EXPECT(memcmp(host, strided_expected, cache_elements * sizeof(uint16_t)) == 0);
    /* A caller built before the row strides (struct_size ends at slot_mapping) means packed
     * rows: the packed inputs give the same bytes. */
    args.k_new = packed_k;
    args.v_new = packed_v;
    args.struct_size = offsetof(slimserve_kv_append_args, k_row_stride);
    CHECK_OK(slimserve_kv_append(&args, NULL));
    download(host, cache, cache_elements * sizeof(uint16_t));
    EXPECT(memcmp(host, strided_expected, cache_elements * sizeof(uint16_t)) == 0);
    args.struct_size = sizeof args;
    args.k_row_stride = 0;
    args.v_row_stride = 0;
    CHECK_OK(slimserve_device_free(device_fused));
    free(fused);
    free(strided_expected);
  }

  /* Refusals: two forms at once, a page stride shorter than a page, no table without slots. */
  args.append_indptr = (const int32_t*)device_append;
  EXPECT_REFUSED(slimserve_kv_append(&args, NULL), SLIMSERVE_INVALID_ARGUMENT, "one form of destinations");
  args.slot_mapping = NULL;
  EXPECT_REFUSED(slimserve_kv_append(&args, NULL), SLIMSERVE_INVALID_ARGUMENT, "table is null");
  args.table = &table;
  args.kv_page_stride = (int64_t)page_elements - 8;
  EXPECT_REFUSED(slimserve_kv_append(&args, NULL), SLIMSERVE_INVALID_ARGUMENT, "page_stride");
  args.struct_size = 8;
  EXPECT_REFUSED(slimserve_kv_append(&args, NULL), SLIMSERVE_INVALID_ARGUMENT, "struct_size");
  /* The rotation: an unknown value, or a nonzero reserved word, is refused by name. */
  args.struct_size = sizeof args;
  args.kv_page_stride = (int64_t)(2 * page_elements);
  args.rotation = 3;
  EXPECT_REFUSED(slimserve_kv_append(&args, NULL), SLIMSERVE_INVALID_ARGUMENT, "rotation");
  args.rotation = SLIMSERVE_KV_ROTATION_KEYS;
  args.reserved = 1;
  EXPECT_REFUSED(slimserve_kv_append(&args, NULL), SLIMSERVE_INVALID_ARGUMENT, "reserved");
  args.reserved = 0;
  args.rotation = SLIMSERVE_KV_ROTATION_NONE;
  CHECK_OK(slimserve_device_free(device_append));
  CHECK_OK(slimserve_device_free(device_slots));
  CHECK_OK(slimserve_device_free((void*)args.k_new));
  CHECK_OK(slimserve_device_free((void*)args.v_new));
  CHECK_OK(slimserve_device_free((void*)table.indptr));
  CHECK_OK(slimserve_device_free((void*)table.indices));
  CHECK_OK(slimserve_device_free((void*)table.last_page_len));
  CHECK_OK(slimserve_device_free(cache));
  free(host);
  free(expected);
}

/* ABI 3's check with every option: the table's age on the host and as a device word, bounded
 * rows, device-held fills. Pool pages are granted to nobody, so the check reads as nobody. */
static void test_check_page_tags_with(void) {
  slimserve_page_pool* pool = NULL;
  slimserve_device_tags* tags = NULL;
  slimserve_page_table* table = NULL;
  slimserve_page pages[3], fresh;
  slimserve_request_pages request;
  slimserve_page_table_view device_view;
  slimserve_tag_check_args args;
  slimserve_request_status got[1];
  slimserve_request_status* d_status = NULL;
  int32_t* d_count = NULL;
  void* d_age = NULL;
  void* fills = NULL;
  uint64_t epoch = 0, age_word[2];
  uint32_t pool_id = 0;
  int32_t count;
  CHECK_OK(slimserve_page_pool_create(16, &pool));
  CHECK_OK(slimserve_device_tags_create(16, &tags));
  CHECK_OK(slimserve_page_table_create(2, 8, 16, 16, &table));
  CHECK_OK(slimserve_page_pool_allocate(pool, pages, 3));
  CHECK_OK(slimserve_device_alloc(sizeof got, (void**)&d_status));
  CHECK_OK(slimserve_device_alloc(sizeof count, (void**)&d_count));
  CHECK_OK(slimserve_device_alloc(sizeof age_word, &d_age));
  CHECK_OK(slimserve_device_tags_fills(tags, &fills));
  EXPECT(fills != NULL);
  EXPECT(slimserve_device_tags_fills(tags, NULL) == SLIMSERVE_INVALID_ARGUMENT);
  request.pages = pages;
  request.num_pages = 2;
  request.num_tokens = 20;
  CHECK_OK(slimserve_page_table_build(table, &request, 1, NULL, NULL, &device_view));
  CHECK_OK(slimserve_device_tags_sync(tags, pool, NULL));
  CHECK_OK(slimserve_page_pool_table_age(pool, &epoch, &pool_id));
  EXPECT(epoch > 0);
  memset(&args, 0, sizeof args);
  args.struct_size = sizeof args;
  args.table = &device_view;
  args.tags = tags;
  args.statuses = d_status;
  args.built_at_epoch = epoch;
  args.built_at_pool = pool_id;
  CHECK_OK(slimserve_check_page_tags_with(&args, NULL));
  download(got, d_status, sizeof got);
  EXPECT(got[0].state == SLIMSERVE_REQUEST_OK);
  /* Bounded rows: a count of 1 entry refuses the row's second page. */
  count = 1;
  CHECK_OK(slimserve_memcpy_async(d_count, &count, sizeof count, SLIMSERVE_HOST_TO_DEVICE, NULL));
  args.num_entries = d_count;
  args.entry_capacity = 8;
  CHECK_OK(slimserve_check_page_tags_with(&args, NULL));
  download(got, d_status, sizeof got);
  EXPECT(got[0].state == SLIMSERVE_REQUEST_BAD_PAGE_TABLE);
  args.num_entries = NULL;
  /* Device-held lengths: nothing was written into these pages. */
  args.check_fill = 1;
  CHECK_OK(slimserve_check_page_tags_with(&args, NULL));
  download(got, d_status, sizeof got);
  EXPECT(got[0].state == SLIMSERVE_REQUEST_UNWRITTEN_SLOTS);
  args.check_fill = 2;
  EXPECT(slimserve_check_page_tags_with(&args, NULL) == SLIMSERVE_INVALID_ARGUMENT);
  args.check_fill = 0;
  /* The pool changes after the sync: refused on the host, nothing launched ... */
  CHECK_OK(slimserve_page_pool_allocate(pool, &fresh, 1));
  CHECK_OK(slimserve_page_pool_table_age(pool, &epoch, &pool_id));
  args.built_at_epoch = epoch;
  EXPECT(slimserve_check_page_tags_with(&args, NULL) == SLIMSERVE_FAILED_PRECONDITION);
  /* ... and, replayed without the host comparison, on the device by the age word. */
  args.built_at_epoch = 0;
  age_word[0] = epoch;
  age_word[1] = pool_id;
  CHECK_OK(slimserve_memcpy_async(d_age, age_word, sizeof age_word, SLIMSERVE_HOST_TO_DEVICE, NULL));
  args.device_built_at = d_age;
  CHECK_OK(slimserve_check_page_tags_with(&args, NULL));
  download(got, d_status, sizeof got);
  EXPECT(got[0].state == SLIMSERVE_REQUEST_TAGS_NOT_SYNCED);
  CHECK_OK(slimserve_device_tags_sync(tags, pool, NULL));
  CHECK_OK(slimserve_check_page_tags_with(&args, NULL));
  download(got, d_status, sizeof got);
  EXPECT(got[0].state == SLIMSERVE_REQUEST_OK);
  /* A struct from a newer header that sets a byte this library does not know. */
  EXPECT(slimserve_check_page_tags_with(NULL, NULL) == SLIMSERVE_INVALID_ARGUMENT);
  args.struct_size = 4;
  EXPECT(slimserve_check_page_tags_with(&args, NULL) == SLIMSERVE_INVALID_ARGUMENT);
  CHECK_OK(slimserve_device_free(d_status));
  CHECK_OK(slimserve_device_free(d_count));
  CHECK_OK(slimserve_device_free(d_age));
  slimserve_page_table_destroy(table);
  slimserve_device_tags_destroy(tags);
  slimserve_page_pool_destroy(pool);
}

/* Identity on the records that leave the cache, over ABI 3's *_with entry points: another
 * request's export buffer of the same shape, a stale sequence and another request's swap
 * slot are refused (record_mismatch) with the destination, poisoned beforehand, unchanged
 * byte for byte; the right identity moves every byte. */
static int same_identity(slimserve_record_identity a, slimserve_record_identity b) {
  return a.pool == b.pool && a.writer == b.writer && a.sequence == b.sequence;
}
static void test_record_identities(void) {
  const size_t cache_bytes = (size_t)MV_PAGES * MV_PAGE_ELEMS * sizeof(uint16_t);
  uint16_t* k_image = malloc(cache_bytes);
  uint16_t* v_image = malloc(cache_bytes);
  uint16_t* k_before = malloc(cache_bytes);
  uint16_t* v_before = malloc(cache_bytes);
  uint16_t* k_after = malloc(cache_bytes);
  uint16_t* v_after = malloc(cache_bytes);
  slimserve_page_pool* pool = NULL;
  slimserve_device_tags* tags = NULL;
  slimserve_kv_cache cache;
  slimserve_page pages[6]; /* A: 0-1, B: 2-3, D (the destination): 4-5 */
  uint32_t writers[3];
  slimserve_record_identity id_a, id_b, claimed, stale;
  slimserve_export_args ex;
  slimserve_import_args im;
  slimserve_swap_args sw;
  slimserve_request_status status, swap_status[2];
  slimserve_request_status *d_status = NULL, *d_swap_status = NULL;
  slimserve_page_swap swaps[4];
  slimserve_record_identity identities[4];
  void *buf_a = NULL, *buf_b = NULL, *d_pages = NULL, *d_tags = NULL, *records = NULL;
  void *d_swaps = NULL, *d_identities = NULL;
  unsigned char header_a[64], header_b[64];
  int32_t ids[6];
  uint32_t page_tags[6];
  uint64_t epoch = 0;
  uint32_t pool_id = 0;
  int64_t buffer_bytes;
  const int64_t tokens = MV_PAGE + 1 + below(MV_PAGE - 1); /* two pages, the last partly filled */
  const int32_t last_tokens = (int32_t)(tokens - MV_PAGE);
  size_t i;

  for (i = 0; i < MV_PAGES * MV_PAGE_ELEMS; ++i) {
    k_image[i] = to_bf16((float)uniform());
    v_image[i] = to_bf16((float)uniform());
  }
  memset(&cache, 0, sizeof cache);
  cache.k_pages = upload(k_image, cache_bytes);
  cache.v_pages = upload(v_image, cache_bytes);
  cache.num_pages = MV_PAGES;
  cache.page_size = MV_PAGE;
  cache.num_kv_heads = 1;
  cache.head_dim = MV_DIM;
  cache.dtype = SLIMSERVE_KV_BF16;
  CHECK_OK(slimserve_page_pool_create(MV_PAGES, &pool));
  CHECK_OK(slimserve_device_tags_create(MV_PAGES, &tags));
  CHECK_OK(slimserve_page_pool_allocate(pool, pages, 6));
  for (i = 0; i < 3; ++i) CHECK_OK(slimserve_page_pool_new_writer(pool, &writers[i]));
  for (i = 0; i < 6; ++i) {
    CHECK_OK(slimserve_page_pool_grant_write(pool, pages[i], writers[i / 2]));
    ids[i] = pages[i].id;
    page_tags[i] = pages[i].tag;
  }
  CHECK_OK(slimserve_device_tags_sync(tags, pool, NULL));
  CHECK_OK(slimserve_page_pool_table_age(pool, &epoch, &pool_id));
  d_pages = upload(ids, sizeof ids);
  d_tags = upload(page_tags, sizeof page_tags);
  CHECK_OK(slimserve_device_alloc(sizeof status, (void**)&d_status));
  CHECK_OK(slimserve_device_alloc(sizeof swap_status, (void**)&d_swap_status));
  id_a.pool = pool_id;
  id_a.writer = writers[0];
  id_a.sequence = 1;
  id_b = id_a;
  id_b.writer = writers[1];

  /* Export A and B (the same shape) under their identities. */
  buffer_bytes = slimserve_export_buffer_bytes(&cache, 2);
  CHECK_OK(slimserve_device_alloc((size_t)buffer_bytes, &buf_a));
  CHECK_OK(slimserve_device_alloc((size_t)buffer_bytes, &buf_b));
  memset(&ex, 0, sizeof ex);
  ex.struct_size = sizeof ex;
  ex.cache = cache;
  ex.tags = tags;
  ex.request.pages = d_pages;
  ex.request.tags = d_tags;
  ex.request.num_pages = 2;
  ex.request.num_tokens = tokens;
  ex.request.writer = writers[0];
  ex.buffer = buf_a;
  ex.buffer_bytes = buffer_bytes;
  ex.status = d_status;
  ex.identity = id_a;
  CHECK_OK(slimserve_export_request_with(&ex, NULL));
  download(&status, d_status, sizeof status);
  EXPECT(status.state == SLIMSERVE_REQUEST_OK);
  ex.request.pages = (int32_t*)d_pages + 2;
  ex.request.tags = (uint32_t*)d_tags + 2;
  ex.request.writer = writers[1];
  ex.buffer = buf_b;
  ex.identity = id_b;
  CHECK_OK(slimserve_export_request_with(&ex, NULL));
  download(&status, d_status, sizeof status);
  EXPECT(status.state == SLIMSERVE_REQUEST_OK);
  ex.struct_size = 4;
  EXPECT(slimserve_export_request_with(&ex, NULL) == SLIMSERVE_INVALID_ARGUMENT);
  download(header_a, buf_a, sizeof header_a);
  download(header_b, buf_b, sizeof header_b);
  /* What each buffer claims: what the sending side's metadata can carry. */
  CHECK_OK(slimserve_read_buffer_identity(header_b, sizeof header_b, &claimed));
  EXPECT(same_identity(claimed, id_b));
  CHECK_OK(slimserve_read_buffer_identity(header_a, sizeof header_a, &claimed));
  EXPECT(same_identity(claimed, id_a));
  EXPECT(slimserve_read_buffer_identity(header_a, 16, &claimed) != SLIMSERVE_OK);
  EXPECT(slimserve_read_buffer_identity(header_a, sizeof header_a, NULL) == SLIMSERVE_INVALID_ARGUMENT);

  /* D's pages poisoned (fresh random bytes), then imports that must be refused. */
  for (i = 4; i < 6; ++i) {
    size_t j;
    for (j = 0; j < MV_PAGE_ELEMS; ++j) {
      k_image[(size_t)pages[i].id * MV_PAGE_ELEMS + j] = to_bf16((float)uniform() * 7.0f);
      v_image[(size_t)pages[i].id * MV_PAGE_ELEMS + j] = to_bf16((float)uniform() * 7.0f);
    }
  }
  CHECK_OK(slimserve_memcpy_async(cache.k_pages, k_image, cache_bytes, SLIMSERVE_HOST_TO_DEVICE, NULL));
  CHECK_OK(slimserve_memcpy_async(cache.v_pages, v_image, cache_bytes, SLIMSERVE_HOST_TO_DEVICE, NULL));
  download(k_before, cache.k_pages, cache_bytes);
  download(v_before, cache.v_pages, cache_bytes);
  memset(&im, 0, sizeof im);
  im.struct_size = sizeof im;
  im.cache = cache;
  im.tags = tags;
  im.request.pages = (int32_t*)d_pages + 4;
  im.request.tags = (uint32_t*)d_tags + 4;
  im.request.num_pages = 2;
  im.request.num_tokens = tokens;
  im.request.writer = writers[2];
  im.buffer = buf_b; /* B's buffer where A's is expected */
  im.buffer_bytes = buffer_bytes;
  im.header = header_b;
  im.header_bytes = sizeof header_b;
  im.status = d_status;
  im.expected = id_a;
  CHECK_OK(slimserve_import_request_with(&im, NULL));
  download(&status, d_status, sizeof status);
  EXPECT(status.state == SLIMSERVE_REQUEST_RECORD_MISMATCH);
  stale = id_a; /* A's buffer, but an older record set of A */
  stale.sequence = 0;
  im.buffer = buf_a;
  im.header = header_a;
  im.expected = stale;
  CHECK_OK(slimserve_import_request_with(&im, NULL));
  download(&status, d_status, sizeof status);
  EXPECT(status.state == SLIMSERVE_REQUEST_RECORD_MISMATCH);
  download(k_after, cache.k_pages, cache_bytes);
  download(v_after, cache.v_pages, cache_bytes);
  EXPECT(memcmp(k_after, k_before, cache_bytes) == 0 && memcmp(v_after, v_before, cache_bytes) == 0);
  im.expected.writer = 0; /* no expected identity: refused before any launch */
  EXPECT(slimserve_import_request_with(&im, NULL) == SLIMSERVE_INVALID_ARGUMENT);
  EXPECT(message_has("expected"));
  im.expected = id_a;
  im.struct_size = 0;
  EXPECT(slimserve_import_request_with(&im, NULL) == SLIMSERVE_INVALID_ARGUMENT);
  im.struct_size = sizeof im;

  /* The right identity: every filled byte of A's pages lands, the rest of D's pages keep the poison. */
  CHECK_OK(slimserve_import_request_with(&im, NULL));
  download(&status, d_status, sizeof status);
  EXPECT(status.state == SLIMSERVE_REQUEST_OK);
  download(k_after, cache.k_pages, cache_bytes);
  download(v_after, cache.v_pages, cache_bytes);
  EXPECT(same_page(k_after, pages[4].id, k_image, pages[0].id, MV_PAGE));
  EXPECT(same_page(v_after, pages[4].id, v_image, pages[0].id, MV_PAGE));
  EXPECT(same_page(k_after, pages[5].id, k_image, pages[1].id, (size_t)last_tokens));
  EXPECT(same_page(v_after, pages[5].id, v_image, pages[1].id, (size_t)last_tokens));
  EXPECT(memcmp(k_after + (size_t)pages[5].id * MV_PAGE_ELEMS + (size_t)last_tokens * MV_DIM,
                k_before + (size_t)pages[5].id * MV_PAGE_ELEMS + (size_t)last_tokens * MV_DIM,
                (size_t)(MV_PAGE - last_tokens) * MV_DIM * sizeof(uint16_t)) == 0);
  for (i = 0; i < 4; ++i) EXPECT(same_page(k_after, pages[i].id, k_before, pages[i].id, MV_PAGE));

  /* Swap: A's pages to slots 0-1 and B's to slots 2-3, each under its identity (sequence 3). */
  CHECK_OK(slimserve_host_alloc((size_t)(4 * slimserve_page_record_bytes(&cache)), &records));
  for (i = 0; i < 4; ++i) {
    swaps[i].page = pages[i].id;
    swaps[i].tag = pages[i].tag;
    swaps[i].writer = writers[i / 2];
    swaps[i].host_slot = (int32_t)i;
    identities[i] = i < 2 ? id_a : id_b;
    identities[i].sequence = 3;
  }
  d_swaps = upload(swaps, sizeof swaps);
  d_identities = upload(identities, sizeof identities);
  memset(&sw, 0, sizeof sw);
  sw.struct_size = sizeof sw;
  sw.cache = cache;
  sw.tags = tags;
  sw.host_records = records;
  sw.host_slots = 4;
  sw.swaps = d_swaps;
  sw.num_swaps = 4;
  sw.direction = SLIMSERVE_SWAP_OUT;
  sw.identities = d_identities;
  {
    slimserve_request_status out_status[4];
    slimserve_request_status* d_out_status = NULL;
    CHECK_OK(slimserve_device_alloc(sizeof out_status, (void**)&d_out_status));
    sw.statuses = d_out_status;
    CHECK_OK(slimserve_swap_pages_with(&sw, NULL));
    download(out_status, d_out_status, sizeof out_status);
    for (i = 0; i < 4; ++i) EXPECT(out_status[i].state == SLIMSERVE_REQUEST_OK);
    CHECK_OK(slimserve_device_free(d_out_status));
  }
  sw.direction = 7;
  EXPECT(slimserve_swap_pages_with(&sw, NULL) == SLIMSERVE_INVALID_ARGUMENT);

  /* Swap-in into D's pages (poisoned again) from B's slots while expecting A: refused. */
  for (i = 0; i < 2; ++i) {
    size_t j;
    for (j = 0; j < MV_PAGE_ELEMS; ++j) k_image[(size_t)pages[4 + i].id * MV_PAGE_ELEMS + j] = to_bf16((float)uniform() * 5.0f);
    swaps[i].page = pages[4 + i].id;
    swaps[i].tag = pages[4 + i].tag;
    swaps[i].writer = writers[2];
    swaps[i].host_slot = (int32_t)(2 + i);
    identities[i] = id_a;
    identities[i].sequence = 3;
  }
  CHECK_OK(slimserve_memcpy_async(cache.k_pages, k_image, cache_bytes, SLIMSERVE_HOST_TO_DEVICE, NULL));
  CHECK_OK(slimserve_memcpy_async(d_swaps, swaps, 2 * sizeof swaps[0], SLIMSERVE_HOST_TO_DEVICE, NULL));
  CHECK_OK(slimserve_memcpy_async(d_identities, identities, 2 * sizeof identities[0], SLIMSERVE_HOST_TO_DEVICE, NULL));
  download(k_before, cache.k_pages, cache_bytes);
  download(v_before, cache.v_pages, cache_bytes);
  sw.direction = SLIMSERVE_SWAP_IN;
  sw.num_swaps = 2;
  sw.statuses = d_swap_status;
  CHECK_OK(slimserve_swap_pages_with(&sw, NULL));
  download(swap_status, d_swap_status, sizeof swap_status);
  EXPECT(swap_status[0].state == SLIMSERVE_REQUEST_RECORD_MISMATCH);
  EXPECT(swap_status[1].state == SLIMSERVE_REQUEST_RECORD_MISMATCH);
  /* The old entry point expects the mover's own identity (D, sequence 0): refused too. */
  CHECK_OK(slimserve_swap_pages(&cache, tags, records, 4, d_swaps, 2, SLIMSERVE_SWAP_IN, d_swap_status, NULL));
  download(swap_status, d_swap_status, sizeof swap_status);
  EXPECT(swap_status[0].state == SLIMSERVE_REQUEST_RECORD_MISMATCH);
  download(k_after, cache.k_pages, cache_bytes);
  download(v_after, cache.v_pages, cache_bytes);
  EXPECT(memcmp(k_after, k_before, cache_bytes) == 0 && memcmp(v_after, v_before, cache_bytes) == 0);

  /* From A's slots with A's identity: the whole pages land. */
  swaps[0].host_slot = 1; /* shuffled: slot 1 into D's first page, slot 0 into its second */
  swaps[1].host_slot = 0;
  CHECK_OK(slimserve_memcpy_async(d_swaps, swaps, 2 * sizeof swaps[0], SLIMSERVE_HOST_TO_DEVICE, NULL));
  CHECK_OK(slimserve_swap_pages_with(&sw, NULL));
  download(swap_status, d_swap_status, sizeof swap_status);
  EXPECT(swap_status[0].state == SLIMSERVE_REQUEST_OK && swap_status[1].state == SLIMSERVE_REQUEST_OK);
  download(k_after, cache.k_pages, cache_bytes);
  download(v_after, cache.v_pages, cache_bytes);
  EXPECT(same_page(k_after, pages[4].id, k_image, pages[1].id, MV_PAGE));
  EXPECT(same_page(v_after, pages[4].id, v_image, pages[1].id, MV_PAGE));
  EXPECT(same_page(k_after, pages[5].id, k_image, pages[0].id, MV_PAGE));
  EXPECT(same_page(v_after, pages[5].id, v_image, pages[0].id, MV_PAGE));

  /* The ABI 1 import keeps its behaviour: B's buffer passes its own claim's integrity check. */
  CHECK_OK(slimserve_import_request(&cache, tags, &im.request, buf_b, buffer_bytes, header_b,
                                    sizeof header_b, d_status, NULL));
  download(&status, d_status, sizeof status);
  EXPECT(status.state == SLIMSERVE_REQUEST_OK);

  CHECK_OK(slimserve_host_free(records));
  CHECK_OK(slimserve_device_free(d_swaps));
  CHECK_OK(slimserve_device_free(d_identities));
  CHECK_OK(slimserve_device_free(d_pages));
  CHECK_OK(slimserve_device_free(d_tags));
  CHECK_OK(slimserve_device_free(buf_a));
  CHECK_OK(slimserve_device_free(buf_b));
  CHECK_OK(slimserve_device_free(d_status));
  CHECK_OK(slimserve_device_free(d_swap_status));
  CHECK_OK(slimserve_device_free(cache.k_pages));
  CHECK_OK(slimserve_device_free(cache.v_pages));
  slimserve_device_tags_destroy(tags);
  slimserve_page_pool_destroy(pool);
  free(k_image);
  free(v_image);
  free(k_before);
  free(v_before);
  free(k_after);
  free(v_after);
}

/* Pages a transfer engine filled become a request (slimserve_request_sets_adopt, all or
 * nothing), and a built transfer list coalesces in place (slimserve_coalesce_transfer_list). */
static void test_adopt_and_coalesce(void) {
  slimserve_page_pool* pool = NULL;
  slimserve_request_sets* sets = NULL;
  slimserve_page pages[3], twice[3], got[4];
  slimserve_request_ref ref = {-1, 0}, none = {-1, 0};
  slimserve_transfer_entry rows[4];
  size_t count = 0;
  int32_t available;
  uint32_t i;
  CHECK_OK(slimserve_page_pool_create(16, &pool));
  CHECK_OK(slimserve_request_sets_create(pool, NULL, 2, 4, &sets));
  available = slimserve_page_pool_available(pool);
  CHECK_OK(slimserve_page_pool_allocate(pool, pages, 3));
  EXPECT(slimserve_request_sets_adopt(sets, pages, 3, 13, &none) == SLIMSERVE_INVALID_ARGUMENT);  /* 4 pages */
  EXPECT(message_has("nothing was taken") && none.slot == -1);
  twice[0] = pages[0];
  twice[1] = pages[1];
  twice[2] = pages[0];
  EXPECT(slimserve_request_sets_adopt(sets, twice, 3, 10, &none) == SLIMSERVE_INVALID_ARGUMENT);
  EXPECT(message_has("listed twice"));
  EXPECT(slimserve_request_sets_adopt(sets, NULL, 3, 10, &none) == SLIMSERVE_INVALID_ARGUMENT);
  CHECK_OK(slimserve_page_pool_share(pool, pages[2]));
  EXPECT(slimserve_request_sets_adopt(sets, pages, 3, 10, &none) == SLIMSERVE_FAILED_PRECONDITION);
  EXPECT(message_has("shared"));
  CHECK_OK(slimserve_page_pool_release(pool, &pages[2], 1));
  for (i = 0; i < 3; ++i) EXPECT(slimserve_page_pool_writer(pool, pages[i].id) == 0);
  CHECK_OK(slimserve_request_sets_adopt(sets, pages, 3, 10, &ref));
  EXPECT(ref.writer != 0 && slimserve_request_sets_tokens(sets, ref) == 10);
  CHECK_OK(slimserve_request_sets_pages(sets, ref, got, 4, &count));
  EXPECT(count == 3);
  for (i = 0; i < 3 && i < count; ++i) {
    EXPECT(got[i].id == pages[i].id && got[i].tag == pages[i].tag);
    EXPECT(slimserve_page_pool_writer(pool, pages[i].id) == ref.writer);
  }
  CHECK_OK(slimserve_request_sets_finish(sets, ref, NULL, 0, 0, 0));
  EXPECT(slimserve_page_pool_available(pool) == available);

  /* Two runs in any order: 0x1000..0x1300 -> 0x9000.. and a piece that touches on one side only. */
  rows[0].src = 0x1100; rows[0].dst = 0x9100; rows[0].bytes = 0x100;
  rows[1].src = 0x1000; rows[1].dst = 0x9000; rows[1].bytes = 0x100;
  rows[2].src = 0x1300; rows[2].dst = 0x7000; rows[2].bytes = 0x80;  /* continues the source only */
  rows[3].src = 0x1200; rows[3].dst = 0x9200; rows[3].bytes = 0x100;
  CHECK_OK(slimserve_coalesce_transfer_list(rows, 4, &count));
  EXPECT(count == 2);
  EXPECT(rows[0].src == 0x1000 && rows[0].dst == 0x9000 && rows[0].bytes == 0x300);
  EXPECT(rows[1].src == 0x1300 && rows[1].dst == 0x7000 && rows[1].bytes == 0x80);
  EXPECT(slimserve_coalesce_transfer_list(rows, 4, NULL) == SLIMSERVE_INVALID_ARGUMENT);
  slimserve_request_sets_destroy(sets);
  slimserve_page_pool_destroy(pool);
}

/* NVFP4 by name: the C enum has it, the byte geometry is its head vector's (72 B at D = 128:
 * 64 B of E2M1 codes, 8 E4M3 block scales), the append writes and dequantize reads it, and
 * the attention entry points (no NVFP4 kernel yet) refuse it as unsupported, naming it. */
static void test_nvfp4_by_name(void) {
  slimserve_kv_cache cache;
  slimserve_cache_layout layout;
  slimserve_decode_problem problem;
  const int32_t indptr[2] = {0, 1}, last_page_len[1] = {5};
  const float one = 1.0f;
  void* pages = NULL;
  void* scale = NULL;
  void* out = NULL;
  int32_t* page_ids = NULL;
  size_t bytes = 0;
  EXPECT(SLIMSERVE_KV_NVFP4 == 4);
  CHECK_OK(slimserve_device_alloc(4 * 16 * 2 * 72, &pages)); /* K and V, 2 pages each */
  CHECK_OK(slimserve_device_alloc(sizeof one, &scale));
  CHECK_OK(slimserve_device_alloc(16 * 2 * 128 * 2, &out));
  CHECK_OK(slimserve_device_alloc(sizeof(int32_t), (void**)&page_ids));
  CHECK_OK(slimserve_memcpy_async(scale, &one, sizeof one, SLIMSERVE_HOST_TO_DEVICE, NULL));
  memset(&cache, 0, sizeof cache);
  cache.k_pages = pages;
  cache.v_pages = (char*)pages + 2 * 16 * 2 * 72;
  cache.k_scale = cache.v_scale = (const float*)scale;
  cache.num_pages = 2;
  cache.page_size = 16;
  cache.num_kv_heads = 2;
  cache.head_dim = 128;
  cache.dtype = SLIMSERVE_KV_NVFP4;
  cache.layout = SLIMSERVE_KV_NHD;
  cache.scale_mode = SLIMSERVE_SCALE_PER_TENSOR;
  CHECK_OK(slimserve_describe_kv_cache(&cache, 0, &layout));
  EXPECT(layout.dtype == SLIMSERVE_KV_NVFP4 && layout.token_bytes == 72);
  EXPECT(layout.k.page_stride == 16 * 2 * 72 && layout.k.bytes == 2 * 16 * 2 * 72);
  cache.scale_mode = SLIMSERVE_SCALE_NONE; /* its tensor scale is required */
  EXPECT_REFUSED(slimserve_describe_kv_cache(&cache, 0, &layout), SLIMSERVE_INVALID_ARGUMENT, "nvfp4 cache needs scales");
  cache.scale_mode = SLIMSERVE_SCALE_PER_TENSOR;
  /* Written and read back: zero rows become zero codes and zero block scales; the pages
   * start as the emulator's 0xFF poison. One token into page 1, slot 3 (slot form). */
  {
    const int64_t slot = 16 + 3;
    uint16_t host_out[16 * 2 * 128];
    uint8_t host_pages[16 * 2 * 72];
    int32_t one_page = 1;
    void* slots = NULL;
    void* rows = NULL;
    slimserve_kv_append_args kv_args;
    size_t i;
    CHECK_OK(slimserve_device_alloc(sizeof slot, &slots));
    CHECK_OK(slimserve_device_alloc(2 * 128 * 2, &rows));
    CHECK_OK(slimserve_memcpy_async(slots, &slot, sizeof slot, SLIMSERVE_HOST_TO_DEVICE, NULL));
    CHECK_OK(slimserve_memset_async(rows, 0, 2 * 128 * 2, NULL));
    CHECK_OK(slimserve_memcpy_async(page_ids, &one_page, sizeof one_page, SLIMSERVE_HOST_TO_DEVICE, NULL));
    memset(&kv_args, 0, sizeof kv_args);
    kv_args.struct_size = sizeof kv_args;
    kv_args.cache = cache;
    kv_args.k_new = kv_args.v_new = rows;
    kv_args.input_dtype = SLIMSERVE_ACT_FP16;
    kv_args.num_tokens = 1;
    kv_args.slot_mapping = (const int64_t*)slots;
    CHECK_OK(slimserve_kv_append(&kv_args, NULL));
    CHECK_OK(slimserve_dequantize_pages(&cache, page_ids, 1, out, out, NULL));
    CHECK_OK(slimserve_memcpy_async(host_pages, (char*)pages + 16 * 2 * 72, sizeof host_pages, SLIMSERVE_DEVICE_TO_HOST, NULL));
    CHECK_OK(slimserve_memcpy_async(host_out, out, sizeof host_out, SLIMSERVE_DEVICE_TO_HOST, NULL));
    CHECK_OK(slimserve_stream_synchronize(NULL));
    for (i = 0; i < sizeof host_pages; ++i) {
      const int written = i / (2 * 72) == 3; /* NHD: slot 3's two head vectors */
      EXPECT(host_pages[i] == (written ? 0x00 : 0xFF));
    }
    /* Slot 3 decodes to zeros; the 0xFF poison elsewhere has NaN scales: NaN. */
    EXPECT(host_out[3 * 2 * 128] == 0 && host_out[3 * 2 * 128 + 255] == 0);
    EXPECT((host_out[0] & 0x7FFF) > 0x7F80 && (host_out[15 * 2 * 128] & 0x7FFF) > 0x7F80);
    CHECK_OK(slimserve_device_free(rows));
    CHECK_OK(slimserve_device_free(slots));
  }
  memset(&problem, 0, sizeof problem);
  problem.batch_size = 1;
  problem.num_qo_heads = 8;
  problem.num_kv_heads = 2;
  problem.head_dim = 128;
  problem.page_size = 16;
  problem.query_tokens = 1;
  problem.kv_dtype = SLIMSERVE_KV_NVFP4;
  /* The CUDA-core decode takes NVFP4 pages (tests/attention/decode_test.cpp checks its values). */
  CHECK_OK(slimserve_decode_workspace_size(&problem, indptr, last_page_len, &bytes));
  EXPECT(bytes > 0);
  CHECK_OK(slimserve_device_free(page_ids));
  CHECK_OK(slimserve_device_free(out));
  CHECK_OK(slimserve_device_free(scale));
  CHECK_OK(slimserve_device_free(pages));
}

/* rotate_heads on exact values: e_0 rotates to 1/8 everywhere, e_1 to +-1/8 alternating (D 64);
 * twice in place gives them back bit for bit. Refusals name the argument. */
static void test_rotate_heads(void) {
  uint16_t host[2 * 64], back[2 * 64];
  void* rows = NULL;
  void* rotated = NULL;
  slimserve_rotate_heads_args args;
  int i, bad = 0;
  memset(host, 0, sizeof host);
  host[0] = 0x3C00;      /* head 0: e_0 (FP16 1.0) */
  host[64 + 1] = 0x3C00; /* head 1: e_1 */
  CHECK_OK(slimserve_device_alloc(sizeof host, &rows));
  CHECK_OK(slimserve_device_alloc(sizeof host, &rotated));
  CHECK_OK(slimserve_memcpy_async(rows, host, sizeof host, SLIMSERVE_HOST_TO_DEVICE, NULL));
  memset(&args, 0, sizeof args);
  args.struct_size = sizeof args;
  args.input = rows;
  args.output = rotated;
  args.dtype = SLIMSERVE_ACT_FP16;
  args.num_tokens = 1;
  args.num_heads = 2;
  args.head_dim = 64;
  CHECK_OK(slimserve_rotate_heads(&args, NULL));
  CHECK_OK(slimserve_memcpy_async(back, rotated, sizeof back, SLIMSERVE_DEVICE_TO_HOST, NULL));
  CHECK_OK(slimserve_stream_synchronize(NULL));
  for (i = 0; i < 64; ++i) {
    bad += back[i] != 0x3000;                                   /* 0.125 */
    bad += back[64 + i] != ((i & 1) ? 0xB000 : 0x3000);         /* -+0.125 */
  }
  EXPECT(bad == 0);
  args.input = rotated; /* in place, back to e_0 / e_1 */
  CHECK_OK(slimserve_rotate_heads(&args, NULL));
  CHECK_OK(slimserve_memcpy_async(back, rotated, sizeof back, SLIMSERVE_DEVICE_TO_HOST, NULL));
  CHECK_OK(slimserve_stream_synchronize(NULL));
  EXPECT(memcmp(back, host, sizeof host) == 0);
  args.head_dim = 96;
  EXPECT_REFUSED(slimserve_rotate_heads(&args, NULL), SLIMSERVE_UNSUPPORTED, "head_dim");
  args.head_dim = 64;
  args.input_row_stride = 100;
  EXPECT_REFUSED(slimserve_rotate_heads(&args, NULL), SLIMSERVE_INVALID_ARGUMENT, "input_row_stride");
  args.input_row_stride = 0;
  args.struct_size = 8;
  EXPECT_REFUSED(slimserve_rotate_heads(&args, NULL), SLIMSERVE_INVALID_ARGUMENT, "struct_size");
  CHECK_OK(slimserve_memcpy_async(back, rotated, sizeof back, SLIMSERVE_DEVICE_TO_HOST, NULL));
  CHECK_OK(slimserve_stream_synchronize(NULL));
  EXPECT(memcmp(back, host, sizeof host) == 0); /* refused calls wrote nothing */
  CHECK_OK(slimserve_device_free(rows));
  CHECK_OK(slimserve_device_free(rotated));
}

int main(void) {
  start_test("c_api_test");
  test_status_and_pool();
  test_enum_ranges_and_workspace();
  test_int4_gemm(3, 64, 128, 32, 1);
  test_int4_gemm(5, 128, 64, 64, 0);
  test_request_sets_and_page_movement();
  test_memory_refusals_and_counters();
  test_kv_append_page_stride_and_slots();
  test_check_page_tags_with();
  test_record_identities();
  test_adopt_and_coalesce();
  test_nvfp4_by_name();
  test_rotate_heads();
  return finish_test("c_api_test");
}
