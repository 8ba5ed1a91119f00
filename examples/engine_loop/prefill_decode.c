/*
 * A C engine's attention steps over the C ABI: chunked prefill of a prompt into an FP8 cache
 * (fused: the chunk's K/V are quantized into their slots by the attention call itself, read in
 * place from the fused QKV projection output), then decode steps, all through a vLLM-style
 * block table + seq_lens, gated by the tag check, with one workspace sized once for every step
 * (what a CUDA-graph engine needs). Runs on the CPU emulator (libslimserve_c_emulated) as the
 * test prefill_decode_c; docs/embedding.md quotes it.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <slimserve/c/slimserve.h>

#define CHECK(call)                                                                        \
  do {                                                                                     \
    slimserve_status status_ = (call);                                                     \
    if (status_ != SLIMSERVE_OK) {                                                         \
      fprintf(stderr, "%s failed: %s\n", #call, slimserve_last_error());                   \
      exit(1);                                                                             \
    }                                                                                      \
  } while (0)

enum { HQ = 8, HKV = 2, D = 128, PAGE = 16, NUM_PAGES = 64, MAX_PAGES = 4, QKV = (HQ + 2 * HKV) * D };

static void* device_alloc(size_t bytes) {
  void* p = NULL;
  CHECK(slimserve_device_alloc(bytes, &p));
  return p;
}
static void to_device(void* dst, const void* src, size_t bytes) {
  CHECK(slimserve_memcpy_async(dst, src, bytes, SLIMSERVE_HOST_TO_DEVICE, NULL));
}
static uint16_t bf16(float value) { /* round to nearest even */
  uint32_t bits;
  memcpy(&bits, &value, sizeof bits);
  return (uint16_t)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

int main(void) {
  const int32_t prompt = 40, chunks[3] = {24, 16, 0}; /* two prefill chunks, then decode */
  const float kv_scale = 1.0f / 64.0f;
  slimserve_page_pool* pool = NULL;
  slimserve_device_tags* tags = NULL;
  slimserve_page pages[MAX_PAGES];
  int32_t block_ids[MAX_PAGES], seq_len = 0, step, i;
  uint32_t block_tags[MAX_PAGES];
  uint16_t* qkv_host = malloc(sizeof(uint16_t) * 24 * QKV);
  uint16_t* o_host = malloc(sizeof(uint16_t) * 24 * HQ * D);
  void *k_pages, *v_pages, *scale, *qkv, *o, *block_table_d, *tags_d, *seq_lens_d, *qo_indptr_d, *statuses,
      *workspace;
  size_t workspace_bytes = 0;

  /* The cache: FP8 e4m3 K and V pages with a calibrated per-tensor scale. */
  k_pages = device_alloc((size_t)NUM_PAGES * PAGE * HKV * D);
  v_pages = device_alloc((size_t)NUM_PAGES * PAGE * HKV * D);
  scale = device_alloc(sizeof kv_scale);
  to_device(scale, &kv_scale, sizeof kv_scale);
  qkv = device_alloc(sizeof(uint16_t) * 24 * QKV);
  o = device_alloc(sizeof(uint16_t) * 24 * HQ * D);
  block_table_d = device_alloc(sizeof block_ids);
  tags_d = device_alloc(sizeof block_tags);
  seq_lens_d = device_alloc(sizeof(int32_t));
  qo_indptr_d = device_alloc(2 * sizeof(int32_t));
  statuses = device_alloc(sizeof(slimserve_request_status));

  /* The request's pages (enough for prompt + decode) from a pool with generation tags. */
  CHECK(slimserve_page_pool_create(NUM_PAGES, &pool));
  CHECK(slimserve_device_tags_create(NUM_PAGES, &tags));
  CHECK(slimserve_page_pool_allocate(pool, pages, MAX_PAGES));
  CHECK(slimserve_device_tags_sync(tags, pool, NULL));
  for (i = 0; i < MAX_PAGES; ++i) {
    block_ids[i] = pages[i].id;
    block_tags[i] = pages[i].tag;
  }
  to_device(block_table_d, block_ids, sizeof block_ids);
  to_device(tags_d, block_tags, sizeof block_tags);

  /* example-begin workspace-bound */
  slimserve_paged_attention_bound bound;
  memset(&bound, 0, sizeof bound);
  bound.struct_size = sizeof bound;  /* every ABI-2 struct: zero it, then set its size */
  bound.problem.batch_size = 1;
  bound.problem.num_qo_heads = HQ;
  bound.problem.num_kv_heads = HKV;
  bound.problem.head_dim = D;
  bound.problem.page_size = PAGE;
  bound.problem.kv_dtype = SLIMSERVE_KV_FP8_E4M3;
  bound.problem.q_dtype = SLIMSERVE_ACT_BF16;
  bound.max_total_qo_tokens = 24;            /* the largest step */
  bound.max_kv_tokens = MAX_PAGES * PAGE;    /* the longest request */
  CHECK(slimserve_paged_attention_workspace_bound(&bound, &workspace_bytes));
  /* example-end workspace-bound */
  workspace = device_alloc(workspace_bytes);

  for (step = 0; step < 5; ++step) {
    const int32_t new_tokens = step < 2 ? chunks[step] : 1;
    const int32_t qo_indptr[2] = {0, new_tokens};
    slimserve_paged_attention_plan* plan = NULL;
    int32_t aborted = 0;
    slimserve_request_status verdict;
    seq_len += new_tokens; /* the table counts the step's tokens; the run fills their slots */
    to_device(seq_lens_d, &seq_len, sizeof seq_len);
    to_device(qo_indptr_d, qo_indptr, sizeof qo_indptr);
    for (i = 0; i < new_tokens * QKV; ++i) qkv_host[i] = bf16((float)sin(0.37 * (i + 7 * step + 1)));
    to_device(qkv, qkv_host, sizeof(uint16_t) * (size_t)(new_tokens * QKV));

    /* example-begin block-table-step */
    slimserve_block_table_view table = {block_table_d, tags_d, seq_lens_d, 1, MAX_PAGES, PAGE};
    CHECK(slimserve_check_block_tags(&table, tags, NULL, NULL, statuses, NULL, NULL));

    slimserve_paged_attention_plan_args plan_args;
    memset(&plan_args, 0, sizeof plan_args);
    plan_args.struct_size = sizeof plan_args;
    plan_args.problem = bound.problem;
    plan_args.qo_indptr_host = qo_indptr;  /* host copies: the plan validates and schedules */
    plan_args.seq_lens_host = &seq_len;
    CHECK(slimserve_paged_attention_plan_create(&plan_args, workspace, workspace_bytes, NULL, &plan));

    slimserve_paged_attention_args args;
    memset(&args, 0, sizeof args);
    args.struct_size = sizeof args;
    args.cache.k_pages = k_pages;
    args.cache.v_pages = v_pages;
    args.cache.k_scale = args.cache.v_scale = scale;
    args.cache.num_pages = NUM_PAGES;
    args.cache.page_size = PAGE;
    args.cache.num_kv_heads = HKV;
    args.cache.head_dim = D;
    args.cache.dtype = SLIMSERVE_KV_FP8_E4M3;
    args.cache.layout = SLIMSERVE_KV_NHD;
    args.cache.scale_mode = SLIMSERVE_SCALE_PER_TENSOR;
    args.block_table = &table;
    args.statuses = statuses;                      /* aborted requests read and write nothing */
    args.qo_indptr = qo_indptr_d;
    args.q = qkv;                                  /* [tokens, HQ + 2 HKV, D]: q is read in place */
    args.q_token_stride = QKV;
    args.chunk_k = (const uint16_t*)qkv + HQ * D;  /* fused: quantized into the step's slots */
    args.chunk_v = (const uint16_t*)qkv + (HQ + HKV) * D;
    args.chunk_token_stride = QKV;
    args.o = o;                                    /* packed [tokens, HQ, D] */
    CHECK(slimserve_paged_attention_run(plan, &args, workspace, workspace_bytes, NULL));
    slimserve_paged_attention_plan_destroy(plan);
    /* example-end block-table-step */

    CHECK(slimserve_memcpy_async(&verdict, statuses, sizeof verdict, SLIMSERVE_DEVICE_TO_HOST, NULL));
    CHECK(slimserve_memcpy_async(o_host, o, sizeof(uint16_t) * (size_t)(new_tokens * HQ * D),
                                 SLIMSERVE_DEVICE_TO_HOST, NULL));
    CHECK(slimserve_stream_synchronize(NULL));
    for (i = 0; i < new_tokens * HQ * D; ++i) {
      const uint32_t bits = (uint32_t)o_host[i] << 16;
      float value;
      memcpy(&value, &bits, sizeof value);
      aborted += !(fabsf(value) <= 1.0f); /* a softmax average of values in [-1, 1] */
    }
    if (verdict.state != SLIMSERVE_REQUEST_OK || aborted != 0) {
      fprintf(stderr, "step %d: request state %d, %d outputs outside [-1, 1]\n", step, verdict.state, aborted);
      return 1;
    }
    printf("step %d: %d new tokens, %d in the cache\n", step, new_tokens, seq_len);
  }
  if (seq_len != prompt + 3) return 1;

  CHECK(slimserve_page_pool_release(pool, pages, MAX_PAGES));
  slimserve_device_tags_destroy(tags);
  slimserve_page_pool_destroy(pool);
  CHECK(slimserve_device_free(k_pages));
  CHECK(slimserve_device_free(v_pages));
  CHECK(slimserve_device_free(scale));
  CHECK(slimserve_device_free(qkv));
  CHECK(slimserve_device_free(o));
  CHECK(slimserve_device_free(block_table_d));
  CHECK(slimserve_device_free(tags_d));
  CHECK(slimserve_device_free(seq_lens_d));
  CHECK(slimserve_device_free(qo_indptr_d));
  CHECK(slimserve_device_free(statuses));
  CHECK(slimserve_device_free(workspace));
  free(qkv_host);
  free(o_host);
  printf("prefill_decode_c: ok\n");
  return 0;
}
