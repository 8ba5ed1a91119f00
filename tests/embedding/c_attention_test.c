/*
 * The attention entry points of C ABI 2 from a plain C99 program, against FP64 references
 * computed here from what the cache holds (read back and decoded, so the tolerance covers
 * only the kernels' arithmetic):
 *  - paged attention over a BF16 cache, head_dim 96, GQA 4: ragged requests (decode, a
 *    prefill of page - 1 tokens, a chunk of page + 1 tokens on a cached prefix, a long
 *    decode) on shuffled pages from a page pool; CSR with two K/V allocations, and a block
 *    table (garbage past each row) over one combined [pages, 2, page, H, D] allocation with q
 *    read in place from a fused QKV buffer and o written with a padded token stride, which
 *    must give bit-identical outputs; then sliding window + soft-cap + sinks + custom
 *    sm_scale; a stale page caught by the block-table tag check aborts exactly its request;
 *    page ids outside the cache are left out;
 *  - fused mixed-dtype prefill into an FP8 e4m3 cache from strided chunk K/V: the same cache
 *    bytes as slimserve_append_kv, outputs against the reference (prefix from the FP8 pages,
 *    the chunk as given);
 *  - BF16 dequantization of listed FP8 pages, and the merge of partial states (cascades);
 *  - MLA: append (chunk form), absorbed decode with 2 query tokens over a block table, ragged
 *    absorbed prefill (0 .. 5 rows per request) over CSR, and the prefix gather, for BF16 and
 *    FP8 (per-token-group and per-tensor scale) caches;
 *  - refusals with their messages: struct sizes, strides, overlapping outputs, short
 *    workspaces (outputs untouched), out-of-range ids, bad options, plan / run mismatch.
 * Every output element is compared; outputs are poisoned before each run. The seed is fresh
 * per run (SLIMSERVE_TEST_SEED repeats one). Exit status 0 when all checks pass.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <slimserve/c/slimserve.h>

#include "c_test_support.h"

/* A random BF16 value in [-1, 1) and its exact double. */
static uint16_t random_bf16(double* exact) {
  const uint16_t bits = to_bf16(uniform());
  *exact = from_bf16(bits);
  return bits;
}
static double from_e4m3(uint8_t code) {
  const int sign = code >> 7, exponent = (code >> 3) & 15, mantissa = code & 7;
  double magnitude;
  if (exponent == 15 && mantissa == 7) return NAN;
  magnitude = exponent == 0 ? ldexp((double)mantissa, -9) : ldexp(1.0 + mantissa / 8.0, exponent - 7);
  return sign ? -magnitude : magnitude;
}

/* ---- the FP64 reference of paged attention --------------------------------------------- */

enum { MAX_BATCH = 4, MAX_PAGES = 8 };

/* What each request's positions hold, as doubles: k[b][(pos * hkv + h) * d + i]; positions
 * marked in `lost` are left out (a page id outside the cache). */
typedef struct {
  int32_t batch, hq, hkv, d;
  int32_t kv_len[MAX_BATCH];
  int32_t qo_indptr[MAX_BATCH + 1];
  double* k[MAX_BATCH];
  double* v[MAX_BATCH];
  unsigned char* lost[MAX_BATCH];
  double* q; /* [tokens, hq, d] */
} Sequences;

typedef struct {
  double sm_scale;
  int32_t window_left; /* -1: none */
  double soft_cap;
  const float* sinks; /* host [hq] or NULL */
  const unsigned char* aborted; /* [batch] or NULL */
} Options;

typedef struct {
  double* o;   /* [tokens, hq, d] */
  double* lse; /* [tokens, hq] */
  double v_max[MAX_BATCH];
} Reference;

static Reference reference(const Sequences* s, const Options* opt) {
  const int32_t tokens = s->qo_indptr[s->batch];
  Reference r;
  int32_t b, t, h, p, i;
  r.o = calloc((size_t)(tokens * s->hq * s->d), sizeof(double));
  r.lse = calloc((size_t)(tokens * s->hq), sizeof(double));
  for (b = 0; b < s->batch; ++b) {
    const int32_t qo_len = s->qo_indptr[b + 1] - s->qo_indptr[b];
    r.v_max[b] = 0.0;
    for (i = 0; i < s->kv_len[b] * s->hkv * s->d; ++i) r.v_max[b] = fmax(r.v_max[b], fabs(s->v[b][i]));
    for (t = 0; t < qo_len; ++t) {
      const int32_t token = s->qo_indptr[b] + t, position = s->kv_len[b] - qo_len + t;
      const int32_t begin = opt->window_left >= 0 && position - opt->window_left > 0 ? position - opt->window_left : 0;
      for (h = 0; h < s->hq; ++h) {
        const int32_t kv_head = h / (s->hq / s->hkv);
        const double* q = s->q + ((size_t)token * (size_t)s->hq + (size_t)h) * (size_t)s->d;
        double* o = r.o + ((size_t)token * (size_t)s->hq + (size_t)h) * (size_t)s->d;
        double m = opt->sinks != NULL ? (double)opt->sinks[h] : -INFINITY, sum;
        double* score = calloc((size_t)(position + 1), sizeof(double));
        for (p = begin; p <= position; ++p) {
          const double* k = s->k[b] + ((size_t)p * (size_t)s->hkv + (size_t)kv_head) * (size_t)s->d;
          double dot = 0.0;
          if (s->lost[b] != NULL && s->lost[b][p]) continue;
          for (i = 0; i < s->d; ++i) dot += q[i] * k[i];
          dot *= opt->sm_scale;
          if (opt->soft_cap > 0.0) dot = opt->soft_cap * tanh(dot / opt->soft_cap);
          score[p] = dot;
          m = fmax(m, dot);
        }
        sum = opt->sinks != NULL ? exp((double)opt->sinks[h] - m) : 0.0;
        for (p = begin; p <= position; ++p) {
          const double* v = s->v[b] + ((size_t)p * (size_t)s->hkv + (size_t)kv_head) * (size_t)s->d;
          double w;
          if (s->lost[b] != NULL && s->lost[b][p]) continue;
          w = exp(score[p] - m);
          sum += w;
          for (i = 0; i < s->d; ++i) o[i] += w * v[i];
        }
        for (i = 0; i < s->d; ++i) o[i] /= sum;
        r.lse[(size_t)token * (size_t)s->hq + (size_t)h] = m + log(sum);
        free(score);
      }
    }
  }
  return r;
}
static void free_reference(Reference* r) {
  free(r->o);
  free(r->lse);
}

/* Compares every element of o (BF16 at o[token * token_stride + head * head_stride + i])
 * and lse. Per element: BF16 output rounding (2^-8 of |ref|) plus the rounding of P to the
 * mma type (2^-9 relative for BF16, 2^-12 for FP16) times the spread of V, plus FP32 noise.
 * Aborted requests: NaN rows, lse -inf. */
static void check_outputs(const char* what, const Sequences* s, const Reference* r, const Options* opt,
                          const uint16_t* o, int64_t token_stride, int64_t head_stride, const float* lse,
                          double p_rel) {
  int32_t b, t, h, i;
  long bad = 0;
  for (b = 0; b < s->batch; ++b) {
    const int aborted = opt->aborted != NULL && opt->aborted[b];
    for (t = s->qo_indptr[b]; t < s->qo_indptr[b + 1]; ++t) {
      for (h = 0; h < s->hq; ++h) {
        const size_t row = (size_t)t * (size_t)s->hq + (size_t)h;
        const double got_lse = (double)lse[row];
        if (aborted ? !(got_lse == -INFINITY) : !(fabs(got_lse - r->lse[row]) <= 1e-3 + 1e-5 * fabs(r->lse[row]))) {
          if (bad++ < 5) fprintf(stderr, "%s: lse of token %d head %d: %f, want %f\n", what, t, h, got_lse, r->lse[row]);
        }
        for (i = 0; i < s->d; ++i) {
          const double got = from_bf16(o[(int64_t)t * token_stride + (int64_t)h * head_stride + i]);
          const double want = r->o[row * (size_t)s->d + (size_t)i];
          const double tolerance = ldexp(1.0, -8) * fabs(want) + (2.0 * p_rel + 2e-5) * r->v_max[b] + 1e-6;
          if (aborted ? !isnan(got) : !(fabs(got - want) <= tolerance)) {
            if (bad++ < 5) fprintf(stderr, "%s: o[%d, %d, %d] = %f, want %f\n", what, t, h, i, got, want);
          }
        }
      }
    }
  }
  if (bad != 0) fprintf(stderr, "%s: %ld elements out of tolerance\n", what, bad);
  EXPECT(bad == 0);
}

/* ---- paged attention over a BF16 cache --------------------------------------------------- */

enum { PAGE = 16, HQ = 8, HKV = 2, D = 96, NUM_PAGES = 32 };

static void test_paged_attention_bf16(void) {
  /* decode at length 1, a prefill of page - 1, a chunk of page + 1 on a 16-token prefix, a long decode */
  static const int32_t kv_len[MAX_BATCH] = {1, PAGE - 1, 2 * PAGE + 1, 70};
  static const int32_t qo_len[MAX_BATCH] = {1, PAGE - 1, PAGE + 1, 1};
  const int32_t batch = MAX_BATCH, page_elements = PAGE * HKV * D, qkv_width = (HQ + 2 * HKV) * D;
  Sequences s;
  slimserve_page_pool* pool = NULL;
  slimserve_page owned[NUM_PAGES - 1], request_pages[MAX_BATCH][MAX_PAGES];
  int32_t num_request_pages[MAX_BATCH], indptr[MAX_BATCH + 1], last_page_len[MAX_BATCH], indices[NUM_PAGES];
  uint32_t tags[NUM_PAGES];
  int32_t width = 0, b, i, p, h, t, tokens, entries = 0;
  int32_t block[MAX_BATCH * (MAX_PAGES + 1)];
  uint32_t block_tags[MAX_BATCH * (MAX_PAGES + 1)];
  uint16_t *k_host, *v_host, *combined_host, *qkv_host, *o_packed, *o_strided;
  float* lse_host;
  float sinks[HQ];
  void *d_k, *d_v, *d_combined, *d_qkv, *d_q, *d_o, *d_o_strided, *d_lse, *d_indptr, *d_indices, *d_last,
      *d_tags, *d_qo_indptr, *d_block, *d_block_tags, *d_seq_lens, *d_sinks, *d_workspace, *d_statuses, *d_aborted;
  slimserve_page_table_view table;
  slimserve_block_table_view block_table, host_block_table;
  slimserve_paged_attention_plan_args plan_args;
  slimserve_paged_attention_bound bound;
  slimserve_paged_attention_plan *csr_plan = NULL, *block_plan = NULL;
  slimserve_paged_attention_plan_info info;
  slimserve_paged_attention_args args;
  slimserve_device_tags* device_tags = NULL;
  slimserve_request_status statuses[MAX_BATCH];
  int32_t aborted_count = -1;
  size_t bytes = 0, bound_bytes = 0, workspace_bytes;
  const int64_t o_token_stride = HQ * D + 8;
  Options options;
  Reference ref;
  unsigned char aborted[MAX_BATCH] = {0, 0, 0, 0};

  memset(&s, 0, sizeof s);
  s.batch = batch;
  s.hq = HQ;
  s.hkv = HKV;
  s.d = D;
  s.qo_indptr[0] = 0;
  for (b = 0; b < batch; ++b) {
    s.kv_len[b] = kv_len[b];
    s.qo_indptr[b + 1] = s.qo_indptr[b] + qo_len[b];
  }
  tokens = s.qo_indptr[batch];

  /* Pages from a pool, handed out in shuffled order with unused ones in between (holes). */
  CHECK_OK(slimserve_page_pool_create(NUM_PAGES, &pool));
  CHECK_OK(slimserve_page_pool_allocate(pool, owned, NUM_PAGES - 1));
  for (i = NUM_PAGES - 2; i > 0; --i) {
    const int32_t j = below(i + 1);
    const slimserve_page swap = owned[i];
    owned[i] = owned[j];
    owned[j] = swap;
  }
  indptr[0] = 0;
  p = 0;
  for (b = 0; b < batch; ++b) {
    num_request_pages[b] = (kv_len[b] + PAGE - 1) / PAGE;
    width = num_request_pages[b] > width ? num_request_pages[b] : width;
    for (i = 0; i < num_request_pages[b]; ++i) {
      request_pages[b][i] = owned[p];
      indices[entries] = owned[p].id;
      tags[entries++] = owned[p].tag;
      p += 2; /* every other page stays unused */
    }
    indptr[b + 1] = entries;
    last_page_len[b] = kv_len[b] - (num_request_pages[b] - 1) * PAGE;
  }
  ++width; /* a spare column of garbage ids: never read */
  for (b = 0; b < batch; ++b) {
    for (i = 0; i < width; ++i) {
      const int32_t at = b * width + i;
      block[at] = i < num_request_pages[b] ? request_pages[b][i].id : (i % 2 == 0 ? 999 : -5);
      block_tags[at] = i < num_request_pages[b] ? request_pages[b][i].tag : 0u;
    }
  }

  /* The cache: random BF16 K/V in the pages the requests own; other pages random too. */
  k_host = malloc((size_t)(NUM_PAGES * page_elements) * sizeof(uint16_t));
  v_host = malloc((size_t)(NUM_PAGES * page_elements) * sizeof(uint16_t));
  combined_host = malloc((size_t)(2 * NUM_PAGES * page_elements) * sizeof(uint16_t));
  for (i = 0; i < NUM_PAGES * page_elements; ++i) {
    double ignored;
    k_host[i] = random_bf16(&ignored);
    v_host[i] = random_bf16(&ignored);
  }
  for (p = 0; p < NUM_PAGES; ++p) {
    memcpy(combined_host + (size_t)(2 * p) * (size_t)page_elements, k_host + (size_t)p * (size_t)page_elements,
           (size_t)page_elements * sizeof(uint16_t));
    memcpy(combined_host + (size_t)(2 * p + 1) * (size_t)page_elements, v_host + (size_t)p * (size_t)page_elements,
           (size_t)page_elements * sizeof(uint16_t));
  }
  for (b = 0; b < batch; ++b) {
    s.k[b] = malloc((size_t)(kv_len[b] * HKV * D) * sizeof(double));
    s.v[b] = malloc((size_t)(kv_len[b] * HKV * D) * sizeof(double));
    s.lost[b] = NULL;
    for (p = 0; p < kv_len[b]; ++p) {
      const int32_t page = request_pages[b][p / PAGE].id, slot = p % PAGE;
      for (h = 0; h < HKV; ++h) {
        for (i = 0; i < D; ++i) {
          const size_t at = (size_t)(((page * PAGE + slot) * HKV + h) * D + i); /* NHD */
          s.k[b][(p * HKV + h) * D + i] = from_bf16(k_host[at]);
          s.v[b][(p * HKV + h) * D + i] = from_bf16(v_host[at]);
        }
      }
    }
  }
  /* q: the first HQ * D columns of a fused QKV projection's output [tokens, (HQ + 2 HKV) D]. */
  qkv_host = malloc((size_t)(tokens * qkv_width) * sizeof(uint16_t));
  s.q = malloc((size_t)(tokens * HQ * D) * sizeof(double));
  for (t = 0; t < tokens; ++t) {
    for (i = 0; i < qkv_width; ++i) {
      double exact;
      qkv_host[t * qkv_width + i] = random_bf16(&exact);
      if (i < HQ * D) s.q[t * HQ * D + i] = exact;
    }
  }
  {
    uint16_t* q_packed = malloc((size_t)(tokens * HQ * D) * sizeof(uint16_t));
    for (t = 0; t < tokens; ++t) memcpy(q_packed + t * HQ * D, qkv_host + t * qkv_width, (size_t)(HQ * D) * sizeof(uint16_t));
    d_q = upload(q_packed, (size_t)(tokens * HQ * D) * sizeof(uint16_t));
    free(q_packed);
  }
  for (h = 0; h < HQ; ++h) sinks[h] = (float)(h - 3) * 0.75f;

  d_k = upload(k_host, (size_t)(NUM_PAGES * page_elements) * sizeof(uint16_t));
  d_v = upload(v_host, (size_t)(NUM_PAGES * page_elements) * sizeof(uint16_t));
  d_combined = upload(combined_host, (size_t)(2 * NUM_PAGES * page_elements) * sizeof(uint16_t));
  d_qkv = upload(qkv_host, (size_t)(tokens * qkv_width) * sizeof(uint16_t));
  d_indptr = upload(indptr, sizeof indptr);
  d_indices = upload(indices, (size_t)entries * sizeof(int32_t));
  d_last = upload(last_page_len, sizeof last_page_len);
  d_tags = upload(tags, (size_t)entries * sizeof(uint32_t));
  d_qo_indptr = upload(s.qo_indptr, sizeof s.qo_indptr);
  d_block = upload(block, (size_t)(batch * width) * sizeof(int32_t));
  d_block_tags = upload(block_tags, (size_t)(batch * width) * sizeof(uint32_t));
  d_seq_lens = upload(kv_len, sizeof kv_len);
  d_sinks = upload(sinks, sizeof sinks);
  o_packed = malloc((size_t)(tokens * HQ * D) * sizeof(uint16_t));
  o_strided = malloc((size_t)(tokens * o_token_stride) * sizeof(uint16_t));
  lse_host = malloc((size_t)(tokens * HQ) * sizeof(float));
  d_o = device_filled((size_t)(tokens * HQ * D) * sizeof(uint16_t), 0x7f);
  d_o_strided = device_filled((size_t)(tokens * o_token_stride) * sizeof(uint16_t), 0x7f);
  d_lse = device_filled((size_t)(tokens * HQ) * sizeof(float), 0x7f);

  table.indptr = d_indptr;
  table.indices = d_indices;
  table.last_page_len = d_last;
  table.expected_tags = d_tags;
  table.batch_size = batch;
  table.page_size = PAGE;
  block_table.block_table = d_block;
  block_table.expected_tags = d_block_tags;
  block_table.seq_lens = d_seq_lens;
  block_table.batch_size = batch;
  block_table.max_pages_per_request = width;
  block_table.page_size = PAGE;

  /* The host preflight of the block table: real pages, and refusals naming the entry. */
  host_block_table = block_table;
  host_block_table.block_table = block;
  host_block_table.expected_tags = block_tags;
  host_block_table.seq_lens = kv_len;
  CHECK_OK(slimserve_validate_block_table(&host_block_table, NUM_PAGES));
  i = block[2 * width + 1];
  block[2 * width + 1] = NUM_PAGES + 3;
  EXPECT_REFUSED(slimserve_validate_block_table(&host_block_table, NUM_PAGES), SLIMSERVE_OUT_OF_RANGE, "35");
  block[2 * width + 1] = 0;
  EXPECT_REFUSED(slimserve_validate_block_table(&host_block_table, NUM_PAGES), SLIMSERVE_INVALID_ARGUMENT,
                 "guard page");
  block[2 * width + 1] = i;

  /* Plan: CSR lengths, and block-table lengths (seq_lens); the size query is the plan's. */
  memset(&plan_args, 0, sizeof plan_args);
  plan_args.struct_size = sizeof plan_args;
  plan_args.problem.batch_size = batch;
  plan_args.problem.num_qo_heads = HQ;
  plan_args.problem.num_kv_heads = HKV;
  plan_args.problem.head_dim = D;
  plan_args.problem.page_size = PAGE;
  plan_args.problem.kv_dtype = SLIMSERVE_KV_BF16;
  plan_args.problem.q_dtype = SLIMSERVE_ACT_BF16;
  plan_args.qo_indptr_host = s.qo_indptr;
  plan_args.kv_indptr_host = indptr;
  plan_args.last_page_len_host = last_page_len;
  plan_args.num_sms = 4; /* small: request 3's 70 tokens split across CTAs */
  plan_args.min_chunk_tokens = 16;
  CHECK_OK(slimserve_paged_attention_workspace_size(&plan_args, &bytes));
  memset(&bound, 0, sizeof bound);
  bound.struct_size = sizeof bound;
  bound.problem = plan_args.problem;
  bound.max_total_qo_tokens = tokens;
  bound.max_kv_tokens = 70;
  bound.num_sms = 4;
  CHECK_OK(slimserve_paged_attention_workspace_bound(&bound, &bound_bytes));
  EXPECT(bound_bytes >= bytes && bytes > 0);
  workspace_bytes = bound_bytes; /* one allocation for every step, as a CUDA-graph engine does */
  CHECK_OK(slimserve_device_alloc(workspace_bytes, &d_workspace));
  /* The CSR plan and the block-table plan must not share a workspace: the run reads the
   * schedule the plan uploaded. Plan, run, then plan again. */
  CHECK_OK(slimserve_paged_attention_plan_create(&plan_args, d_workspace, workspace_bytes, NULL, &csr_plan));
  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  CHECK_OK(slimserve_paged_attention_plan_get_info(csr_plan, &info));
  EXPECT(info.kernel == SLIMSERVE_KERNEL_TENSOR_CORE && info.reason != NULL && info.reason[0] != '\0');
  EXPECT(info.workspace_bytes == bytes && info.num_work_items > 0);

  /* Run 1: CSR, two K/V allocations, packed q and o. */
  memset(&args, 0, sizeof args);
  args.struct_size = sizeof args;
  args.cache.k_pages = d_k;
  args.cache.v_pages = d_v;
  args.cache.num_pages = NUM_PAGES;
  args.cache.page_size = PAGE;
  args.cache.num_kv_heads = HKV;
  args.cache.head_dim = D;
  args.cache.dtype = SLIMSERVE_KV_BF16;
  args.cache.layout = SLIMSERVE_KV_NHD;
  args.cache.scale_mode = SLIMSERVE_SCALE_NONE;
  args.table = &table;
  args.qo_indptr = d_qo_indptr;
  args.q = d_q;
  args.o = d_o;
  args.lse = d_lse;
  CHECK_OK(slimserve_paged_attention_run(csr_plan, &args, d_workspace, workspace_bytes, NULL));
  download(o_packed, d_o, (size_t)(tokens * HQ * D) * sizeof(uint16_t));
  download(lse_host, d_lse, (size_t)(tokens * HQ) * sizeof(float));
  memset(&options, 0, sizeof options);
  options.sm_scale = 1.0 / sqrt((double)D);
  options.window_left = -1;
  ref = reference(&s, &options);
  check_outputs("bf16 CSR", &s, &ref, &options, o_packed, HQ * D, D, lse_host, ldexp(1.0, -9));
  free_reference(&ref);

  /* Run 2: block table over one combined K/V allocation, q read in place from the QKV
   * buffer, o with a padded token stride: bit-identical to run 1. */
  plan_args.kv_indptr_host = NULL;
  plan_args.last_page_len_host = NULL;
  plan_args.seq_lens_host = kv_len;
  CHECK_OK(slimserve_paged_attention_plan_create(&plan_args, d_workspace, workspace_bytes, NULL, &block_plan));
  args.cache.k_pages = d_combined;
  args.cache.v_pages = (uint16_t*)d_combined + page_elements;
  args.kv_page_stride = 2 * page_elements;
  args.table = NULL;
  args.block_table = &block_table;
  args.q = d_qkv;
  args.q_token_stride = qkv_width;
  args.o = d_o_strided;
  args.o_token_stride = o_token_stride;
  CHECK_OK(slimserve_memset_async(d_lse, 0x7f, (size_t)(tokens * HQ) * sizeof(float), NULL));
  CHECK_OK(slimserve_paged_attention_run(block_plan, &args, d_workspace, workspace_bytes, NULL));
  download(o_strided, d_o_strided, (size_t)(tokens * o_token_stride) * sizeof(uint16_t));
  {
    float* lse_block = malloc((size_t)(tokens * HQ) * sizeof(float));
    long differ = 0, padding = 0;
    download(lse_block, d_lse, (size_t)(tokens * HQ) * sizeof(float));
    for (t = 0; t < tokens; ++t) {
      differ += memcmp(o_strided + t * o_token_stride, o_packed + t * HQ * D, (size_t)(HQ * D) * sizeof(uint16_t)) != 0;
      for (i = HQ * D; i < o_token_stride; ++i) padding += o_strided[t * o_token_stride + i] != 0x7f7f;
    }
    differ += memcmp(lse_block, lse_host, (size_t)(tokens * HQ) * sizeof(float)) != 0;
    EXPECT(differ == 0); /* block table + combined K/V + strides: the same bits as CSR */
    EXPECT(padding == 0); /* the stride's padding is never written */
    free(lse_block);
  }

  /* Run 3: sliding window (20 positions), soft-cap, sinks, custom sm_scale. */
  args.sm_scale = 0.07f;
  args.sliding_window = 20;
  args.logit_soft_cap = 2.5f;
  args.sinks = d_sinks;
  CHECK_OK(slimserve_memset_async(d_o_strided, 0x7f, (size_t)(tokens * o_token_stride) * sizeof(uint16_t), NULL));
  CHECK_OK(slimserve_paged_attention_run(block_plan, &args, d_workspace, workspace_bytes, NULL));
  download(o_strided, d_o_strided, (size_t)(tokens * o_token_stride) * sizeof(uint16_t));
  download(lse_host, d_lse, (size_t)(tokens * HQ) * sizeof(float));
  options.sm_scale = (double)0.07f;
  options.window_left = 19;
  options.soft_cap = (double)2.5f;
  options.sinks = sinks;
  ref = reference(&s, &options);
  check_outputs("bf16 block table, window/soft-cap/sinks", &s, &ref, &options, o_strided, o_token_stride, D,
                lse_host, ldexp(1.0, -9));
  free_reference(&ref);

  /* A page of request 2 goes stale (released and handed out again under a new tag): the
   * block-table tag check aborts exactly that request, and the run reads none of its pages. */
  CHECK_OK(slimserve_device_tags_create(NUM_PAGES, &device_tags));
  CHECK_OK(slimserve_page_pool_release(pool, &request_pages[2][1], 1));
  {
    slimserve_page again;
    CHECK_OK(slimserve_page_pool_allocate(pool, &again, 1));
    EXPECT(again.id != request_pages[2][1].id || again.tag != request_pages[2][1].tag);
  }
  CHECK_OK(slimserve_device_tags_sync(device_tags, pool, NULL));
  d_statuses = device_filled(sizeof statuses, 0x55);
  d_aborted = device_filled(sizeof(int32_t), 0x55);
  CHECK_OK(slimserve_check_block_tags(&block_table, device_tags, NULL, NULL, d_statuses, d_aborted, NULL));
  download(statuses, d_statuses, sizeof statuses);
  download(&aborted_count, d_aborted, sizeof aborted_count);
  for (b = 0; b < batch; ++b) EXPECT(statuses[b].state == (b == 2 ? SLIMSERVE_REQUEST_STALE_TAG : SLIMSERVE_REQUEST_OK));
  EXPECT(statuses[2].failed_slot == 1 && aborted_count == 1);
  args.statuses = d_statuses;
  CHECK_OK(slimserve_memset_async(d_o_strided, 0x7f, (size_t)(tokens * o_token_stride) * sizeof(uint16_t), NULL));
  CHECK_OK(slimserve_paged_attention_run(block_plan, &args, d_workspace, workspace_bytes, NULL));
  download(o_strided, d_o_strided, (size_t)(tokens * o_token_stride) * sizeof(uint16_t));
  download(lse_host, d_lse, (size_t)(tokens * HQ) * sizeof(float));
  aborted[2] = 1;
  options.aborted = aborted;
  ref = reference(&s, &options);
  check_outputs("aborted request", &s, &ref, &options, o_strided, o_token_stride, D, lse_host, ldexp(1.0, -9));
  free_reference(&ref);
  args.statuses = NULL;
  options.aborted = NULL;

  /* Page ids outside the cache in the device table: those pages are left out, nothing else. */
  {
    int32_t broken[MAX_BATCH * (MAX_PAGES + 1)];
    void* d_broken;
    memcpy(broken, block, sizeof broken);
    broken[3 * width + 2] = NUM_PAGES + 100; /* request 3, positions 32..47 */
    broken[2 * width + 0] = -7;              /* request 2, positions 0..15 */
    d_broken = upload(broken, (size_t)(batch * width) * sizeof(int32_t));
    block_table.block_table = d_broken;
    s.lost[2] = calloc((size_t)kv_len[2], 1);
    s.lost[3] = calloc((size_t)kv_len[3], 1);
    for (p = 0; p < PAGE; ++p) {
      s.lost[2][p] = 1;
      s.lost[3][2 * PAGE + p] = 1;
    }
    CHECK_OK(slimserve_paged_attention_run(block_plan, &args, d_workspace, workspace_bytes, NULL));
    download(o_strided, d_o_strided, (size_t)(tokens * o_token_stride) * sizeof(uint16_t));
    download(lse_host, d_lse, (size_t)(tokens * HQ) * sizeof(float));
    ref = reference(&s, &options);
    check_outputs("ids outside the cache", &s, &ref, &options, o_strided, o_token_stride, D, lse_host, ldexp(1.0, -9));
    free_reference(&ref);
    free(s.lost[2]);
    free(s.lost[3]);
    s.lost[2] = s.lost[3] = NULL;
    block_table.block_table = d_block;
    release(d_broken);
  }

  /* Refusals at run time: each names the problem, and o keeps its poison. */
  CHECK_OK(slimserve_memset_async(d_o_strided, 0x7f, (size_t)(tokens * o_token_stride) * sizeof(uint16_t), NULL));
  EXPECT_REFUSED(slimserve_paged_attention_run(block_plan, &args, d_workspace, bytes - 16, NULL),
                 SLIMSERVE_RESOURCE_EXHAUSTED, "workspace");
  args.q_token_stride = qkv_width + 4; /* not a multiple of 8 elements */
  EXPECT_REFUSED(slimserve_paged_attention_run(block_plan, &args, d_workspace, workspace_bytes, NULL),
                 SLIMSERVE_INVALID_ARGUMENT, "stride");
  args.q_token_stride = qkv_width;
  args.o_token_stride = HQ * D - 8; /* rows of consecutive tokens would overlap */
  EXPECT_REFUSED(slimserve_paged_attention_run(block_plan, &args, d_workspace, workspace_bytes, NULL),
                 SLIMSERVE_INVALID_ARGUMENT, "overlap");
  args.o_token_stride = o_token_stride;
  args.kv_page_stride = 2 * page_elements + 4; /* pages not 16-byte aligned */
  EXPECT_REFUSED(slimserve_paged_attention_run(block_plan, &args, d_workspace, workspace_bytes, NULL),
                 SLIMSERVE_INVALID_ARGUMENT, "page_stride");
  args.kv_page_stride = 2 * page_elements;
  args.sliding_window = -3;
  EXPECT_REFUSED(slimserve_paged_attention_run(block_plan, &args, d_workspace, workspace_bytes, NULL),
                 SLIMSERVE_INVALID_ARGUMENT, "sliding_window");
  args.sliding_window = 20;
  args.logit_soft_cap = -1.0f;
  EXPECT_REFUSED(slimserve_paged_attention_run(block_plan, &args, d_workspace, workspace_bytes, NULL),
                 SLIMSERVE_INVALID_ARGUMENT, "soft_cap");
  args.logit_soft_cap = 2.5f;
  args.sm_scale = -1.0f;
  EXPECT_REFUSED(slimserve_paged_attention_run(block_plan, &args, d_workspace, workspace_bytes, NULL),
                 SLIMSERVE_INVALID_ARGUMENT, "sm_scale");
  args.sm_scale = 0.07f;
  args.rotation = 3; /* unknown */
  EXPECT_REFUSED(slimserve_paged_attention_run(block_plan, &args, d_workspace, workspace_bytes, NULL),
                 SLIMSERVE_INVALID_ARGUMENT, "rotation");
  args.rotation = SLIMSERVE_KV_ROTATION_NONE;
  args.reserved = 1;
  EXPECT_REFUSED(slimserve_paged_attention_run(block_plan, &args, d_workspace, workspace_bytes, NULL),
                 SLIMSERVE_INVALID_ARGUMENT, "reserved");
  args.reserved = 0;
  args.table = &table; /* both forms */
  EXPECT_REFUSED(slimserve_paged_attention_run(block_plan, &args, d_workspace, workspace_bytes, NULL),
                 SLIMSERVE_INVALID_ARGUMENT, "exactly one");
  args.table = NULL;
  block_table.max_pages_per_request = 2; /* request 3's 70 tokens do not fit 2 pages a row */
  EXPECT_REFUSED(slimserve_paged_attention_run(block_plan, &args, d_workspace, workspace_bytes, NULL),
                 SLIMSERVE_INVALID_ARGUMENT, "block table");
  block_table.max_pages_per_request = width;
  args.cache.head_dim = 128; /* not the plan's */
  EXPECT_REFUSED(slimserve_paged_attention_run(block_plan, &args, d_workspace, workspace_bytes, NULL),
                 SLIMSERVE_INVALID_ARGUMENT, "plan was made for");
  args.cache.head_dim = D;
  args.cache.dtype = 7;
  EXPECT_REFUSED(slimserve_paged_attention_run(block_plan, &args, d_workspace, workspace_bytes, NULL),
                 SLIMSERVE_INVALID_ARGUMENT, "KV dtype");
  args.cache.dtype = SLIMSERVE_KV_BF16;
  args.struct_size = 8;
  EXPECT_REFUSED(slimserve_paged_attention_run(block_plan, &args, d_workspace, workspace_bytes, NULL),
                 SLIMSERVE_INVALID_ARGUMENT, "struct_size");
  args.struct_size = sizeof args;
  download(o_strided, d_o_strided, (size_t)(tokens * o_token_stride) * sizeof(uint16_t));
  {
    long touched = 0;
    for (i = 0; i < tokens * (int32_t)o_token_stride; ++i) touched += o_strided[i] != 0x7f7f;
    EXPECT(touched == 0);
  }
  {
    /* A struct from a newer header: extra zero bytes are fine, a set one is refused. */
    struct {
      slimserve_paged_attention_args known;
      uint64_t newer_field;
    } newer;
    memset(&newer, 0, sizeof newer);
    newer.known = args;
    newer.known.struct_size = sizeof newer;
    CHECK_OK(slimserve_paged_attention_run(block_plan, &newer.known, d_workspace, workspace_bytes, NULL));
    newer.newer_field = 1;
    EXPECT_REFUSED(slimserve_paged_attention_run(block_plan, &newer.known, d_workspace, workspace_bytes, NULL),
                   SLIMSERVE_UNSUPPORTED, "newer header");
  }

  /* Refusals at plan time. */
  {
    slimserve_paged_attention_plan* plan = NULL;
    size_t ignored;
    EXPECT_REFUSED(slimserve_paged_attention_plan_create(&plan_args, d_workspace, bytes - 16, NULL, &plan),
                   SLIMSERVE_RESOURCE_EXHAUSTED, "workspace");
    EXPECT(plan == NULL);
    plan_args.kv_indptr_host = indptr; /* and seq_lens_host: two forms */
    plan_args.last_page_len_host = last_page_len;
    EXPECT_REFUSED(slimserve_paged_attention_workspace_size(&plan_args, &ignored), SLIMSERVE_INVALID_ARGUMENT,
                   "exactly one");
    plan_args.seq_lens_host = NULL;
    plan_args.problem.head_dim = 80;
    EXPECT_REFUSED(slimserve_paged_attention_workspace_size(&plan_args, &ignored), SLIMSERVE_UNSUPPORTED,
                   "head_dim 80");
    plan_args.problem.head_dim = D;
    plan_args.problem.mask = 4;
    EXPECT_REFUSED(slimserve_paged_attention_workspace_size(&plan_args, &ignored), SLIMSERVE_INVALID_ARGUMENT,
                   "mask");
    plan_args.problem.mask = SLIMSERVE_MASK_CAUSAL;
    plan_args.problem.q_dtype = 5;
    EXPECT_REFUSED(slimserve_paged_attention_workspace_size(&plan_args, &ignored), SLIMSERVE_INVALID_ARGUMENT,
                   "activation dtype");
    plan_args.problem.q_dtype = SLIMSERVE_ACT_BF16;
    s.qo_indptr[2] = s.qo_indptr[1] - 1; /* decreasing */
    EXPECT_REFUSED(slimserve_paged_attention_workspace_size(&plan_args, &ignored), SLIMSERVE_INVALID_ARGUMENT,
                   "qo_indptr");
    s.qo_indptr[2] = s.qo_indptr[1] + qo_len[1];
    last_page_len[3] = PAGE + 1;
    EXPECT_REFUSED(slimserve_paged_attention_workspace_size(&plan_args, &ignored), SLIMSERVE_INVALID_ARGUMENT,
                   "last_page_len");
    last_page_len[3] = kv_len[3] - (num_request_pages[3] - 1) * PAGE;
    plan_args.struct_size = 0;
    EXPECT_REFUSED(slimserve_paged_attention_workspace_size(&plan_args, &ignored), SLIMSERVE_INVALID_ARGUMENT,
                   "struct_size");
    plan_args.struct_size = sizeof plan_args;
    info.struct_size = 4;
    EXPECT_REFUSED(slimserve_paged_attention_plan_get_info(csr_plan, &info), SLIMSERVE_INVALID_ARGUMENT,
                   "struct_size");
  }

  slimserve_paged_attention_plan_destroy(csr_plan);
  slimserve_paged_attention_plan_destroy(block_plan);
  slimserve_paged_attention_plan_destroy(NULL);
  slimserve_device_tags_destroy(device_tags);
  slimserve_page_pool_destroy(pool);
  release(d_k); release(d_v); release(d_combined); release(d_qkv); release(d_q); release(d_o);
  release(d_o_strided); release(d_lse); release(d_indptr); release(d_indices); release(d_last); release(d_tags);
  release(d_qo_indptr); release(d_block); release(d_block_tags); release(d_seq_lens); release(d_sinks);
  release(d_workspace); release(d_statuses); release(d_aborted);
  for (b = 0; b < batch; ++b) {
    free(s.k[b]);
    free(s.v[b]);
  }
  free(s.q); free(k_host); free(v_host); free(combined_host); free(qkv_host); free(o_packed); free(o_strided);
  free(lse_host);
}

/* ---- fused mixed-dtype prefill into an FP8 cache ----------------------------------------- */

enum { FD = 128, FHQ = 4, FHKV = 1, FPAGE = 32, FPAGES = 16 };

static void test_fused_prefill_fp8(void) {
  /* prefix + chunk: a first chunk (no prefix), a chunk starting mid-page, a long chunk on a
   * one-page prefix */
  static const int32_t prefix[3] = {0, FPAGE + 5, FPAGE};
  static const int32_t chunk[3] = {FPAGE - 1, FPAGE + 1, 70};
  const int32_t batch = 3, qkv_width = (FHQ + 2 * FHKV) * FD, page_elements = FPAGE * FHKV * FD;
  const float scale = 1.0f / 64.0f;
  int32_t kv_len[3], qo_indptr[4], indptr[4], last[3], indices[FPAGES], token_request[128], token_position[128];
  uint32_t tags[FPAGES];
  int32_t b, i, t, h, p, entries = 0, prefix_tokens = 0, tokens;
  uint16_t *prefix_kv, *qkv, *chunk_k, *chunk_v, *o_host;
  uint8_t *k_fused, *v_fused, *k_separate, *v_separate;
  float* lse_host;
  void *d_k, *d_v, *d_k2, *d_v2, *d_scale, *d_prefix_k, *d_prefix_v, *d_token_request, *d_token_position, *d_qkv,
      *d_chunk_k, *d_chunk_v, *d_indptr, *d_indices, *d_last, *d_tags, *d_qo_indptr, *d_o, *d_lse, *d_workspace;
  slimserve_kv_cache cache;
  slimserve_page_table_view table;
  slimserve_append_args append;
  slimserve_paged_attention_plan_args plan_args;
  slimserve_paged_attention_plan* plan = NULL;
  slimserve_paged_attention_args args;
  size_t bytes = 0;
  const size_t cache_bytes = (size_t)(FPAGES * page_elements);
  Sequences s;
  Options options;
  Reference ref;

  memset(&s, 0, sizeof s);
  qo_indptr[0] = indptr[0] = 0;
  for (b = 0; b < batch; ++b) {
    const int32_t pages = (prefix[b] + chunk[b] + FPAGE - 1) / FPAGE;
    kv_len[b] = prefix[b] + chunk[b];
    qo_indptr[b + 1] = qo_indptr[b] + chunk[b];
    for (i = 0; i < pages; ++i) {
      indices[entries] = FPAGES - 1 - 2 * entries; /* descending, with holes */
      tags[entries++] = 1u;
    }
    indptr[b + 1] = entries;
    last[b] = kv_len[b] - (pages - 1) * FPAGE;
    for (p = 0; p < prefix[b]; ++p) {
      token_request[prefix_tokens] = b;
      token_position[prefix_tokens++] = p;
    }
  }
  tokens = qo_indptr[batch];

  /* The prefix goes in through append_kv (quantized), then the pages are cloned so that the
   * fused run and the separate path (append_kv of the chunk) start from the same bytes. */
  prefix_kv = malloc((size_t)(2 * prefix_tokens * FHKV * FD) * sizeof(uint16_t));
  for (i = 0; i < 2 * prefix_tokens * FHKV * FD; ++i) {
    double ignored;
    prefix_kv[i] = random_bf16(&ignored);
  }
  d_k = device_filled(cache_bytes, 0x3c);
  d_v = device_filled(cache_bytes, 0x3c);
  d_k2 = device_filled(cache_bytes, 0x3c);
  d_v2 = device_filled(cache_bytes, 0x3c);
  d_scale = upload(&scale, sizeof scale);
  d_prefix_k = upload(prefix_kv, (size_t)(prefix_tokens * FHKV * FD) * sizeof(uint16_t));
  d_prefix_v = upload(prefix_kv + prefix_tokens * FHKV * FD, (size_t)(prefix_tokens * FHKV * FD) * sizeof(uint16_t));
  d_token_request = upload(token_request, (size_t)prefix_tokens * sizeof(int32_t));
  d_token_position = upload(token_position, (size_t)prefix_tokens * sizeof(int32_t));
  d_indptr = upload(indptr, sizeof indptr);
  d_indices = upload(indices, (size_t)entries * sizeof(int32_t));
  d_last = upload(last, sizeof last);
  d_tags = upload(tags, (size_t)entries * sizeof(uint32_t));
  d_qo_indptr = upload(qo_indptr, sizeof qo_indptr);

  memset(&cache, 0, sizeof cache);
  cache.k_pages = d_k;
  cache.v_pages = d_v;
  cache.k_scale = d_scale;
  cache.v_scale = d_scale;
  cache.num_pages = FPAGES;
  cache.page_size = FPAGE;
  cache.num_kv_heads = FHKV;
  cache.head_dim = FD;
  cache.dtype = SLIMSERVE_KV_FP8_E4M3;
  cache.layout = SLIMSERVE_KV_NHD;
  cache.scale_mode = SLIMSERVE_SCALE_PER_TENSOR;
  table.indptr = d_indptr;
  table.indices = d_indices;
  table.last_page_len = d_last;
  table.expected_tags = d_tags;
  table.batch_size = batch;
  table.page_size = FPAGE;
  memset(&append, 0, sizeof append);
  append.k_new = d_prefix_k;
  append.v_new = d_prefix_v;
  append.input_dtype = SLIMSERVE_ACT_BF16;
  append.num_tokens = prefix_tokens;
  append.token_request = d_token_request;
  append.token_position = d_token_position;
  CHECK_OK(slimserve_append_kv(&cache, &table, NULL, &append, NULL));
  CHECK_OK(slimserve_memcpy_async(d_k2, d_k, cache_bytes, SLIMSERVE_DEVICE_TO_DEVICE, NULL));
  CHECK_OK(slimserve_memcpy_async(d_v2, d_v, cache_bytes, SLIMSERVE_DEVICE_TO_DEVICE, NULL));

  /* The chunk: q, k, v columns of one fused QKV output [tokens, (FHQ + 2 FHKV) FD]. */
  qkv = malloc((size_t)(tokens * qkv_width) * sizeof(uint16_t));
  chunk_k = malloc((size_t)(tokens * FHKV * FD) * sizeof(uint16_t));
  chunk_v = malloc((size_t)(tokens * FHKV * FD) * sizeof(uint16_t));
  s.q = malloc((size_t)(tokens * FHQ * FD) * sizeof(double));
  for (t = 0; t < tokens; ++t) {
    for (i = 0; i < qkv_width; ++i) {
      double exact;
      qkv[t * qkv_width + i] = random_bf16(&exact);
      if (i < FHQ * FD) s.q[t * FHQ * FD + i] = exact;
    }
    memcpy(chunk_k + t * FHKV * FD, qkv + t * qkv_width + FHQ * FD, (size_t)(FHKV * FD) * sizeof(uint16_t));
    memcpy(chunk_v + t * FHKV * FD, qkv + t * qkv_width + (FHQ + FHKV) * FD, (size_t)(FHKV * FD) * sizeof(uint16_t));
  }
  d_qkv = upload(qkv, (size_t)(tokens * qkv_width) * sizeof(uint16_t));
  d_chunk_k = upload(chunk_k, (size_t)(tokens * FHKV * FD) * sizeof(uint16_t));
  d_chunk_v = upload(chunk_v, (size_t)(tokens * FHKV * FD) * sizeof(uint16_t));
  d_o = device_filled((size_t)(tokens * FHQ * FD) * sizeof(uint16_t), 0x7f);
  d_lse = device_filled((size_t)(tokens * FHQ) * sizeof(float), 0x7f);

  memset(&plan_args, 0, sizeof plan_args);
  plan_args.struct_size = sizeof plan_args;
  plan_args.problem.batch_size = batch;
  plan_args.problem.num_qo_heads = FHQ;
  plan_args.problem.num_kv_heads = FHKV;
  plan_args.problem.head_dim = FD;
  plan_args.problem.page_size = FPAGE;
  plan_args.problem.kv_dtype = SLIMSERVE_KV_FP8_E4M3;
  plan_args.problem.q_dtype = SLIMSERVE_ACT_BF16;
  plan_args.qo_indptr_host = qo_indptr;
  plan_args.kv_indptr_host = indptr;
  plan_args.last_page_len_host = last;
  CHECK_OK(slimserve_paged_attention_workspace_size(&plan_args, &bytes));
  CHECK_OK(slimserve_device_alloc(bytes, &d_workspace));
  CHECK_OK(slimserve_paged_attention_plan_create(&plan_args, d_workspace, bytes, NULL, &plan));

  memset(&args, 0, sizeof args);
  args.struct_size = sizeof args;
  args.cache = cache;
  args.table = &table;
  args.qo_indptr = d_qo_indptr;
  args.q = d_qkv;
  args.q_token_stride = qkv_width;
  args.o = d_o;
  args.lse = d_lse;
  args.chunk_k = (const uint16_t*)d_qkv + FHQ * FD;
  args.chunk_v = (const uint16_t*)d_qkv + (FHQ + FHKV) * FD;
  args.chunk_token_stride = qkv_width;
  CHECK_OK(slimserve_paged_attention_run(plan, &args, d_workspace, bytes, NULL));

  /* The separate path on the clone: the chunk through append_kv (chunk form). */
  cache.k_pages = d_k2;
  cache.v_pages = d_v2;
  memset(&append, 0, sizeof append);
  append.k_new = d_chunk_k;
  append.v_new = d_chunk_v;
  append.input_dtype = SLIMSERVE_ACT_BF16;
  append.num_tokens = tokens;
  append.append_indptr = d_qo_indptr;
  CHECK_OK(slimserve_append_kv(&cache, &table, NULL, &append, NULL));

  k_fused = malloc(cache_bytes);
  v_fused = malloc(cache_bytes);
  k_separate = malloc(cache_bytes);
  v_separate = malloc(cache_bytes);
  download(k_fused, d_k, cache_bytes);
  download(v_fused, d_v, cache_bytes);
  download(k_separate, d_k2, cache_bytes);
  download(v_separate, d_v2, cache_bytes);
  EXPECT(memcmp(k_fused, k_separate, cache_bytes) == 0); /* the fused write is append_kv's bytes */
  EXPECT(memcmp(v_fused, v_separate, cache_bytes) == 0);

  /* Reference: the prefix as the FP8 pages hold it, the chunk as given (BF16). */
  s.batch = batch;
  s.hq = FHQ;
  s.hkv = FHKV;
  s.d = FD;
  for (b = 0; b <= batch; ++b) s.qo_indptr[b] = qo_indptr[b];
  for (b = 0; b < batch; ++b) {
    s.kv_len[b] = kv_len[b];
    s.k[b] = malloc((size_t)(kv_len[b] * FHKV * FD) * sizeof(double));
    s.v[b] = malloc((size_t)(kv_len[b] * FHKV * FD) * sizeof(double));
    s.lost[b] = NULL;
    for (p = 0; p < kv_len[b]; ++p) {
      const int32_t page = indices[indptr[b] + p / FPAGE], slot = p % FPAGE;
      for (h = 0; h < FHKV; ++h) {
        for (i = 0; i < FD; ++i) {
          const size_t at = (size_t)(((page * FPAGE + slot) * FHKV + h) * FD + i);
          const int32_t into = (p * FHKV + h) * FD + i;
          if (p < prefix[b]) {
            s.k[b][into] = from_e4m3(k_fused[at]) * (double)scale;
            s.v[b][into] = from_e4m3(v_fused[at]) * (double)scale;
          } else {
            const int32_t token = qo_indptr[b] + p - prefix[b];
            s.k[b][into] = from_bf16(chunk_k[(token * FHKV + h) * FD + i]);
            s.v[b][into] = from_bf16(chunk_v[(token * FHKV + h) * FD + i]);
          }
        }
      }
    }
  }
  o_host = malloc((size_t)(tokens * FHQ * FD) * sizeof(uint16_t));
  lse_host = malloc((size_t)(tokens * FHQ) * sizeof(float));
  download(o_host, d_o, (size_t)(tokens * FHQ * FD) * sizeof(uint16_t));
  download(lse_host, d_lse, (size_t)(tokens * FHQ) * sizeof(float));
  memset(&options, 0, sizeof options);
  options.sm_scale = 1.0 / sqrt((double)FD);
  options.window_left = -1;
  ref = reference(&s, &options);
  check_outputs("fused FP8 prefill", &s, &ref, &options, o_host, FHQ * FD, FD, lse_host, ldexp(1.0, -12));
  free_reference(&ref);

  /* Pages dequantized to BF16: real = stored * scale (exact here: a power-of-two scale); an id
   * outside the cache gives a NaN page. */
  {
    const int32_t listed[3] = {indices[0], indices[entries - 1], FPAGES + 5};
    void* d_listed = upload(listed, sizeof listed);
    void* d_k_out = device_filled((size_t)(3 * page_elements) * sizeof(uint16_t), 0);
    void* d_v_out = device_filled((size_t)(3 * page_elements) * sizeof(uint16_t), 0);
    uint16_t* k_out = malloc((size_t)(3 * page_elements) * sizeof(uint16_t));
    uint16_t* v_out = malloc((size_t)(3 * page_elements) * sizeof(uint16_t));
    long bad = 0;
    cache.k_pages = d_k;
    cache.v_pages = d_v;
    CHECK_OK(slimserve_dequantize_pages(&cache, d_listed, 3, d_k_out, d_v_out, NULL));
    download(k_out, d_k_out, (size_t)(3 * page_elements) * sizeof(uint16_t));
    download(v_out, d_v_out, (size_t)(3 * page_elements) * sizeof(uint16_t));
    for (p = 0; p < 2; ++p) {
      for (i = 0; i < page_elements; ++i) {
        const size_t at = (size_t)(listed[p] * page_elements + i);
        bad += from_bf16(k_out[p * page_elements + i]) != from_e4m3(k_fused[at]) * (double)scale;
        bad += from_bf16(v_out[p * page_elements + i]) != from_e4m3(v_fused[at]) * (double)scale;
      }
    }
    for (i = 0; i < page_elements; ++i) bad += !isnan(from_bf16(k_out[2 * page_elements + i]));
    EXPECT(bad == 0);
    EXPECT_REFUSED(slimserve_dequantize_pages(&cache, d_listed, -1, d_k_out, d_v_out, NULL),
                   SLIMSERVE_INVALID_ARGUMENT, "num_listed");
    free(k_out);
    free(v_out);
    release(d_listed);
    release(d_k_out);
    release(d_v_out);
  }

  /* Fused prefill writes packed pages only; one chunk input without the other is refused. */
  args.kv_page_stride = 2 * page_elements;
  EXPECT_REFUSED(slimserve_paged_attention_run(plan, &args, d_workspace, bytes, NULL), SLIMSERVE_UNSUPPORTED,
                 "packed pages");
  args.kv_page_stride = 0;
  args.chunk_v = NULL;
  EXPECT_REFUSED(slimserve_paged_attention_run(plan, &args, d_workspace, bytes, NULL), SLIMSERVE_INVALID_ARGUMENT,
                 "chunk_kv");
  args.chunk_v = (const uint16_t*)d_qkv + (FHQ + FHKV) * FD;
  args.chunk_head_stride = 12;
  EXPECT_REFUSED(slimserve_paged_attention_run(plan, &args, d_workspace, bytes, NULL), SLIMSERVE_INVALID_ARGUMENT,
                 "stride");

  slimserve_paged_attention_plan_destroy(plan);
  for (b = 0; b < batch; ++b) {
    free(s.k[b]);
    free(s.v[b]);
  }
  free(s.q); free(prefix_kv); free(qkv); free(chunk_k); free(chunk_v); free(o_host); free(lse_host);
  free(k_fused); free(v_fused); free(k_separate); free(v_separate);
  release(d_k); release(d_v); release(d_k2); release(d_v2); release(d_scale); release(d_prefix_k);
  release(d_prefix_v); release(d_token_request); release(d_token_position); release(d_qkv); release(d_chunk_k);
  release(d_chunk_v); release(d_indptr); release(d_indices); release(d_last); release(d_tags);
  release(d_qo_indptr); release(d_o); release(d_lse); release(d_workspace);
}

/* ---- merging partial states (cascades) --------------------------------------------------- */

static void test_merge(void) {
  enum { ROWS = 4, MD = 64, PARTIALS = 5 };
  const int32_t split_indptr[4] = {0, 2, 2, 5}; /* request 1 has no partial */
  float partial_o[PARTIALS * ROWS * MD], partial_lse[PARTIALS * ROWS], lse[3 * ROWS];
  uint16_t o[3 * ROWS * MD];
  void *d_partial_o, *d_partial_lse, *d_split, *d_o, *d_lse;
  slimserve_merge_args args;
  int32_t b, r, p, i;
  long bad = 0;
  for (i = 0; i < PARTIALS * ROWS * MD; ++i) partial_o[i] = (float)uniform();
  for (i = 0; i < PARTIALS * ROWS; ++i) partial_lse[i] = (float)(3.0 * uniform());
  partial_lse[3 * ROWS + 1] = -INFINITY; /* an empty partial of request 2 weighs nothing */
  d_partial_o = upload(partial_o, sizeof partial_o);
  d_partial_lse = upload(partial_lse, sizeof partial_lse);
  d_split = upload(split_indptr, sizeof split_indptr);
  d_o = device_filled(sizeof o, 0x7f);
  d_lse = device_filled(sizeof lse, 0x7f);
  memset(&args, 0, sizeof args);
  args.struct_size = sizeof args;
  args.partial_o = d_partial_o;
  args.partial_lse = d_partial_lse;
  args.split_indptr = d_split;
  args.batch_size = 3;
  args.rows_per_request = ROWS;
  args.head_dim = MD;
  args.out_dtype = SLIMSERVE_ACT_BF16;
  args.o = d_o;
  args.lse = d_lse;
  CHECK_OK(slimserve_merge_attention_states(&args, NULL));
  download(o, d_o, sizeof o);
  download(lse, d_lse, sizeof lse);
  for (b = 0; b < 3; ++b) {
    for (r = 0; r < ROWS; ++r) {
      double m = -INFINITY, sum = 0.0, want_lse;
      for (p = split_indptr[b]; p < split_indptr[b + 1]; ++p) m = fmax(m, (double)partial_lse[p * ROWS + r]);
      for (p = split_indptr[b]; p < split_indptr[b + 1]; ++p) sum += exp((double)partial_lse[p * ROWS + r] - m);
      want_lse = sum > 0.0 ? m + log(sum) : -INFINITY;
      bad += want_lse == -INFINITY ? !(lse[b * ROWS + r] == -INFINITY)
                                   : !(fabs((double)lse[b * ROWS + r] - want_lse) <= 1e-5 * fabs(want_lse) + 1e-6);
      for (i = 0; i < MD; ++i) {
        double want = 0.0, got = from_bf16(o[(b * ROWS + r) * MD + i]);
        for (p = split_indptr[b]; p < split_indptr[b + 1]; ++p) {
          if (sum > 0.0) want += exp((double)partial_lse[p * ROWS + r] - m) / sum * (double)partial_o[(p * ROWS + r) * MD + i];
        }
        bad += !(fabs(got - want) <= ldexp(1.0, -8) * fabs(want) + 1e-6);
      }
    }
  }
  EXPECT(bad == 0);
  args.head_dim = 80;
  EXPECT_REFUSED(slimserve_merge_attention_states(&args, NULL), SLIMSERVE_UNSUPPORTED, "head_dim 80");
  args.head_dim = MD;
  args.out_dtype = 3;
  EXPECT_REFUSED(slimserve_merge_attention_states(&args, NULL), SLIMSERVE_INVALID_ARGUMENT, "activation dtype");
  release(d_partial_o); release(d_partial_lse); release(d_split); release(d_o); release(d_lse);
}

/* ---- MLA ---------------------------------------------------------------------------------- */

enum { LATENT = 512, ROPE = 64, QK = 576, MHEADS = 8, MPAGE = 16, MPAGES = 16, QT = 2 };

/* E2M1 (the NVFP4 code): sign on bit 3, magnitude 0, 0.5, 1, 1.5, 2, 3, 4, 6. */
static double from_e2m1(unsigned code) {
  static const double magnitude[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  return (code & 8u) ? -magnitude[code & 7u] : magnitude[code & 7u];
}

/* latent (512) | rope (64) of one cached token, dequantized. NVFP4 (docs/mla.md): 256 bytes
 * of codes (value i in the low nibble of byte i / 2 for even i, the high one for odd i), 32
 * E4M3 block scales (one per 16 values), then the rope; value = e2m1 x block scale x tensor. */
static void mla_token(const uint8_t* record, slimserve_kv_dtype dtype, slimserve_mla_scale_mode mode,
                      float tensor_scale, double* out) {
  const int32_t rope_at = dtype == SLIMSERVE_KV_NVFP4 ? LATENT / 2 + LATENT / 16
                          : mode == SLIMSERVE_MLA_SCALE_PER_TOKEN_GROUP ? LATENT + 16 : LATENT;
  int32_t i;
  uint16_t bits;
  if (dtype == SLIMSERVE_KV_BF16) {
    for (i = 0; i < QK; ++i) {
      memcpy(&bits, record + 2 * i, sizeof bits);
      out[i] = from_bf16(bits);
    }
    return;
  }
  for (i = 0; i < LATENT && dtype == SLIMSERVE_KV_NVFP4; ++i) {
    const unsigned code = ((unsigned)record[i / 2] >> (4u * (unsigned)(i % 2))) & 15u;
    out[i] = from_e2m1(code) * from_e4m3(record[LATENT / 2 + i / 16]) * (double)tensor_scale;
  }
  for (i = 0; i < LATENT && dtype != SLIMSERVE_KV_NVFP4; ++i) {
    float group_scale = tensor_scale;
    if (mode == SLIMSERVE_MLA_SCALE_PER_TOKEN_GROUP) memcpy(&group_scale, record + LATENT + 4 * (i / 128), sizeof group_scale);
    out[i] = from_e4m3(record[i]) * (double)group_scale;
  }
  for (i = 0; i < ROPE; ++i) {
    memcpy(&bits, record + rope_at + 2 * i, sizeof bits);
    out[LATENT + i] = from_bf16(bits);
  }
}

/* FP64 reference of absorbed MLA: request b's rows [qo[b], qo[b + 1]); its query token t of
 * n sees positions <= len - n + t; keys are latent | rope, values the latent. */
static void check_mla(const char* what, int32_t batch, const int32_t* kv_len, const int32_t* qo_indptr,
                      double* const* keys, const uint16_t* q, const uint16_t* o, const float* lse, float sm_scale,
                      slimserve_kv_dtype dtype) {
  int32_t b, t, h, p, i;
  long bad = 0;
  for (b = 0; b < batch; ++b) {
    const int32_t n = qo_indptr[b + 1] - qo_indptr[b];
    double v_max = 0.0;
    for (i = 0; i < kv_len[b] * QK; ++i) {
      if (i % QK < LATENT) v_max = fmax(v_max, fabs(keys[b][i]));
    }
    for (t = 0; t < n; ++t) {
      const int32_t row = qo_indptr[b] + t, last_position = kv_len[b] - n + t;
      for (h = 0; h < MHEADS; ++h) {
        const uint16_t* qh = q + (size_t)((row * MHEADS + h) * QK);
        double m = -INFINITY, sum = 0.0, want_o[LATENT], score[64];
        memset(want_o, 0, sizeof want_o);
        for (p = 0; p <= last_position; ++p) {
          double dot = 0.0;
          for (i = 0; i < QK; ++i) dot += from_bf16(qh[i]) * keys[b][p * QK + i];
          score[p] = dot * (double)sm_scale;
          m = fmax(m, score[p]);
        }
        for (p = 0; p <= last_position; ++p) {
          const double w = exp(score[p] - m);
          sum += w;
          for (i = 0; i < LATENT; ++i) want_o[i] += w * keys[b][p * QK + i];
        }
        {
          const double got_lse = (double)lse[row * MHEADS + h], want_lse = m + log(sum);
          if (!(fabs(got_lse - want_lse) <= 2e-3 + 1e-4 * fabs(want_lse))) {
            if (bad++ < 5) fprintf(stderr, "%s: lse row %d head %d: %f, want %f\n", what, row, h, got_lse, want_lse);
          }
        }
        for (i = 0; i < LATENT; ++i) {
          const double want = want_o[i] / sum;
          const double got = from_bf16(o[(size_t)((row * MHEADS + h) * LATENT + i)]);
          /* P is rounded to the mma type (BF16: 2^-9 relative; FP8 path: fp16) and o to BF16. */
          const double tolerance = (dtype == SLIMSERVE_KV_BF16 ? 6e-3 : 3e-3) * v_max + 8e-3 * fabs(want) + 1e-6;
          if (!(fabs(got - want) <= tolerance)) {
            if (bad++ < 5) fprintf(stderr, "%s: o row %d head %d d %d: %f, want %f\n", what, row, h, i, got, want);
          }
        }
      }
    }
  }
  if (bad != 0) fprintf(stderr, "%s: %ld elements out of tolerance\n", what, bad);
  EXPECT(bad == 0);
}

static void test_mla(slimserve_kv_dtype dtype, slimserve_mla_scale_mode mode) {
  static const int32_t kv_len[3] = {2, MPAGE + 1, 45};
  const int32_t batch = 3, rows = batch * QT + 1; /* + 1: the ragged step below has 7 rows */
  const int64_t record = slimserve_mla_record_bytes(dtype, mode);
  const float sm_scale = 0.0721687836f; /* 1 / sqrt(192) */
  const float tensor_scale = 3.0f / 448.0f; /* per_tensor: the calibrated amax of the latent / 448 */
  void* d_tensor_scale = upload(&tensor_scale, sizeof tensor_scale);
  int32_t indptr[4], last[3], indices[MPAGES], block[3 * 5], b, i, p, entries = 0, width = 5, new_tokens = 0;
  int32_t append_indptr[4];
  uint32_t tags[MPAGES], block_tags[3 * 5];
  uint16_t *latent, *rope, *q, *o, *gathered;
  uint8_t* pages;
  float* lse;
  double* keys[3];
  void *d_pages, *d_latent, *d_rope, *d_indptr, *d_indices, *d_last, *d_tags, *d_append_indptr, *d_block,
      *d_block_tags, *d_seq_lens, *d_q, *d_o, *d_lse, *d_workspace, *d_gathered;
  slimserve_page_table_view table;
  slimserve_block_table_view block_table;
  slimserve_mla_append_args append;
  slimserve_mla_plan_args plan_args;
  slimserve_mla_bound bound;
  slimserve_mla_plan* plan = NULL;
  slimserve_mla_decode_args args;
  slimserve_mla_gather_args gather;
  size_t bytes = 0, bound_bytes = 0;
  long bad = 0;

  EXPECT(record == (dtype == SLIMSERVE_KV_BF16     ? 1152
                    : dtype == SLIMSERVE_KV_NVFP4  ? 416
                    : mode == SLIMSERVE_MLA_SCALE_PER_TENSOR ? 640
                                                              : 656));
  indptr[0] = append_indptr[0] = 0;
  for (b = 0; b < batch; ++b) {
    const int32_t count = (kv_len[b] + MPAGE - 1) / MPAGE;
    for (i = 0; i < width; ++i) {
      block[b * width + i] = 1000 + i; /* past the request's pages: never read */
      block_tags[b * width + i] = 1u;
    }
    for (i = 0; i < count; ++i) tags[entries + i] = 1u;
    entries += count;
    indptr[b + 1] = entries;
    last[b] = kv_len[b] - (count - 1) * MPAGE;
    append_indptr[b + 1] = append_indptr[b] + kv_len[b]; /* every token appended in one step */
  }
  /* distinct page ids, descending with holes */
  for (b = 0, p = MPAGES - 1; b < batch; ++b) {
    for (i = 0; i < (kv_len[b] + MPAGE - 1) / MPAGE; ++i, p -= 2) {
      block[b * width + i] = p;
      indices[indptr[b] + i] = p;
    }
  }
  new_tokens = append_indptr[batch];

  latent = malloc((size_t)(new_tokens * LATENT) * sizeof(uint16_t));
  rope = malloc((size_t)(new_tokens * ROPE) * sizeof(uint16_t));
  for (i = 0; i < new_tokens * LATENT; ++i) latent[i] = to_bf16(uniform() * 3.0);
  for (i = 0; i < new_tokens * ROPE; ++i) rope[i] = to_bf16(uniform());
  q = malloc((size_t)(rows * MHEADS * QK) * sizeof(uint16_t));
  for (i = 0; i < rows * MHEADS * QK; ++i) q[i] = to_bf16(uniform());

  d_pages = device_filled((size_t)(MPAGES * MPAGE * record), 0x3c);
  d_latent = upload(latent, (size_t)(new_tokens * LATENT) * sizeof(uint16_t));
  d_rope = upload(rope, (size_t)(new_tokens * ROPE) * sizeof(uint16_t));
  d_indptr = upload(indptr, sizeof indptr);
  d_indices = upload(indices, (size_t)entries * sizeof(int32_t));
  d_last = upload(last, sizeof last);
  d_tags = upload(tags, (size_t)entries * sizeof(uint32_t));
  d_append_indptr = upload(append_indptr, sizeof append_indptr);
  d_block = upload(block, sizeof block);
  d_block_tags = upload(block_tags, sizeof block_tags);
  d_seq_lens = upload(kv_len, sizeof kv_len);
  d_q = upload(q, (size_t)(rows * MHEADS * QK) * sizeof(uint16_t));
  d_o = device_filled((size_t)(rows * MHEADS * LATENT) * sizeof(uint16_t), 0x7f);
  d_lse = device_filled((size_t)(rows * MHEADS) * sizeof(float), 0x7f);
  table.indptr = d_indptr;
  table.indices = d_indices;
  table.last_page_len = d_last;
  table.expected_tags = d_tags;
  table.batch_size = batch;
  table.page_size = MPAGE;
  block_table.block_table = d_block;
  block_table.expected_tags = d_block_tags;
  block_table.seq_lens = d_seq_lens;
  block_table.batch_size = batch;
  block_table.max_pages_per_request = width;
  block_table.page_size = MPAGE;

  memset(&append, 0, sizeof append);
  append.struct_size = sizeof append;
  append.cache.pages = d_pages;
  append.cache.num_pages = MPAGES;
  append.cache.page_size = MPAGE;
  append.cache.dtype = dtype;
  append.cache.scale_mode = mode;
  if (mode == SLIMSERVE_MLA_SCALE_PER_TENSOR) append.cache.latent_scale = d_tensor_scale;
  append.table = &table;
  append.latent_new = d_latent;
  append.rope_new = d_rope;
  append.input_dtype = SLIMSERVE_ACT_BF16;
  append.num_tokens = new_tokens;
  append.append_indptr = d_append_indptr;
  CHECK_OK(slimserve_mla_append(&append, NULL));

  /* What the cache holds, decoded: the reference's keys (latent | rope); values = latent. */
  pages = malloc((size_t)(MPAGES * MPAGE * record));
  download(pages, d_pages, (size_t)(MPAGES * MPAGE * record));
  for (b = 0; b < batch; ++b) {
    keys[b] = malloc((size_t)(kv_len[b] * QK) * sizeof(double));
    for (p = 0; p < kv_len[b]; ++p) {
      const int32_t page = indices[indptr[b] + p / MPAGE];
      const int32_t token = append_indptr[b] + p;
      mla_token(pages + (size_t)((page * MPAGE + p % MPAGE) * record), dtype, mode, tensor_scale, keys[b] + p * QK);
      if (dtype == SLIMSERVE_KV_BF16) { /* BF16 stores the inputs exactly */
        for (i = 0; i < LATENT; ++i) bad += keys[b][p * QK + i] != from_bf16(latent[token * LATENT + i]);
      } else if (dtype == SLIMSERVE_KV_NVFP4) {
        /* NVFP4: within half the largest e2m1 step (1 of 6) of its block's scale, which is the
         * block's amax / 6 rounded to E4M3 (x 1.0625 at most): 0.18 of the block's amax. */
        int32_t block_start;
        for (block_start = 0; block_start < LATENT; block_start += 16) {
          double amax = 0.0;
          for (i = block_start; i < block_start + 16; ++i) amax = fmax(amax, fabs(from_bf16(latent[token * LATENT + i])));
          for (i = block_start; i < block_start + 16; ++i) {
            const double want = from_bf16(latent[token * LATENT + i]);
            bad += !(fabs(keys[b][p * QK + i] - want) <= 0.18 * amax + 1e-6);
          }
        }
      } else { /* FP8: within half an e4m3 step of the input */
        for (i = 0; i < LATENT; ++i) {
          const double want = from_bf16(latent[token * LATENT + i]);
          bad += !(fabs(keys[b][p * QK + i] - want) <= 0.0625 * fabs(want) + 1e-3);
        }
      }
      for (i = 0; i < ROPE; ++i) bad += keys[b][p * QK + LATENT + i] != from_bf16(rope[token * ROPE + i]);
    }
  }
  EXPECT(bad == 0);

  memset(&plan_args, 0, sizeof plan_args);
  plan_args.struct_size = sizeof plan_args;
  plan_args.problem.batch_size = batch;
  plan_args.problem.num_heads = MHEADS;
  plan_args.problem.query_tokens = QT;
  plan_args.problem.page_size = MPAGE;
  plan_args.problem.kv_dtype = dtype;
  plan_args.problem.scale_mode = mode;
  plan_args.problem.q_dtype = SLIMSERVE_ACT_BF16;
  plan_args.seq_lens_host = kv_len;
  plan_args.num_sms = 4;
  plan_args.min_chunk_tokens = 16;
  CHECK_OK(slimserve_mla_workspace_size(&plan_args, &bytes));
  memset(&bound, 0, sizeof bound);
  bound.struct_size = sizeof bound;
  bound.problem = plan_args.problem;
  bound.num_sms = 4;
  CHECK_OK(slimserve_mla_workspace_bound(&bound, &bound_bytes));
  EXPECT(bound_bytes >= bytes && bytes > 0);
  CHECK_OK(slimserve_device_alloc(bytes, &d_workspace));
  CHECK_OK(slimserve_mla_plan_create(&plan_args, d_workspace, bytes, NULL, &plan));

  memset(&args, 0, sizeof args);
  args.struct_size = sizeof args;
  args.cache = append.cache;
  args.block_table = &block_table;
  args.q = d_q;
  args.o = d_o;
  args.lse = d_lse;
  args.sm_scale = sm_scale;
  CHECK_OK(slimserve_mla_decode_run(plan, &args, d_workspace, bytes, NULL));
  o = malloc((size_t)(rows * MHEADS * LATENT) * sizeof(uint16_t));
  lse = malloc((size_t)(rows * MHEADS) * sizeof(float));
  download(o, d_o, (size_t)(rows * MHEADS * LATENT) * sizeof(uint16_t));
  download(lse, d_lse, (size_t)(rows * MHEADS) * sizeof(float));

  {
    int32_t qo_indptr[4];
    for (b = 0; b <= batch; ++b) qo_indptr[b] = b * QT;
    check_mla("MLA decode", batch, kv_len, qo_indptr, keys, q, o, lse, sm_scale, dtype);
  }

  /* Ragged absorbed prefill: request b owns rows [qo[b], qo[b + 1]) (0 .. 5 of them), CSR table. */
  {
    const int32_t qo_indptr[4] = {0, 2, 2, 7};
    slimserve_mla_plan* ragged = NULL;
    size_t ragged_bytes = 0;
    void* d_ragged_workspace;
    memset(&plan_args, 0, sizeof plan_args);
    plan_args.struct_size = sizeof plan_args;
    plan_args.problem.batch_size = batch;
    plan_args.problem.num_heads = MHEADS;
    plan_args.problem.query_tokens = 5;
    plan_args.problem.page_size = MPAGE;
    plan_args.problem.kv_dtype = dtype;
    plan_args.problem.scale_mode = mode;
    plan_args.problem.q_dtype = SLIMSERVE_ACT_BF16;
    plan_args.problem.ragged_queries = 1;
    plan_args.kv_indptr_host = indptr;
    plan_args.last_page_len_host = last;
    plan_args.qo_indptr_host = qo_indptr;
    CHECK_OK(slimserve_mla_workspace_size(&plan_args, &ragged_bytes));
    CHECK_OK(slimserve_device_alloc(ragged_bytes, &d_ragged_workspace));
    CHECK_OK(slimserve_mla_plan_create(&plan_args, d_ragged_workspace, ragged_bytes, NULL, &ragged));
    args.block_table = NULL;
    args.table = &table;
    CHECK_OK(slimserve_memset_async(d_o, 0x7f, (size_t)(rows * MHEADS * LATENT) * sizeof(uint16_t), NULL));
    CHECK_OK(slimserve_mla_decode_run(ragged, &args, d_ragged_workspace, ragged_bytes, NULL));
    download(o, d_o, (size_t)(rows * MHEADS * LATENT) * sizeof(uint16_t));
    download(lse, d_lse, (size_t)(rows * MHEADS) * sizeof(float));
    check_mla("MLA ragged", batch, kv_len, qo_indptr, keys, q, o, lse, sm_scale, dtype);
    args.table = NULL;
    args.block_table = &block_table;
    slimserve_mla_plan_destroy(ragged);
    release(d_ragged_workspace);
    plan_args.problem.query_tokens = QT;
    plan_args.problem.ragged_queries = 0;
    plan_args.kv_indptr_host = plan_args.last_page_len_host = plan_args.qo_indptr_host = NULL;
    plan_args.seq_lens_host = kv_len;
  }

  /* The prefix gather: BF16 rows [latent | rope] with a padded stride. */
  {
    const int32_t stride = QK + 8;
    int32_t token_indptr[4];
    void* d_token_indptr;
    token_indptr[0] = 0;
    for (b = 0; b < batch; ++b) token_indptr[b + 1] = token_indptr[b] + kv_len[b] - 1; /* all but the last */
    d_token_indptr = upload(token_indptr, sizeof token_indptr);
    d_gathered = device_filled((size_t)(new_tokens * stride) * sizeof(uint16_t), 0x7f);
    memset(&gather, 0, sizeof gather);
    gather.struct_size = sizeof gather;
    gather.cache = append.cache;
    gather.table = &table;
    gather.token_indptr = d_token_indptr;
    gather.out = d_gathered;
    gather.out_stride = stride;
    gather.num_rows = new_tokens;
    CHECK_OK(slimserve_mla_gather(&gather, NULL));
    gathered = malloc((size_t)(new_tokens * stride) * sizeof(uint16_t));
    download(gathered, d_gathered, (size_t)(new_tokens * stride) * sizeof(uint16_t));
    bad = 0;
    for (b = 0; b < batch; ++b) {
      for (p = 0; p < kv_len[b] - 1; ++p) {
        const uint16_t* row = gathered + (token_indptr[b] + p) * stride;
        for (i = 0; i < QK; ++i) {
          const double want = keys[b][p * QK + i], got = from_bf16(row[i]);
          bad += !(fabs(got - want) <= ldexp(1.0, -8) * fabs(want)); /* BF16 of the dequantized value */
        }
        for (i = QK; i < stride; ++i) bad += row[i] != 0x7f7f;
      }
    }
    for (i = token_indptr[batch] * stride; i < new_tokens * stride; ++i) bad += gathered[i] != 0x7f7f;
    EXPECT(bad == 0);
    free(gathered);
    release(d_token_indptr);
    release(d_gathered);
  }

  /* Refusals. */
  args.sm_scale = 0.0f; /* MLA has no default scale */
  EXPECT_REFUSED(slimserve_mla_decode_run(plan, &args, d_workspace, bytes, NULL), SLIMSERVE_INVALID_ARGUMENT,
                 "sm_scale");
  args.sm_scale = sm_scale;
  EXPECT_REFUSED(slimserve_mla_decode_run(plan, &args, d_workspace, bytes / 2, NULL), SLIMSERVE_RESOURCE_EXHAUSTED,
                 "workspace");
  args.o_head_stride = 256; /* half a latent row: heads would overlap */
  EXPECT_REFUSED(slimserve_mla_decode_run(plan, &args, d_workspace, bytes, NULL), SLIMSERVE_INVALID_ARGUMENT,
                 "overlap");
  args.o_head_stride = 0;
  args.table = &table;
  EXPECT_REFUSED(slimserve_mla_decode_run(plan, &args, d_workspace, bytes, NULL), SLIMSERVE_INVALID_ARGUMENT,
                 "exactly one");
  args.table = NULL;
  args.cache.scale_mode = 9;
  EXPECT_REFUSED(slimserve_mla_decode_run(plan, &args, d_workspace, bytes, NULL), SLIMSERVE_INVALID_ARGUMENT,
                 "MLA scale mode");
  args.cache.scale_mode = mode;
  { /* the cache's layout description takes the same conversion and refuses the same modes */
    slimserve_cache_layout layout;
    slimserve_mla_cache bad = args.cache;
    memset(&layout, 0, sizeof layout);
    CHECK_OK(slimserve_describe_mla_cache(&args.cache, &layout));
    EXPECT(layout.kind == SLIMSERVE_CACHE_MLA_LATENT && layout.dtype == dtype && layout.scale_mode == mode);
    EXPECT(layout.num_pages == MPAGES && layout.page_size == MPAGE && layout.k.address == (uint64_t)(uintptr_t)d_pages);
    bad.scale_mode = 9;
    EXPECT_REFUSED(slimserve_describe_mla_cache(&bad, &layout), SLIMSERVE_INVALID_ARGUMENT, "MLA scale mode");
    bad.scale_mode = mode;
    bad.page_size = 12;
    EXPECT_REFUSED(slimserve_describe_mla_cache(&bad, &layout), SLIMSERVE_UNSUPPORTED, "12");
  }
  plan_args.problem.num_heads = 12;
  EXPECT_REFUSED(slimserve_mla_workspace_size(&plan_args, &bytes), SLIMSERVE_UNSUPPORTED, "12");
  plan_args.problem.num_heads = MHEADS;
  plan_args.qo_indptr_host = indptr; /* without ragged_queries */
  EXPECT_REFUSED(slimserve_mla_workspace_size(&plan_args, &bytes), SLIMSERVE_INVALID_ARGUMENT, "ragged_queries");
  plan_args.qo_indptr_host = NULL;
  append.latent_stride = 500; /* not a multiple of 8 */
  EXPECT_REFUSED(slimserve_mla_append(&append, NULL), SLIMSERVE_INVALID_ARGUMENT, "stride");
  append.latent_stride = 0;
  append.struct_size = sizeof append - 8;
  EXPECT_REFUSED(slimserve_mla_append(&append, NULL), SLIMSERVE_INVALID_ARGUMENT, "struct_size");
  EXPECT(slimserve_mla_record_bytes(SLIMSERVE_KV_FP16, SLIMSERVE_MLA_SCALE_NONE) == 0);
  /* NVFP4: 256 code bytes, 32 block scales, 128 rope bytes; its only scale mode is per_tensor. */
  EXPECT(slimserve_mla_record_bytes(SLIMSERVE_KV_NVFP4, SLIMSERVE_MLA_SCALE_PER_TENSOR) == 416);
  EXPECT(slimserve_mla_record_bytes(SLIMSERVE_KV_NVFP4, SLIMSERVE_MLA_SCALE_PER_TOKEN_GROUP) == 0);
  {
    void* untouched = malloc((size_t)(rows * MHEADS * LATENT) * sizeof(uint16_t));
    download(untouched, d_o, (size_t)(rows * MHEADS * LATENT) * sizeof(uint16_t));
    EXPECT(memcmp(untouched, o, (size_t)(rows * MHEADS * LATENT) * sizeof(uint16_t)) == 0);
    free(untouched);
  }

  slimserve_mla_plan_destroy(plan);
  slimserve_mla_plan_destroy(NULL);
  for (b = 0; b < batch; ++b) free(keys[b]);
  free(latent); free(rope); free(q); free(o); free(lse); free(pages);
  release(d_pages); release(d_latent); release(d_rope); release(d_indptr); release(d_indices); release(d_last);
  release(d_tags); release(d_append_indptr); release(d_block); release(d_block_tags); release(d_seq_lens);
  release(d_q); release(d_o); release(d_lse); release(d_workspace); release(d_tensor_scale);
}

int main(void) {
  start_test("c_attention_test");
  EXPECT(slimserve_c_abi_version() >= 2);
  test_paged_attention_bf16();
  test_fused_prefill_fp8();
  test_merge();
  test_mla(SLIMSERVE_KV_BF16, SLIMSERVE_MLA_SCALE_NONE);
  test_mla(SLIMSERVE_KV_FP8_E4M3, SLIMSERVE_MLA_SCALE_PER_TOKEN_GROUP);
  test_mla(SLIMSERVE_KV_FP8_E4M3, SLIMSERVE_MLA_SCALE_PER_TENSOR);
  test_mla(SLIMSERVE_KV_NVFP4, SLIMSERVE_MLA_SCALE_PER_TENSOR);
  return finish_test("c_attention_test");
}
