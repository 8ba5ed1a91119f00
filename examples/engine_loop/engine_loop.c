/*
 * The engine loop over the C ABI (include/slimserve/c/slimserve.h), as a C engine (or a Rust,
 * Go or Zig one through its FFI) drives slimserve:
 *
 *   admit A (no prefix hit) -> append its prompt -> decode -> append one token -> finish
 *   (index its full pages, release) -> admit B with A's prompt (prefix hit on 2 pages, A's
 *   freed last page reused under a new tag) -> append the rest -> decode B together with a
 *   "zombie" that still holds A's old handles: the GPU tag check aborts the zombie (its rows
 *   come back NaN) and B's output equals A's, bit for bit.
 *
 * Runs on the CPU emulator (libslimserve_c_emulated) in CI and unchanged on a GPU
 * (libslimserve_c). Exit status 0 when every check passed.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <slimserve/c/slimserve.h>

enum { PAGE_SIZE = 16, NUM_PAGES = 64, KV_HEADS = 2, QO_HEADS = 4, HEAD_DIM = 64 };
enum { MAX_BATCH = 4, MAX_ENTRIES = 64, MAX_TOKENS = 64, MAX_PAGES = 8, PROMPT = 40 };

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

/* ---- BF16 on the host --------------------------------------------------------------------- */

static uint16_t to_bf16(float value) {
  uint32_t bits;
  memcpy(&bits, &value, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fc0; /* NaN */
  bits += 0x7fffu + ((bits >> 16) & 1u);                /* round to nearest even */
  return (uint16_t)(bits >> 16);
}
static float from_bf16(uint16_t value) {
  uint32_t bits = (uint32_t)value << 16;
  float result;
  memcpy(&result, &bits, sizeof result);
  return result;
}

/* ---- A stand-in model: K, V and queries as a pure function of (token, position) ----------------- */

static uint64_t seed;

static float model_value(int32_t token, int32_t position, int32_t head, int32_t d, int32_t which) {
  uint64_t x = seed ^ ((uint64_t)(uint32_t)token << 40) ^ ((uint64_t)(uint32_t)position << 20) ^
               ((uint64_t)(uint32_t)head << 10) ^ (uint64_t)(uint32_t)d ^ ((uint64_t)which << 62);
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  x ^= x >> 31;
  return (float)((double)(x >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* ---- Device helpers ------------------------------------------------------------------------- */

static void* device_upload(const void* host, size_t bytes) {
  void* device = NULL;
  CHECK_OK(slimserve_device_alloc(bytes, &device));
  CHECK_OK(slimserve_memcpy_async(device, host, bytes, SLIMSERVE_HOST_TO_DEVICE, NULL));
  return device;
}
static void device_download(void* host, const void* device, size_t bytes) {
  CHECK_OK(slimserve_memcpy_async(host, device, bytes, SLIMSERVE_DEVICE_TO_HOST, NULL));
  CHECK_OK(slimserve_stream_synchronize(NULL));
}

/* ---- The engine ----------------------------------------------------------------------------- */

typedef struct sequence {
  int32_t tokens[MAX_TOKENS];
  int32_t num_tokens;
  int32_t stored_tokens; /* tokens whose K/V are in the pages */
  slimserve_page pages[MAX_PAGES];
  int32_t num_pages;
} sequence;

typedef struct engine {
  slimserve_page_pool* pool;
  slimserve_prefix_cache* cache;
  slimserve_device_tags* tags;
  slimserve_page_table* table;
  slimserve_kv_cache kv;
  slimserve_request_status* statuses; /* device [MAX_BATCH] */
  uint64_t tenant_salt;
} engine;

static void engine_create(engine* e) {
  const size_t page_bytes = (size_t)PAGE_SIZE * KV_HEADS * HEAD_DIM * sizeof(uint16_t);
  memset(e, 0, sizeof *e);
  CHECK_OK(slimserve_page_pool_create(NUM_PAGES, &e->pool));
  CHECK_OK(slimserve_prefix_cache_create(e->pool, PAGE_SIZE, 0x5eed, &e->cache));
  CHECK_OK(slimserve_device_tags_create(NUM_PAGES, &e->tags));
  CHECK_OK(slimserve_page_table_create(MAX_BATCH, MAX_ENTRIES, PAGE_SIZE, NUM_PAGES, &e->table));
  CHECK_OK(slimserve_device_alloc(NUM_PAGES * page_bytes, &e->kv.k_pages));
  CHECK_OK(slimserve_device_alloc(NUM_PAGES * page_bytes, &e->kv.v_pages));
  e->kv.num_pages = NUM_PAGES;
  e->kv.page_size = PAGE_SIZE;
  e->kv.num_kv_heads = KV_HEADS;
  e->kv.head_dim = HEAD_DIM;
  e->kv.dtype = SLIMSERVE_KV_BF16;
  e->kv.layout = SLIMSERVE_KV_NHD;
  e->kv.scale_mode = SLIMSERVE_SCALE_NONE;
  CHECK_OK(slimserve_device_alloc(MAX_BATCH * sizeof(slimserve_request_status), (void**)&e->statuses));
  e->tenant_salt = 42;
}

static void engine_destroy(engine* e) {
  CHECK_OK(slimserve_device_free(e->statuses));
  CHECK_OK(slimserve_device_free(e->kv.k_pages));
  CHECK_OK(slimserve_device_free(e->kv.v_pages));
  slimserve_page_table_destroy(e->table);
  slimserve_device_tags_destroy(e->tags);
  slimserve_prefix_cache_destroy(e->cache); /* before its pool */
  slimserve_page_pool_destroy(e->pool);
}

/* Admission: cached prefix pages first (never the last token: it must be computed), then
 * fresh pages, all or nothing. */
static int32_t admit(engine* e, sequence* s) {
  int32_t hits = 0;
  const int32_t needed = (s->num_tokens + PAGE_SIZE - 1) / PAGE_SIZE;
  CHECK_OK(slimserve_prefix_cache_match(e->cache, s->tokens, (size_t)(s->num_tokens - 1),
                                        e->tenant_salt, 0, s->pages, MAX_PAGES, &hits));
  CHECK_OK(slimserve_page_pool_allocate(e->pool, s->pages + hits, (size_t)(needed - hits)));
  s->num_pages = needed;
  s->stored_tokens = hits * PAGE_SIZE;
  return hits;
}

/* Builds and uploads the batch's page table, syncs tags and runs the tag check. */
static void schedule(engine* e, sequence* const* batch, int32_t batch_size,
                     slimserve_page_table_view* host, slimserve_page_table_view* device) {
  slimserve_request_pages requests[MAX_BATCH];
  int32_t b;
  for (b = 0; b < batch_size; ++b) {
    requests[b].pages = batch[b]->pages;
    requests[b].num_pages = (size_t)batch[b]->num_pages;
    requests[b].num_tokens = batch[b]->num_tokens;
  }
  CHECK_OK(slimserve_page_table_build(e->table, requests, batch_size, NULL, host, device));
  CHECK_OK(slimserve_device_tags_sync(e->tags, e->pool, NULL));
  CHECK_OK(slimserve_check_page_tags(device, e->tags, e->statuses, NULL, NULL));
}

/* Appends the tokens of one sequence not yet stored (explicit form: request 0, positions). */
static void append_pending(engine* e, sequence* s) {
  const int32_t count = s->num_tokens - s->stored_tokens;
  const size_t row = (size_t)KV_HEADS * HEAD_DIM;
  uint16_t* k = malloc((size_t)count * row * sizeof *k);
  uint16_t* v = malloc((size_t)count * row * sizeof *v);
  int32_t* request = malloc((size_t)count * sizeof *request);
  int32_t* position = malloc((size_t)count * sizeof *position);
  slimserve_page_table_view host, device;
  slimserve_append_args args;
  sequence* batch[1];
  int32_t t, h, d;
  for (t = 0; t < count; ++t) {
    const int32_t pos = s->stored_tokens + t;
    request[t] = 0;
    position[t] = pos;
    for (h = 0; h < KV_HEADS; ++h) {
      for (d = 0; d < HEAD_DIM; ++d) {
        k[(size_t)t * row + (size_t)h * HEAD_DIM + (size_t)d] = to_bf16(model_value(s->tokens[pos], pos, h, d, 0));
        v[(size_t)t * row + (size_t)h * HEAD_DIM + (size_t)d] = to_bf16(model_value(s->tokens[pos], pos, h, d, 1));
      }
    }
  }
  batch[0] = s;
  schedule(e, batch, 1, &host, &device);
  memset(&args, 0, sizeof args);
  args.k_new = device_upload(k, (size_t)count * row * sizeof *k);
  args.v_new = device_upload(v, (size_t)count * row * sizeof *v);
  args.token_request = device_upload(request, (size_t)count * sizeof *request);
  args.token_position = device_upload(position, (size_t)count * sizeof *position);
  args.input_dtype = SLIMSERVE_ACT_BF16;
  args.num_tokens = count;
  CHECK_OK(slimserve_append_kv(&e->kv, &device, e->statuses, &args, NULL));
  CHECK_OK(slimserve_stream_synchronize(NULL));
  CHECK_OK(slimserve_device_free((void*)args.k_new));
  CHECK_OK(slimserve_device_free((void*)args.v_new));
  CHECK_OK(slimserve_device_free((void*)args.token_request));
  CHECK_OK(slimserve_device_free((void*)args.token_position));
  free(k);
  free(v);
  free(request);
  free(position);
  s->stored_tokens = s->num_tokens;
}

/* One decode step for the batch, query = the stand-in model's query at each last position.
 * Writes o (host, [batch, QO_HEADS, HEAD_DIM] BF16) and the verdicts. */
static void decode(engine* e, sequence* const* batch, int32_t batch_size, uint16_t* o,
                   slimserve_request_status* verdicts) {
  const size_t rows = (size_t)batch_size * QO_HEADS * HEAD_DIM;
  uint16_t* q = malloc(rows * sizeof *q);
  slimserve_page_table_view host, device;
  slimserve_decode_problem problem;
  slimserve_decode_plan* plan = NULL;
  slimserve_decode_args args;
  size_t workspace_bytes = 0;
  void* workspace = NULL;
  int32_t b, h, d;
  for (b = 0; b < batch_size; ++b) {
    const int32_t last = batch[b]->num_tokens - 1;
    for (h = 0; h < QO_HEADS; ++h) {
      for (d = 0; d < HEAD_DIM; ++d) {
        q[((size_t)b * QO_HEADS + (size_t)h) * HEAD_DIM + (size_t)d] =
            to_bf16(model_value(batch[b]->tokens[last], last, h, d, 2));
      }
    }
  }
  schedule(e, batch, batch_size, &host, &device);
  problem.batch_size = batch_size;
  problem.num_qo_heads = QO_HEADS;
  problem.num_kv_heads = KV_HEADS;
  problem.head_dim = HEAD_DIM;
  problem.page_size = PAGE_SIZE;
  problem.query_tokens = 1;
  problem.kv_dtype = SLIMSERVE_KV_BF16;
  CHECK_OK(slimserve_decode_workspace_size(&problem, host.indptr, host.last_page_len, &workspace_bytes));
  CHECK_OK(slimserve_device_alloc(workspace_bytes, &workspace));
  CHECK_OK(slimserve_decode_plan_create(&problem, host.indptr, host.last_page_len, workspace,
                                        workspace_bytes, NULL, &plan));
  args.q = device_upload(q, rows * sizeof *q);
  CHECK_OK(slimserve_device_alloc(rows * sizeof *o, &args.o));
  args.lse = NULL;
  args.q_dtype = SLIMSERVE_ACT_BF16;
  args.sm_scale = 1.0f / sqrtf((float)HEAD_DIM);
  CHECK_OK(slimserve_decode_run(plan, &e->kv, &device, e->statuses, &args, workspace,
                                workspace_bytes, NULL));
  device_download(o, args.o, rows * sizeof *o);
  device_download(verdicts, e->statuses, (size_t)batch_size * sizeof *verdicts);
  slimserve_decode_plan_destroy(plan);
  CHECK_OK(slimserve_device_free((void*)args.q));
  CHECK_OK(slimserve_device_free(args.o));
  CHECK_OK(slimserve_device_free(workspace));
  free(q);
}

/* Completion: index the full pages for reuse, then drop this sequence's references. */
static void finish(engine* e, sequence* s) {
  int32_t inserted = 0;
  CHECK_OK(slimserve_prefix_cache_insert(e->cache, s->tokens, (size_t)s->num_tokens,
                                         e->tenant_salt, 0, s->pages, (size_t)s->num_pages,
                                         &inserted));
  CHECK_OK(slimserve_page_pool_release(e->pool, s->pages, (size_t)s->num_pages));
}

/* FP64 reference of one request's decode from the BF16 values the cache holds. */
static double max_reference_error(const sequence* s, const uint16_t* o) {
  const int32_t length = s->num_tokens, last = length - 1, group = QO_HEADS / KV_HEADS;
  double worst = 0.0, scores[MAX_TOKENS];
  int32_t h, t, d;
  for (h = 0; h < QO_HEADS; ++h) {
    double top = -INFINITY, total = 0.0;
    for (t = 0; t < length; ++t) {
      double dot = 0.0;
      for (d = 0; d < HEAD_DIM; ++d) {
        dot += (double)from_bf16(to_bf16(model_value(s->tokens[last], last, h, d, 2))) *
               (double)from_bf16(to_bf16(model_value(s->tokens[t], t, h / group, d, 0)));
      }
      scores[t] = dot / sqrt((double)HEAD_DIM);
      if (scores[t] > top) top = scores[t];
    }
    for (t = 0; t < length; ++t) total += exp(scores[t] - top);
    for (d = 0; d < HEAD_DIM; ++d) {
      double out = 0.0, error;
      for (t = 0; t < length; ++t) {
        out += exp(scores[t] - top) / total *
               (double)from_bf16(to_bf16(model_value(s->tokens[t], t, h / group, d, 1)));
      }
      error = fabs((double)from_bf16(o[(size_t)h * HEAD_DIM + (size_t)d]) - out) / (1.0 + fabs(out));
      if (!(error <= worst)) worst = error; /* NaN propagates */
    }
  }
  return worst;
}

int main(void) {
  const size_t row = (size_t)QO_HEADS * HEAD_DIM;
  engine e;
  sequence a, b, zombie;
  uint16_t o_a[QO_HEADS * HEAD_DIM], o_batch[2 * QO_HEADS * HEAD_DIM];
  slimserve_request_status verdicts[2];
  slimserve_append_target target;
  sequence* batch[2];
  int32_t i, hits;
  size_t j;
  const char* seed_text = getenv("SLIMSERVE_TEST_SEED");
  seed = seed_text != NULL ? strtoull(seed_text, NULL, 10) : (uint64_t)time(NULL);
  printf("engine_loop (C ABI, %s): seed %llu\n", slimserve_is_emulated() ? "CPU emulator" : "GPU",
         (unsigned long long)seed);
  EXPECT(slimserve_c_abi_version() == SLIMSERVE_C_ABI_VERSION);
  engine_create(&e);

  /* A: admit (no hit), append the prompt, decode. */
  memset(&a, 0, sizeof a);
  a.num_tokens = PROMPT;
  for (i = 0; i < PROMPT; ++i) a.tokens[i] = 1000 + 7 * i;
  EXPECT(admit(&e, &a) == 0);
  append_pending(&e, &a);
  batch[0] = &a;
  decode(&e, batch, 1, o_a, verdicts);
  EXPECT(verdicts[0].state == SLIMSERVE_REQUEST_OK);
  EXPECT(max_reference_error(&a, o_a) < 1.0 / 64);

  /* A generates one token: the last page has room and is not shared, so no copy. */
  CHECK_OK(slimserve_page_pool_prepare_append(e.pool, a.pages[a.num_pages - 1], &target));
  EXPECT(target.needs_copy == 0 && target.page.id == a.pages[a.num_pages - 1].id);
  a.tokens[a.num_tokens++] = 5;
  append_pending(&e, &a);

  /* Finish A: its two full pages are indexed and stay cached; its last page is freed. */
  zombie = a; /* an engine bug: a stale copy of A's handles */
  finish(&e, &a);

  /* B: A's prompt again. Prefix hit on A's two full pages; the third page is A's freed last
   * page under a new tag. */
  memset(&b, 0, sizeof b);
  b.num_tokens = PROMPT;
  memcpy(b.tokens, a.tokens, PROMPT * sizeof b.tokens[0]);
  hits = admit(&e, &b);
  EXPECT(hits == 2);
  EXPECT(b.pages[0].id == a.pages[0].id && b.pages[0].tag == a.pages[0].tag);
  EXPECT(b.pages[2].id == a.pages[2].id && b.pages[2].tag != a.pages[2].tag);
  EXPECT(slimserve_page_pool_validate(e.pool, zombie.pages[2]) == SLIMSERVE_STALE_HANDLE);
  EXPECT(b.stored_tokens == 2 * PAGE_SIZE);
  append_pending(&e, &b); /* only positions 32..39 */

  /* Decode B with the zombie in the same batch: the tag check aborts only the zombie. */
  for (j = 0; j < sizeof o_batch / sizeof o_batch[0]; ++j) o_batch[j] = 0x1234; /* poison */
  batch[0] = &b;
  batch[1] = &zombie;
  decode(&e, batch, 2, o_batch, verdicts);
  EXPECT(verdicts[0].state == SLIMSERVE_REQUEST_OK);
  EXPECT(verdicts[1].state == SLIMSERVE_REQUEST_STALE_TAG && verdicts[1].failed_slot == 2);
  EXPECT(memcmp(o_batch, o_a, sizeof o_a) == 0); /* reused pages: the same attention, bit for bit */
  for (j = 0; j < row; ++j) EXPECT(isnan(from_bf16(o_batch[row + j])));

  finish(&e, &b);
  engine_destroy(&e);
  if (failures != 0) {
    fprintf(stderr, "engine_loop: %d check(s) failed (seed %llu)\n", failures, (unsigned long long)seed);
    return 1;
  }
  printf("engine_loop: admit, prefix hit, append, decode, finish, reuse and the stale page: ok\n");
  return 0;
}
