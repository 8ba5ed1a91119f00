/*
 * slimserve C ABI (C99): tagged KV pages, FP8/BF16 KV cache append and decode attention, INT4
 * weights, for engines written in C, Rust, Go, Zig, or Python over ctypes/cffi.
 *
 * Conventions
 *  - Every fallible call returns a slimserve_status; SLIMSERVE_OK is 0. On an error the
 *    thread's last message (slimserve_last_error) names the offending value, and nothing was
 *    changed: pools, caches and outputs are as before the call.
 *  - Objects are opaque handles made by *_create and freed by *_destroy (NULL is accepted).
 *    A handle is used by one thread at a time.
 *  - No C++ type crosses this boundary: fixed-width integers, floats, pointers and the plain
 *    structs below. Enumerations travel as int32_t and are range-checked by every call.
 *  - Pointers documented "device" are GPU memory for the CUDA build (libslimserve_c) and
 *    emulator memory from slimserve_device_alloc for the CPU-emulated build
 *    (libslimserve_c_emulated); "host" pointers are ordinary memory.
 *  - Streams are cudaStream_t values passed as slimserve_stream (NULL: the default stream).
 *  - Symbols are versioned and nothing else is exported: the entry points of ABI 1 under the
 *    ELF version node SLIMSERVE_C_1, those added by ABI 2 under SLIMSERVE_C_2, so a binary
 *    built against an earlier header keeps loading (ABI 3: SLIMSERVE_C_3, the cache layouts,
 *    transfer lists, page write ownership and record identities). slimserve_c_abi_version()
 *    must be at least the SLIMSERVE_C_ABI_VERSION the caller was compiled with.
 *  - The argument structs added in ABI 2 (*_args, *_bound, *_plan_info) begin with
 *    `size_t struct_size`, which the caller sets to sizeof of the struct it compiled (memset
 *    to 0 first: 0 is every field's default). The views they hold (block table, problem, MLA
 *    cache) are fixed, as ABI 1's structs are; new fields go into the argument structs.
 *    The library reads only that many bytes; a larger struct from a newer header is accepted
 *    when the fields this library does not know are zero, and refused (SLIMSERVE_UNSUPPORTED)
 *    otherwise, so no request is silently dropped.
 */
#ifndef SLIMSERVE_C_SLIMSERVE_H_
#define SLIMSERVE_C_SLIMSERVE_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SLIMSERVE_C_ABI_VERSION 3

#if defined(__GNUC__) || defined(__clang__)
#define SLIMSERVE_C_API __attribute__((visibility("default")))
#else
#define SLIMSERVE_C_API
#endif

/* ---- Status --------------------------------------------------------------------------- */

typedef int32_t slimserve_status;
enum {
  SLIMSERVE_OK = 0,
  SLIMSERVE_INVALID_ARGUMENT = 1,    /* a value outside what the call accepts */
  SLIMSERVE_OUT_OF_RANGE = 2,        /* an index outside its container */
  SLIMSERVE_UNSUPPORTED = 3,         /* valid, but not implemented by this build */
  SLIMSERVE_RESOURCE_EXHAUSTED = 4,  /* not enough pages / workspace; nothing was taken */
  SLIMSERVE_STALE_HANDLE = 5,        /* a (page, tag) handle whose tag no longer matches */
  SLIMSERVE_FAILED_PRECONDITION = 6, /* wrong state (double free, refcount underflow) */
  SLIMSERVE_DATA_LOSS = 7,           /* an input contradicts itself */
  SLIMSERVE_IO_ERROR = 8,
  SLIMSERVE_DEVICE_ERROR = 9,        /* the CUDA runtime (or the emulator) failed */
  SLIMSERVE_INTERNAL = 10            /* a bug in slimserve (or an unexpected exception) */
};

/* The message of this thread's last failed call ("" after a success). Valid until the next
 * slimserve call on this thread. */
SLIMSERVE_C_API const char* slimserve_last_error(void);
/* "ok", "invalid argument", ...; "unknown" for other values. Static storage. */
SLIMSERVE_C_API const char* slimserve_status_name(slimserve_status status);
/* SLIMSERVE_C_ABI_VERSION of the library (a library of ABI n also serves ABI 1 .. n - 1). */
SLIMSERVE_C_API int32_t slimserve_c_abi_version(void);
/* Library version as major * 10000 + minor * 100 + patch. */
SLIMSERVE_C_API int32_t slimserve_version(void);
/* 1 when this library runs every kernel on the CPU emulator, 0 for the CUDA build. */
SLIMSERVE_C_API int32_t slimserve_is_emulated(void);

/* ---- Memory and streams ---------------------------------------------------------------- */

typedef struct CUstream_st* slimserve_stream;

typedef int32_t slimserve_copy_kind;
enum {
  SLIMSERVE_HOST_TO_DEVICE = 0,
  SLIMSERVE_DEVICE_TO_HOST = 1,
  SLIMSERVE_DEVICE_TO_DEVICE = 2
};

/* Device memory (256-byte aligned; on the emulator it starts filled with 0xFF bytes). */
SLIMSERVE_C_API slimserve_status slimserve_device_alloc(size_t bytes, void** out);
/* A pointer that is not a live allocation of slimserve_device_alloc (freed already, or never
 * allocated here) is refused with SLIMSERVE_FAILED_PRECONDITION by the emulated library; the
 * CUDA build returns cudaFree's error (SLIMSERVE_DEVICE_ERROR). */
SLIMSERVE_C_API slimserve_status slimserve_device_free(void* ptr);
SLIMSERVE_C_API slimserve_status slimserve_memcpy_async(void* dst, const void* src, size_t bytes,
                                                        slimserve_copy_kind kind,
                                                        slimserve_stream stream);
SLIMSERVE_C_API slimserve_status slimserve_memset_async(void* dst, int32_t byte_value,
                                                        size_t bytes, slimserve_stream stream);
SLIMSERVE_C_API slimserve_status slimserve_stream_synchronize(slimserve_stream stream);
/* Page-locked host memory (what swap_pages moves records to and from). */
SLIMSERVE_C_API slimserve_status slimserve_host_alloc(size_t bytes, void** out);
SLIMSERVE_C_API slimserve_status slimserve_host_free(void* ptr);

/* ---- KV pages: pool with generation tags ------------------------------------------------ */

/* A page an owner holds: its id and the tag it had when the owner got it. */
typedef struct slimserve_page {
  int32_t id;
  uint32_t tag;
} slimserve_page;

typedef struct slimserve_page_pool slimserve_page_pool;

/* num_pages includes the guard page 0: num_pages - 1 pages can be allocated. */
SLIMSERVE_C_API slimserve_status slimserve_page_pool_create(int32_t num_pages,
                                                            slimserve_page_pool** out);
SLIMSERVE_C_API void slimserve_page_pool_destroy(slimserve_page_pool* pool);
/* `count` pages, all or nothing (SLIMSERVE_RESOURCE_EXHAUSTED takes none). */
SLIMSERVE_C_API slimserve_status slimserve_page_pool_allocate(slimserve_page_pool* pool,
                                                              slimserve_page* out, size_t count);
/* Drops one reference of each page, all or nothing (a stale handle changes nothing). */
SLIMSERVE_C_API slimserve_status slimserve_page_pool_release(slimserve_page_pool* pool,
                                                             const slimserve_page* pages,
                                                             size_t count);
/* Adds a reference (a forked sequence also holds the page). */
SLIMSERVE_C_API slimserve_status slimserve_page_pool_share(slimserve_page_pool* pool,
                                                           slimserve_page page);
/* SLIMSERVE_OK when `page` is live (in use under this tag), else SLIMSERVE_STALE_HANDLE etc. */
SLIMSERVE_C_API slimserve_status slimserve_page_pool_validate(const slimserve_page_pool* pool,
                                                              slimserve_page page);
/* Pages an allocation can get now (free plus evictable cached pages). */
SLIMSERVE_C_API int32_t slimserve_page_pool_available(const slimserve_page_pool* pool);

/* Before appending into a request's last page: the page to write, and whether the filled
 * tokens of `copy_from` must first be copied into it (the last page was shared or cached). */
typedef struct slimserve_append_target {
  slimserve_page page;
  slimserve_page copy_from;
  int32_t needs_copy;
} slimserve_append_target;
SLIMSERVE_C_API slimserve_status slimserve_page_pool_prepare_append(
    slimserve_page_pool* pool, slimserve_page last_page, slimserve_append_target* out);

/* ---- Prefix cache --------------------------------------------------------------------- */

typedef struct slimserve_prefix_cache slimserve_prefix_cache;

/* Indexes full pages of `pool` by token content. The pool must outlive the cache. */
SLIMSERVE_C_API slimserve_status slimserve_prefix_cache_create(slimserve_page_pool* pool,
                                                               int32_t page_size,
                                                               uint64_t hash_seed,
                                                               slimserve_prefix_cache** out);
SLIMSERVE_C_API void slimserve_prefix_cache_destroy(slimserve_prefix_cache* cache);
/* Longest cached prefix of `tokens` (full pages only): writes up to `capacity` pages, each
 * with a new reference, and their number to *hits. `salt` and `adapter_id` separate tenants
 * and LoRA adapters. */
SLIMSERVE_C_API slimserve_status slimserve_prefix_cache_match(
    slimserve_prefix_cache* cache, const int32_t* tokens, size_t num_tokens, uint64_t salt,
    uint64_t adapter_id, slimserve_page* out, size_t capacity, int32_t* hits);
/* Indexes the full pages of a finished sequence; *inserted receives how many were new. */
SLIMSERVE_C_API slimserve_status slimserve_prefix_cache_insert(
    slimserve_prefix_cache* cache, const int32_t* tokens, size_t num_tokens, uint64_t salt,
    uint64_t adapter_id, const slimserve_page* pages, size_t num_pages, int32_t* inserted);

/* ---- Per-request page sets (write ownership) -------------------------------------------- */

/* The library owns each request's page list: admit, append, fork, preempt, resume and finish
 * release exactly what the request holds, exactly once. A request is named by its slot and
 * its identity (writer); the identity is new on admit, fork and resume, so a stale reference
 * is refused (SLIMSERVE_FAILED_PRECONDITION) and changes nothing. Fresh pages are writable by
 * their request only; prefix hits and forked pages are read-only. */
typedef struct slimserve_request_sets slimserve_request_sets;
typedef struct slimserve_request_ref {
  int32_t slot;
  uint32_t writer; /* the identity the tag check takes in `writers` */
} slimserve_request_ref;

/* What admit / resume / append leave for the engine to do on the device. */
typedef struct slimserve_page_plan {
  int32_t needs_copy;       /* copy-on-write: copy copy_tokens tokens of copy_from into copy_to */
  slimserve_page copy_from; /* held read-only until slimserve_request_sets_release_copy_sources */
  slimserve_page copy_to;
  int32_t copy_tokens;
  int64_t cached_tokens;    /* tokens already in pages (prefix hits) */
} slimserve_page_plan;

/* Page sets over `pool` and `cache` (optional, NULL; must index `pool`); both outlive them. */
SLIMSERVE_C_API slimserve_status slimserve_request_sets_create(slimserve_page_pool* pool,
                                                               slimserve_prefix_cache* cache,
                                                               int32_t max_requests,
                                                               int32_t page_size,
                                                               slimserve_request_sets** out);
SLIMSERVE_C_API void slimserve_request_sets_destroy(slimserve_request_sets* sets);
/* A new request for its prompt: prefix hits for all but the last token, then fresh pages.
 * All or nothing. `plan` may be NULL. */
SLIMSERVE_C_API slimserve_status slimserve_request_sets_admit(
    slimserve_request_sets* sets, const int32_t* tokens, size_t num_tokens, uint64_t salt,
    uint64_t adapter_id, slimserve_request_ref* out, slimserve_page_plan* plan);
/* Room for new_tokens more tokens (copy-on-write of a shared last page first). */
SLIMSERVE_C_API slimserve_status slimserve_request_sets_append(slimserve_request_sets* sets,
                                                               slimserve_request_ref request,
                                                               int32_t new_tokens,
                                                               slimserve_page_plan* plan);
/* Once the step's copy-on-write copies are enqueued. */
SLIMSERVE_C_API void slimserve_request_sets_release_copy_sources(slimserve_request_sets* sets);
SLIMSERVE_C_API slimserve_status slimserve_request_sets_fork(slimserve_request_sets* sets,
                                                             slimserve_request_ref parent,
                                                             slimserve_request_ref* child);
SLIMSERVE_C_API slimserve_status slimserve_request_sets_preempt(slimserve_request_sets* sets,
                                                                slimserve_request_ref request);
SLIMSERVE_C_API slimserve_status slimserve_request_sets_resume(
    slimserve_request_sets* sets, slimserve_request_ref preempted, const int32_t* tokens,
    size_t num_tokens, uint64_t salt, uint64_t adapter_id, slimserve_request_ref* out,
    slimserve_page_plan* plan);
/* Indexes the full pages of `tokens` (num_tokens may be 0), then releases every page. */
SLIMSERVE_C_API slimserve_status slimserve_request_sets_finish(
    slimserve_request_sets* sets, slimserve_request_ref request, const int32_t* tokens,
    size_t num_tokens, uint64_t salt, uint64_t adapter_id);
SLIMSERVE_C_API int32_t slimserve_request_sets_is_active(const slimserve_request_sets* sets,
                                                         slimserve_request_ref request);
/* The request's pages in order: writes min(count, capacity) and the count to *count. */
SLIMSERVE_C_API slimserve_status slimserve_request_sets_pages(const slimserve_request_sets* sets,
                                                              slimserve_request_ref request,
                                                              slimserve_page* out,
                                                              size_t capacity, size_t* count);
SLIMSERVE_C_API int64_t slimserve_request_sets_tokens(const slimserve_request_sets* sets,
                                                      slimserve_request_ref request);
/* A request for `count` pages filled elsewhere (a transfer engine moved another engine's KV
 * into them; ABI 3): takes over the caller's reference to each page (sequence order, each
 * live, held by the caller alone, not cached, read-only) for num_tokens tokens, under a new
 * identity that may write them. All or nothing: a wrong count, a stale, shared, cached or
 * writable page, a page listed twice or no free slot is refused and the caller keeps its pages.
 * The device fills of the pages are the engine's to record (slimserve_device_tags_fills). */
SLIMSERVE_C_API slimserve_status slimserve_request_sets_adopt(slimserve_request_sets* sets,
                                                              const slimserve_page* pages,
                                                              size_t count, int64_t num_tokens,
                                                              slimserve_request_ref* out);

/* ---- Page tables and the GPU tag check --------------------------------------------------- */

/* A batch's page table (CSR form). The pointers are device memory when it comes from
 * slimserve_page_table_build's `device` output, host memory for its `host` output. */
typedef struct slimserve_page_table_view {
  const int32_t* indptr;         /* [batch_size + 1] */
  const int32_t* indices;        /* [indptr[batch_size]] page ids */
  const int32_t* last_page_len;  /* [batch_size]; 0 for a request with no pages */
  const uint32_t* expected_tags; /* [indptr[batch_size]] */
  int32_t batch_size;
  int32_t page_size;
} slimserve_page_table_view;

/* One request's pages in sequence order and the tokens stored in them. */
typedef struct slimserve_request_pages {
  const slimserve_page* pages;
  size_t num_pages;
  int64_t num_tokens;
} slimserve_request_pages;

/* Pinned host staging plus device arrays for tables of up to max_batch requests and
 * max_entries pages. */
typedef struct slimserve_page_table slimserve_page_table;
SLIMSERVE_C_API slimserve_status slimserve_page_table_create(int32_t max_batch,
                                                             int64_t max_entries,
                                                             int32_t page_size, int32_t num_pages,
                                                             slimserve_page_table** out);
SLIMSERVE_C_API void slimserve_page_table_destroy(slimserve_page_table* table);
/* Builds and validates the table on the host, then copies it to the device on `stream`.
 * `host` (optional) receives the host view (what decode planning reads), `device` the view
 * kernels take. Both stay valid until the next build with this table. */
SLIMSERVE_C_API slimserve_status slimserve_page_table_build(
    slimserve_page_table* table, const slimserve_request_pages* requests, int32_t batch_size,
    slimserve_stream stream, slimserve_page_table_view* host, slimserve_page_table_view* device);

/* The device copy of every page's current tag, kept in step with a pool. */
typedef struct slimserve_device_tags slimserve_device_tags;
SLIMSERVE_C_API slimserve_status slimserve_device_tags_create(int32_t num_pages,
                                                              slimserve_device_tags** out);
SLIMSERVE_C_API void slimserve_device_tags_destroy(slimserve_device_tags* tags);
/* Uploads the tags that changed since the last sync (call once per step, before the check). */
SLIMSERVE_C_API slimserve_status slimserve_device_tags_sync(slimserve_device_tags* tags,
                                                            slimserve_page_pool* pool,
                                                            slimserve_stream stream);

typedef int32_t slimserve_request_state;
enum {
  SLIMSERVE_REQUEST_OK = 0,
  SLIMSERVE_REQUEST_STALE_TAG = 1,
  SLIMSERVE_REQUEST_PAGE_OUT_OF_RANGE = 2,
  SLIMSERVE_REQUEST_BAD_PAGE_TABLE = 3,
  SLIMSERVE_REQUEST_GUARD_PAGE = 4,   /* the guard page (page 0) inside a request's pages */
  SLIMSERVE_REQUEST_WRITE_DENIED = 5, /* a page this step writes is not the request's own */
  SLIMSERVE_REQUEST_READ_DENIED = 6,  /* a page another request holds write rights to */
  SLIMSERVE_REQUEST_UNWRITTEN_SLOTS = 7, /* a length past the slots the device recorded written */
  SLIMSERVE_REQUEST_APPEND_NOT_NEXT = 8, /* an append not at the page's next unwritten slot */
  SLIMSERVE_REQUEST_RECORD_MISMATCH = 9, /* swap-in / import: another request's, stale or corrupted record */
  SLIMSERVE_REQUEST_TAGS_NOT_SYNCED = 10 /* a table built after changes the device tags lack */
};
/* The tag check's verdict per request (8 bytes; arrays of it live in device memory). */
typedef struct slimserve_request_status {
  slimserve_request_state state;
  int32_t failed_slot; /* index into the request's pages that failed; -1 when ok */
} slimserve_request_status;

/* Compares every page-table entry with the device tags; writes one status per request
 * (device array `statuses`, [batch_size]) and, when not NULL, the number of failing requests
 * to the device int `aborted_count`. Asynchronous, capturable. */
SLIMSERVE_C_API slimserve_status slimserve_check_page_tags(
    const slimserve_page_table_view* device_table, const slimserve_device_tags* tags,
    slimserve_request_status* statuses, int32_t* aborted_count, slimserve_stream stream);

/* The same check with write ownership: `writers` (device, [batch_size], the requests'
 * identities) and, for a step that appends, the append kernel's `append_indptr` (device,
 * [batch_size + 1]): pages the step writes must be the request's own (write_denied), every
 * other page read-only or the request's own (read_denied). Either may be NULL. */
SLIMSERVE_C_API slimserve_status slimserve_check_page_tags_owned(
    const slimserve_page_table_view* device_table, const slimserve_device_tags* tags,
    const uint32_t* writers, const int32_t* append_indptr, slimserve_request_status* statuses,
    int32_t* aborted_count, slimserve_stream stream);

/* The check with every option of the C++ one (ABI 3; set struct_size = sizeof the struct after
 * zeroing it: 0 is each field's default).
 *  - num_entries (device int, [1]) and entry_capacity (the indices buffer's length) bound
 *    every row: a row whose indptr range leaves [0, *num_entries) or [0, entry_capacity) is
 *    refused (bad_page_table), so it cannot reach entries an earlier, larger table left.
 *  - check_fill = 1: rows are compared with the device-held fills (unwritten_slots: a length
 *    past what was written; append_not_next: an append not at the next unwritten slot). Only
 *    for engines whose page-writing kernels all record fills (slimserve_device_tags_fills).
 *  - built_at_epoch / built_at_pool: the pool's age when the table was built
 *    (slimserve_page_pool_table_age); a table newer than the last sync, or of another pool, is
 *    refused on the host (SLIMSERVE_FAILED_PRECONDITION, nothing launched). epoch 0: not compared.
 *  - device_built_at (device, 16 bytes: uint64 epoch, uint32 pool, uint32 0): the same age as
 *    a device word the engine rewrites each step, compared on the device with the age the last
 *    sync uploaded, for replays of a captured graph (tags_not_synced for every request). */
typedef struct slimserve_tag_check_args {
  size_t struct_size;
  const slimserve_page_table_view* table; /* device arrays */
  const slimserve_device_tags* tags;
  const uint32_t* writers;                /* device [batch_size], or NULL */
  const int32_t* append_indptr;           /* device [batch_size + 1], or NULL */
  slimserve_request_status* statuses;     /* device [batch_size] */
  int32_t* aborted_count;                 /* device [1], or NULL */
  const int32_t* num_entries;             /* device [1], or NULL */
  int64_t entry_capacity;                 /* 0: not bounded by it */
  int32_t check_fill;                     /* 0 or 1 */
  uint32_t built_at_pool;
  uint64_t built_at_epoch;                /* 0: no host comparison */
  const void* device_built_at;            /* device [16 bytes], or NULL */
} slimserve_tag_check_args;
SLIMSERVE_C_API slimserve_status slimserve_check_page_tags_with(const slimserve_tag_check_args* args,
                                                                 slimserve_stream stream);
/* The pool's age now: what to record when building a step's tables. */
SLIMSERVE_C_API slimserve_status slimserve_page_pool_table_age(const slimserve_page_pool* pool,
                                                               uint64_t* epoch, uint32_t* pool_id);
/* The device-held fill of every page (device, [num_pages] uint64: written slots << 32 | the
 * tag of the generation that wrote them), written by the library's page-writing kernels. */
SLIMSERVE_C_API slimserve_status slimserve_device_tags_fills(const slimserve_device_tags* tags,
                                                             void** fills);

/* ---- KV cache, append and decode attention ------------------------------------------------ */

/* slimserve_kv_dtype's values come from the library's one list of KV formats
 * (SLIMSERVE_KV_FORMAT_LIST, slimserve/kv/kv_format.hpp) through tools/gen_kv_formats.py. */
typedef int32_t slimserve_kv_dtype;
enum { SLIMSERVE_KV_BF16 = 0, SLIMSERVE_KV_FP16 = 1, SLIMSERVE_KV_FP8_E4M3 = 2, SLIMSERVE_KV_FP8_E5M2 = 3, SLIMSERVE_KV_NVFP4 = 4 };
typedef int32_t slimserve_activation_dtype;
enum { SLIMSERVE_ACT_BF16 = 0, SLIMSERVE_ACT_FP16 = 1 };
typedef int32_t slimserve_kv_layout;
enum { SLIMSERVE_KV_NHD = 0, SLIMSERVE_KV_HND = 1 };
typedef int32_t slimserve_kv_scale_mode;
enum { SLIMSERVE_SCALE_NONE = 0, SLIMSERVE_SCALE_PER_TENSOR = 1, SLIMSERVE_SCALE_PER_TOKEN = 2 };
/* Head vectors stored rotated by the normalized Walsh-Hadamard transform (head_dim 64, 128,
 * 256): K (and V) rotated before quantization by slimserve_kv_append; queries (and, for
 * KEYS_AND_VALUES, the attention output) rotated by slimserve_paged_attention_run when its
 * args.rotation says so, or with slimserve_rotate_heads around another attention
 * (docs/attention.md, "Rotated keys (and values)"). */
typedef int32_t slimserve_kv_rotation;
enum { SLIMSERVE_KV_ROTATION_NONE = 0, SLIMSERVE_KV_ROTATION_KEYS = 1,
       SLIMSERVE_KV_ROTATION_KEYS_AND_VALUES = 2 };

/* A paged K/V cache (see docs/attention.md for layouts and the scale convention). */
typedef struct slimserve_kv_cache {
  void* k_pages;             /* device [num_pages, page_size, H, D] (NHD) or [num_pages, H, page_size, D] */
  void* v_pages;             /* device, same shape */
  const float* k_scale;      /* per_tensor: one device float */
  const float* v_scale;
  float* k_token_scales;     /* per_token: device [num_pages, page_size, H] (layout as the pages) */
  float* v_token_scales;
  int32_t num_pages;
  int32_t page_size;
  int32_t num_kv_heads;
  int32_t head_dim;
  slimserve_kv_dtype dtype;
  slimserve_kv_layout layout;
  slimserve_kv_scale_mode scale_mode;
} slimserve_kv_cache;

/* New K/V rows and where they go. Either the explicit form (token_request + token_position,
 * [num_tokens] device) or the chunk form (append_indptr, [batch_size + 1] device). */
typedef struct slimserve_append_args {
  const void* k_new;  /* device [num_tokens, num_kv_heads, head_dim], 16-byte aligned */
  const void* v_new;
  slimserve_activation_dtype input_dtype;
  int32_t num_tokens;
  const int32_t* token_request;
  const int32_t* token_position;
  const int32_t* append_indptr;
} slimserve_append_args;

/* Quantize-and-append; skips requests whose status is not ok (statuses may be NULL). */
SLIMSERVE_C_API slimserve_status slimserve_append_kv(const slimserve_kv_cache* cache,
                                                     const slimserve_page_table_view* device_table,
                                                     const slimserve_request_status* statuses,
                                                     const slimserve_append_args* args,
                                                     slimserve_stream stream);

typedef struct slimserve_decode_problem {
  int32_t batch_size;
  int32_t num_qo_heads;
  int32_t num_kv_heads;
  int32_t head_dim;
  int32_t page_size;
  int32_t query_tokens; /* 1 for decode; up to 8 for speculative tokens */
  slimserve_kv_dtype kv_dtype;
} slimserve_decode_problem;

typedef struct slimserve_decode_plan slimserve_decode_plan;

/* Workspace bytes the plan for these lengths needs (host indptr/last_page_len). */
SLIMSERVE_C_API slimserve_status slimserve_decode_workspace_size(
    const slimserve_decode_problem* problem, const int32_t* indptr_host,
    const int32_t* last_page_len_host, size_t* bytes);
/* Plans the split schedule and uploads it into `workspace` (device, 16-byte aligned). */
SLIMSERVE_C_API slimserve_status slimserve_decode_plan_create(
    const slimserve_decode_problem* problem, const int32_t* indptr_host,
    const int32_t* last_page_len_host, void* workspace, size_t workspace_bytes,
    slimserve_stream stream, slimserve_decode_plan** out);
SLIMSERVE_C_API void slimserve_decode_plan_destroy(slimserve_decode_plan* plan);

typedef struct slimserve_decode_args {
  const void* q;   /* device [batch_size * query_tokens, num_qo_heads, head_dim] */
  void* o;         /* device, same shape and dtype as q */
  float* lse;      /* device [batch_size * query_tokens, num_qo_heads], or NULL */
  slimserve_activation_dtype q_dtype;
  float sm_scale;  /* usually 1 / sqrt(head_dim) */
} slimserve_decode_args;

/* Launches decode attention (+ merge). Aborted requests read no page; their rows are NaN. */
SLIMSERVE_C_API slimserve_status slimserve_decode_run(
    const slimserve_decode_plan* plan, const slimserve_kv_cache* cache,
    const slimserve_page_table_view* device_table, const slimserve_request_status* statuses,
    const slimserve_decode_args* args, void* workspace, size_t workspace_bytes,
    slimserve_stream stream);

/* ---- Moving pages: copy, swap, export / import ------------------------------------------ */

/* Every page a move touches is checked on the device against the tags: reads need the
 * expected tag and a read-only page or the mover's own, writes the mover's write right. A move
 * that fails writes nothing and its status says why. Host preflight (slimserve_check_*) on a
 * host copy of a list refuses bad ids, token counts and duplicated destinations. */

/* Slots [0, tokens) of page src into page dst of the same cache (copy-on-write, defrag). */
typedef struct slimserve_page_copy {
  int32_t src;
  uint32_t src_tag;
  int32_t dst;
  uint32_t dst_tag;
  uint32_t writer; /* holds the write right on dst */
  int32_t tokens;  /* 1..page_size */
} slimserve_page_copy;
SLIMSERVE_C_API slimserve_status slimserve_check_page_copies(const slimserve_kv_cache* cache,
                                                             const slimserve_page_copy* host_copies,
                                                             int32_t num_copies);
/* copies and statuses: device arrays [num_copies]. */
SLIMSERVE_C_API slimserve_status slimserve_copy_pages(const slimserve_kv_cache* cache,
                                                      const slimserve_device_tags* tags,
                                                      const slimserve_page_copy* copies,
                                                      int32_t num_copies,
                                                      slimserve_request_status* statuses,
                                                      slimserve_stream stream);

/* One page between the cache and record `host_slot` of a pinned host buffer. */
typedef struct slimserve_page_swap {
  int32_t page;
  uint32_t tag;
  uint32_t writer; /* the mover: reads the page (out) or holds its write right (in) */
  int32_t host_slot;
} slimserve_page_swap;
typedef int32_t slimserve_swap_direction;
enum { SLIMSERVE_SWAP_OUT = 0, SLIMSERVE_SWAP_IN = 1 };
/* Bytes of one host slot: a 32-byte identity header (the swapping request, pool, sequence 0,
 * slot, filled slots, checksum) and the page record (K, V and per-token scales when the cache
 * has them). Swap-in verifies the header on the device before writing: only the identity that
 * swapped a record out can swap it back in (record_mismatch otherwise, nothing written). */
SLIMSERVE_C_API int64_t slimserve_page_record_bytes(const slimserve_kv_cache* cache);
SLIMSERVE_C_API slimserve_status slimserve_check_page_swaps(const slimserve_kv_cache* cache,
                                                            const slimserve_page_swap* host_swaps,
                                                            int32_t num_swaps,
                                                            slimserve_swap_direction direction,
                                                            int32_t host_slots);
/* host_records: pinned host memory [host_slots, slot bytes]; swaps/statuses device arrays. */
SLIMSERVE_C_API slimserve_status slimserve_swap_pages(
    const slimserve_kv_cache* cache, const slimserve_device_tags* tags, void* host_records,
    int32_t host_slots, const slimserve_page_swap* swaps, int32_t num_swaps,
    slimserve_swap_direction direction, slimserve_request_status* statuses,
    slimserve_stream stream);

/* One request's pages for export / import (device arrays). */
typedef struct slimserve_request_pages_view {
  const int32_t* pages;  /* device [num_pages] */
  const uint32_t* tags;  /* device [num_pages] */
  int32_t num_pages;
  int64_t num_tokens;
  uint32_t writer;       /* export: the reader; import: holds the write right on every page */
} slimserve_request_pages_view;
/* Bytes an export of num_pages pages needs (a 64-byte self-describing header + records). */
SLIMSERVE_C_API int64_t slimserve_export_buffer_bytes(const slimserve_kv_cache* cache,
                                                      int32_t num_pages);
/* Writes the header and the pages' records into `buffer` (device or pinned host). */
SLIMSERVE_C_API slimserve_status slimserve_export_request(
    const slimserve_kv_cache* cache, const slimserve_device_tags* tags,
    const slimserve_request_pages_view* request, void* buffer, int64_t buffer_bytes,
    slimserve_request_status* status, slimserve_stream stream);
/* Imports an exported buffer; `header` is a host copy of its first 64 bytes, checked against
 * the cache (dtype, layout, scales, page size, heads, head_dim) before any launch. Every
 * record carries an identity header; the device verifies each record's checksum, index and
 * length against the identity the header claims before any page is written. */
SLIMSERVE_C_API slimserve_status slimserve_import_request(
    const slimserve_kv_cache* cache, const slimserve_device_tags* tags,
    const slimserve_request_pages_view* request, const void* buffer, int64_t buffer_bytes,
    const void* header, size_t header_bytes, slimserve_request_status* status,
    slimserve_stream stream);

/* Identity on every record that leaves the cache (ABI 3). The entry points above name no
 * identity: swap records carry the mover's own, exports the exporter's, and import checks
 * each record only against the identity the buffer's header claims, so another request's
 * buffer of the same shape is not refused. The *_with forms below take the identities. */

/* Whose a record is (12 bytes, the C++ RecordIdentity; arrays of it live in device memory):
 * the pool it left (the pool id slimserve_page_pool_table_age reports), the request identity
 * that wrote it (the swap-out / export mover) and the engine's number for this record set
 * (e.g. the request's preemption count, so that a stale record of the same request differs). */
typedef struct slimserve_record_identity {
  uint32_t pool;
  uint32_t writer;
  uint32_t sequence;
} slimserve_record_identity;

/* slimserve_swap_pages with one identity per swap (set struct_size = sizeof the struct after
 * zeroing it). identities (device, [num_swaps]): swap-out writes identities[i] into swap i's
 * slot header; swap-in refuses (record_mismatch, the page keeps every byte) a slot whose
 * header says otherwise. NULL: {the synced pool, the swap's writer, 0}, as slimserve_swap_pages
 * (a request resumed under a new identity passes the one it swapped out with). */
typedef struct slimserve_swap_args {
  size_t struct_size;
  slimserve_kv_cache cache;
  const slimserve_device_tags* tags;
  void* host_records;                          /* pinned host [host_slots, slot bytes] */
  int32_t host_slots;
  int32_t num_swaps;
  const slimserve_page_swap* swaps;            /* device [num_swaps] */
  slimserve_swap_direction direction;
  slimserve_request_status* statuses;          /* device [num_swaps] */
  const slimserve_record_identity* identities; /* device [num_swaps], or NULL */
} slimserve_swap_args;
SLIMSERVE_C_API slimserve_status slimserve_swap_pages_with(const slimserve_swap_args* args,
                                                           slimserve_stream stream);

/* slimserve_export_request with the identity written into the buffer's header and every
 * record's; identity.writer 0: {the synced pool, request.writer, 0}, as slimserve_export_request.
 * The transfer's own metadata carries it to the importer. */
typedef struct slimserve_export_args {
  size_t struct_size;
  slimserve_kv_cache cache;
  const slimserve_device_tags* tags;
  slimserve_request_pages_view request;
  void* buffer;                       /* device or pinned host, 16-byte aligned */
  int64_t buffer_bytes;
  slimserve_request_status* status;   /* device [1] */
  slimserve_record_identity identity;
} slimserve_export_args;
SLIMSERVE_C_API slimserve_status slimserve_export_request_with(const slimserve_export_args* args,
                                                               slimserve_stream stream);

/* slimserve_import_request against the identity the importer expects (the exporter's, from
 * the transfer's metadata, not from the buffer): every record must carry it, its page index,
 * its token count and a matching checksum, else the request is refused (record_mismatch) and
 * no page is written. expected.writer 0 is refused (SLIMSERVE_INVALID_ARGUMENT). */
typedef struct slimserve_import_args {
  size_t struct_size;
  slimserve_kv_cache cache;
  const slimserve_device_tags* tags;
  slimserve_request_pages_view request;
  const void* buffer;                 /* as exported (device or pinned host) */
  int64_t buffer_bytes;
  const void* header;                 /* host copy of the buffer's first 64 bytes */
  size_t header_bytes;
  slimserve_request_status* status;   /* device [1] */
  slimserve_record_identity expected;
} slimserve_import_args;
SLIMSERVE_C_API slimserve_status slimserve_import_request_with(const slimserve_import_args* args,
                                                               slimserve_stream stream);

/* The exporter's identity a buffer's header claims (`header`: a host copy of its first 64
 * bytes), for messages and for the transfer's metadata on the sending side. An importer
 * should expect what its own metadata says, not this claim. */
SLIMSERVE_C_API slimserve_status slimserve_read_buffer_identity(const void* header,
                                                                size_t header_bytes,
                                                                slimserve_record_identity* out);

/* ---- INT4 weights ------------------------------------------------------------------------ */

typedef int32_t slimserve_weight_dtype;
enum { SLIMSERVE_WEIGHT_F32 = 0, SLIMSERVE_WEIGHT_F16 = 1, SLIMSERVE_WEIGHT_BF16 = 2 };
typedef int32_t slimserve_weight_layout;
enum { SLIMSERVE_WEIGHT_K_BY_N = 0, SLIMSERVE_WEIGHT_N_BY_K = 1 };

/* INT4 weights quantized on the host and packed for the W4A16 GEMM (host copies). */
typedef struct slimserve_int4_weights slimserve_int4_weights;

typedef struct slimserve_quantize_options {
  int64_t group_size;   /* rows along K per group (multiple of 32 dividing k), or k */
  int32_t symmetric;    /* 1: zero point 8, no zeros stored; 0: asymmetric */
  slimserve_activation_dtype activation; /* type of the GEMM's A/C (scales are stored in it) */
} slimserve_quantize_options;

/* Quantizes a host weight of k x n (layout says which is outer) to INT4 and packs it. */
SLIMSERVE_C_API slimserve_status slimserve_int4_quantize(const void* weight,
                                                         slimserve_weight_dtype dtype,
                                                         slimserve_weight_layout layout,
                                                         int64_t k, int64_t n,
                                                         const slimserve_quantize_options* options,
                                                         slimserve_int4_weights** out);
SLIMSERVE_C_API void slimserve_int4_weights_destroy(slimserve_int4_weights* weights);

/* Host arrays of packed weights, ready to upload as they are. zeros is NULL when symmetric. */
typedef struct slimserve_int4_weights_info {
  int64_t k, n, group_size;
  const uint32_t* packed; size_t packed_bytes; /* [k/16, n/16, 32] */
  const uint16_t* scales; size_t scales_bytes; /* [k/group_size, n] activation dtype */
  const uint16_t* zeros;  size_t zeros_bytes;  /* [k/group_size, n] activation dtype, or NULL */
} slimserve_int4_weights_info;
SLIMSERVE_C_API slimserve_status slimserve_int4_weights_get_info(
    const slimserve_int4_weights* weights, slimserve_int4_weights_info* info);
/* Element (row, col) of the dequantized weight [k, n] as the GEMM computes it (float). */
SLIMSERVE_C_API slimserve_status slimserve_int4_weights_dequantize(
    const slimserve_int4_weights* weights, float* out_k_by_n, size_t count);

/* C[m, n] = A[m, k] . dequant(W)[k, n] (+ bias); every pointer device, 16-byte aligned. */
typedef struct slimserve_gemm_args {
  slimserve_activation_dtype activation;
  int64_t m, n, k, group_size;
  const void* a;         /* [m, k] */
  const uint32_t* b;     /* packed [k/16, n/16, 32] */
  const void* scales;    /* [k/group_size, n] */
  const void* zeros;     /* or NULL (symmetric: z = 8) */
  const void* bias;      /* [n] or NULL */
  void* c;               /* [m, n] */
} slimserve_gemm_args;

typedef struct slimserve_gemm_plan slimserve_gemm_plan;
SLIMSERVE_C_API slimserve_status slimserve_gemm_plan_create(const slimserve_gemm_args* args,
                                                            slimserve_gemm_plan** out);
SLIMSERVE_C_API void slimserve_gemm_plan_destroy(slimserve_gemm_plan* plan);
SLIMSERVE_C_API size_t slimserve_gemm_plan_workspace_bytes(const slimserve_gemm_plan* plan);
SLIMSERVE_C_API slimserve_status slimserve_gemm_run(const slimserve_gemm_plan* plan,
                                                    const slimserve_gemm_args* args,
                                                    void* workspace, size_t workspace_bytes,
                                                    slimserve_stream stream);

/* ==== Added in ABI 2 (symbol version SLIMSERVE_C_2) ====================================== */

/* ---- Block tables (the 2-D form of a batch's page table) ------------------------------- */

/* Request b's pages are block_table[b * max_pages_per_request + i] for
 * i < ceil(seq_lens[b] / page_size); entries past them are never read (any value). Device
 * arrays for the kernels, host arrays for slimserve_validate_block_table. */
typedef struct slimserve_block_table_view {
  const int32_t* block_table;    /* [batch_size, max_pages_per_request] page ids, row-major */
  const uint32_t* expected_tags; /* [batch_size, max_pages_per_request]; read by the tag check */
  const int32_t* seq_lens;       /* [batch_size] tokens per request */
  int32_t batch_size;
  int32_t max_pages_per_request;
  int32_t page_size;
} slimserve_block_table_view;

/* Host preflight of a host copy (block_table, expected_tags and seq_lens host arrays): every
 * page a request's length uses is a real page of the cache (not the guard page 0, not outside
 * 0 .. num_pages - 1) with a tag some owner held (not 0), every length fits its row; the
 * message names the request and entry. */
SLIMSERVE_C_API slimserve_status slimserve_validate_block_table(
    const slimserve_block_table_view* host_table, int32_t num_pages);

/* The tag check of slimserve_check_page_tags_owned over a block table (device arrays):
 * covers exactly the entries each request's length uses. writers, append_indptr and
 * aborted_count may be NULL. Asynchronous, capturable. */
SLIMSERVE_C_API slimserve_status slimserve_check_block_tags(
    const slimserve_block_table_view* device_table, const slimserve_device_tags* tags,
    const uint32_t* writers, const int32_t* append_indptr, slimserve_request_status* statuses,
    int32_t* aborted_count, slimserve_stream stream);

/* ---- Paged attention: prefill, chunked prefill, append, decode, speculative verify ------- */

/* One tensor-core kernel family (docs/attention.md). Request b owns query tokens
 * [qo_indptr[b], qo_indptr[b + 1]): its last qo_len positions, already counted by the page
 * table (after append, or filled by the fused prefill below); they attend causally to the
 * cached prefix and to themselves. Decode is qo_len 1. Plan on the host, run on a stream:
 *   1. slimserve_paged_attention_workspace_size (this step) or _workspace_bound (every step
 *      up to maximum sizes: one allocation for CUDA graphs);
 *   2. slimserve_paged_attention_plan_create: validates the host lengths, schedules, uploads
 *      (not capturable);
 *   3. slimserve_paged_attention_run: launches only (capturable); reads qo_indptr, page ids,
 *      lengths, scales and verdicts from device memory. Aborted requests read no page; their
 *      output rows are NaN and lse -inf. */

typedef int32_t slimserve_attention_mask;
enum { SLIMSERVE_MASK_CAUSAL = 0, SLIMSERVE_MASK_NONE = 1 };

/* Shapes and types shared by plan and run (run refuses a plan made for another problem). */
typedef struct slimserve_paged_attention_problem {
  int32_t batch_size;
  int32_t num_qo_heads;
  int32_t num_kv_heads;  /* divides num_qo_heads (GQA / MQA) */
  int32_t head_dim;      /* 64, 96, 128, 192, 256 */
  int32_t page_size;     /* 16, 32, 64, 128 */
  slimserve_kv_dtype kv_dtype;
  slimserve_activation_dtype q_dtype; /* q and o */
  slimserve_attention_mask mask;      /* 0: causal */
} slimserve_paged_attention_problem;

typedef struct slimserve_paged_attention_plan_args {
  size_t struct_size;
  slimserve_paged_attention_problem problem;
  const int32_t* qo_indptr_host;     /* [batch_size + 1], from 0, non-decreasing */
  /* Host copies of the lengths in the form the run's page table has, exactly one:
   * CSR (kv_indptr_host + last_page_len_host) or block table (seq_lens_host). */
  const int32_t* kv_indptr_host;     /* [batch_size + 1] the CSR table's indptr */
  const int32_t* last_page_len_host; /* [batch_size] */
  const int32_t* seq_lens_host;      /* [batch_size] */
  int32_t num_sms;          /* SMs to fill; 0: ask the current device */
  int32_t ctas_per_sm;      /* 0: 2 */
  int32_t min_chunk_tokens; /* no split-KV chunk shorter than this; 0: 512 */
  int32_t disable_split;    /* 1: never split a request's KV across CTAs */
  /* 1: the sm_90a warpgroup-MMA (wgmma) prefill kernel for schedules it serves (the plan
   * info's reason says whether it was taken); 0: the mma.sync kernel. Off by default until
   * measured on a GPU. */
  int32_t warpgroup_mma;
} slimserve_paged_attention_plan_args;

/* Workspace of every plan up to these sizes. */
typedef struct slimserve_paged_attention_bound {
  size_t struct_size;
  slimserve_paged_attention_problem problem; /* batch_size: the largest batch */
  int64_t max_total_qo_tokens; /* query tokens of a step, all requests together */
  int64_t max_kv_tokens;       /* tokens of the longest request */
  int32_t num_sms;             /* 0: the current device */
  int32_t ctas_per_sm;         /* 0: 2 */
} slimserve_paged_attention_bound;

typedef struct slimserve_paged_attention_plan slimserve_paged_attention_plan;

SLIMSERVE_C_API slimserve_status slimserve_paged_attention_workspace_size(
    const slimserve_paged_attention_plan_args* args, size_t* bytes);
SLIMSERVE_C_API slimserve_status slimserve_paged_attention_workspace_bound(
    const slimserve_paged_attention_bound* bound, size_t* bytes);
/* `workspace`: device, 16-byte aligned, at least the size query's bytes (else
 * SLIMSERVE_RESOURCE_EXHAUSTED). The plan keeps no pointer to the host arrays. */
SLIMSERVE_C_API slimserve_status slimserve_paged_attention_plan_create(
    const slimserve_paged_attention_plan_args* args, void* workspace, size_t workspace_bytes,
    slimserve_stream stream, slimserve_paged_attention_plan** out);
SLIMSERVE_C_API void slimserve_paged_attention_plan_destroy(slimserve_paged_attention_plan* plan);

typedef int32_t slimserve_attention_kernel;
enum { SLIMSERVE_KERNEL_TENSOR_CORE = 0, SLIMSERVE_KERNEL_CUDA_CORE = 1 };
/* What a plan chose and why (for logs); `reason` lives as long as the plan. */
typedef struct slimserve_paged_attention_plan_info {
  size_t struct_size;
  slimserve_attention_kernel kernel; /* the plan's choice; a run asking for what only the
                                        tensor-core kernel has (window, soft-cap, sinks,
                                        strides, fused chunk, block table, page_stride)
                                        runs that one */
  int32_t split_kv;
  int32_t chunk_tokens;   /* KV tokens per split chunk (split_kv) */
  int32_t num_work_items; /* CTAs of the attention grid */
  size_t workspace_bytes;
  const char* reason;
} slimserve_paged_attention_plan_info;
SLIMSERVE_C_API slimserve_status slimserve_paged_attention_plan_get_info(
    const slimserve_paged_attention_plan* plan, slimserve_paged_attention_plan_info* info);

typedef struct slimserve_paged_attention_args {
  size_t struct_size;
  slimserve_kv_cache cache;
  /* Storage elements (bytes for NVFP4) from one page to the next in cache.k_pages and
   * cache.v_pages; 0: packed (page_size * num_kv_heads * head_dim elements; NVFP4:
   * page_size * num_kv_heads * 9 * head_dim / 16 bytes). K and V in one allocation
   * [num_pages, 2, page]: v_pages = k_pages + one packed page, kv_page_stride = twice that. */
  int64_t kv_page_stride;
  /* The page table, exactly one of the two (device arrays; tags are not read here). */
  const slimserve_page_table_view* table;
  const slimserve_block_table_view* block_table;
  const slimserve_request_status* statuses; /* [batch_size] device, or NULL */
  const int32_t* qo_indptr;                 /* [batch_size + 1] device */
  const void* q; /* q[token * q_token_stride + head * q_head_stride + d], 16-byte aligned */
  void* o;       /* o[token * o_token_stride + head * o_head_stride + d], q's dtype */
  float* lse;    /* [query tokens, num_qo_heads] natural log (sinks included), or NULL */
  /* Strides in elements, multiples of 8; 0: packed [tokens, heads, head_dim]. Strided q
   * reads a fused QKV projection's output in place. */
  int64_t q_token_stride, q_head_stride;
  int64_t o_token_stride, o_head_stride;
  float sm_scale;         /* 0: 1 / sqrt(head_dim) */
  int32_t sliding_window; /* 0: none; w > 0: a query sees its last w positions, itself included */
  float logit_soft_cap;   /* 0: none; c > 0: s = c * tanh(s / c) */
  const float* sinks;     /* [num_qo_heads] device natural-log sink logits, or NULL */
  /* Fused (mixed-dtype) prefill when chunk_k is set: the chunk's own K/V in q's dtype
   * (chunk_k[token * chunk_token_stride + kv_head * chunk_head_stride + d], token as in q;
   * strides multiples of 8, 0: packed [tokens, num_kv_heads, head_dim]). The run writes them
   * into the chunk's slots (the bytes slimserve_append_kv writes with append_indptr =
   * qo_indptr) and the queries attend to them as given; do not append the chunk first.
   * Packed pages only (kv_page_stride 0). */
  const void* chunk_k;
  const void* chunk_v;
  int64_t chunk_token_stride, chunk_head_stride;
  /* The rotation the cache was appended with (slimserve_kv_append_args.rotation): the kernel
   * rotates the queries (and, for KEYS_AND_VALUES, the output back) itself, so q and o are the
   * unrotated ones. head_dim 64, 128 or 256, no chunk_k; else SLIMSERVE_UNSUPPORTED with
   * nothing written. A struct_size that ends before it means SLIMSERVE_KV_ROTATION_NONE. */
  slimserve_kv_rotation rotation;
  int32_t reserved; /* 0 */
} slimserve_paged_attention_args;

/* Preflight against the plan (shapes, pointers, strides, options, workspace), then launch.
 * The C ABI also refuses an o whose strides make two output rows overlap. */
SLIMSERVE_C_API slimserve_status slimserve_paged_attention_run(
    const slimserve_paged_attention_plan* plan, const slimserve_paged_attention_args* args,
    void* workspace, size_t workspace_bytes, slimserve_stream stream);

/* Merge of partial attention states (cascades: a shared prefix's partial and each request's
 * own, or split-KV partials): request b's row r is the softmax-weighted merge of partials
 * p in [split_indptr[b], split_indptr[b + 1]): o = sum_p exp(lse_p - L) o_p with
 * L = log sum_p exp(lse_p). A partial with lse -inf (empty) weighs nothing; a NaN lse (an
 * aborted request's partial) makes the row NaN with lse -inf. */
typedef struct slimserve_merge_args {
  size_t struct_size;
  const float* partial_o;       /* device [P, rows_per_request, head_dim] */
  const float* partial_lse;     /* device [P, rows_per_request] natural log */
  const int32_t* split_indptr;  /* device [batch_size + 1] */
  int32_t batch_size;
  int32_t rows_per_request;     /* e.g. query tokens x heads of one request */
  int32_t head_dim;
  slimserve_activation_dtype out_dtype;
  void* o;                      /* device [batch_size, rows_per_request, head_dim] */
  float* lse;                   /* device [batch_size, rows_per_request], or NULL */
} slimserve_merge_args;
SLIMSERVE_C_API slimserve_status slimserve_merge_attention_states(const slimserve_merge_args* args,
                                                                  slimserve_stream stream);

/* Listed pages of a (packed) cache dequantized to BF16, real = stored * scale: k_out, v_out
 * device [num_listed, page_size, num_kv_heads, head_dim] (NHD whatever the cache layout). A
 * listed id outside the cache gives a NaN page instead of a read. */
SLIMSERVE_C_API slimserve_status slimserve_dequantize_pages(const slimserve_kv_cache* cache,
                                                            const int32_t* page_ids,
                                                            int32_t num_listed, void* k_out,
                                                            void* v_out, slimserve_stream stream);

/* ---- Append with a page stride or vLLM's slot mapping; runtime counters ---------------- */

/* slimserve_append_kv with what its ABI 1 arguments cannot say: a page stride (one combined
 * K/V allocation [num_pages, 2, page]: v_pages = k_pages + packed page elements,
 * kv_page_stride = twice that) and a third form of destinations, slot_mapping (vLLM's
 * reshape_and_cache: token t goes to page slot_mapping[t] / page_size, slot
 * slot_mapping[t] % page_size; a negative slot or a page past num_pages writes nothing; no
 * page table, no verdicts). Exactly one form: slot_mapping, token_request + token_position, or
 * append_indptr. Launches only (capturable): every array is device memory read on the stream. */
typedef struct slimserve_kv_append_args {
  size_t struct_size;
  slimserve_kv_cache cache;
  int64_t kv_page_stride;                   /* storage elements (NVFP4: bytes) between pages; 0: packed */
  const slimserve_page_table_view* table;   /* device; NULL with slot_mapping */
  const slimserve_request_status* statuses; /* [batch_size] device, or NULL */
  const void* k_new; /* device rows [num_tokens][num_kv_heads, head_dim] (k_row_stride), 16-byte aligned */
  const void* v_new;
  slimserve_activation_dtype input_dtype;
  int32_t num_tokens;
  const int32_t* token_request;  /* [num_tokens] device, explicit form */
  const int32_t* token_position; /* [num_tokens] device, explicit form */
  const int32_t* append_indptr;  /* [batch_size + 1] device, chunk form */
  const int64_t* slot_mapping;   /* [num_tokens] device, slot form */
  /* Elements from one token's row to the next in k_new / v_new, heads contiguous inside a
   * row; 0: packed (num_kv_heads * head_dim). A multiple of 8 of at least one row: the K and
   * V slices of a fused QKV projection's output (vLLM's key / value views) are read in place.
   * A struct_size that ends before these fields means 0 (packed). */
  int64_t k_row_stride;
  int64_t v_row_stride;
  /* K (KEYS) or K and V (KEYS_AND_VALUES) rotated in registers before quantization, every
   * format; head_dim 64, 128 or 256, else SLIMSERVE_UNSUPPORTED with nothing written. A
   * struct_size that ends before it means SLIMSERVE_KV_ROTATION_NONE. */
  slimserve_kv_rotation rotation;
  int32_t reserved; /* 0 */
} slimserve_kv_append_args;
SLIMSERVE_C_API slimserve_status slimserve_kv_append(const slimserve_kv_append_args* args,
                                                     slimserve_stream stream);

/* Rotates head vectors [num_tokens, num_heads, head_dim] (bf16 or fp16, heads contiguous in a
 * token's row, rows *_row_stride elements apart; 0: packed) by the normalized Walsh-Hadamard
 * transform H / sqrt(head_dim), its own inverse: queries before attending to a rotated cache,
 * and the attention output after it when V is rotated. output == input rotates in place (equal
 * strides); otherwise the two must not overlap. head_dim 64, 128 or 256; 16-byte aligned rows.
 * Launches only (capturable): no allocation, no synchronization. */
typedef struct slimserve_rotate_heads_args {
  size_t struct_size;
  const void* input;
  void* output;
  slimserve_activation_dtype dtype;
  int32_t num_tokens;
  int32_t num_heads;
  int32_t head_dim;
  int64_t input_row_stride;
  int64_t output_row_stride;
} slimserve_rotate_heads_args;
SLIMSERVE_C_API slimserve_status slimserve_rotate_heads(const slimserve_rotate_heads_args* args,
                                                        slimserve_stream stream);

/* Calls the library made into the runtime since the process started: stream
 * synchronizations, device and pinned allocations, frees and copies (relaxed counts, both
 * builds). A test reads them around a run to prove it neither synchronized nor allocated. */
typedef struct slimserve_runtime_counters {
  size_t struct_size;
  int64_t synchronizations;
  int64_t allocations;
  int64_t frees;
  int64_t copies;
} slimserve_runtime_counters;
SLIMSERVE_C_API slimserve_status slimserve_get_runtime_counters(slimserve_runtime_counters* out);

/* ---- Write ownership of a pool's pages, for engines that keep their own page lists ------- */

/* An engine that allocates pages itself (vLLM's block pool) and mirrors each page's owner in a
 * slimserve pool (the device tags the check reads) names each of its requests by a new writer
 * identity (never reused within 2^32 - 1 identities, never 0) and grants it the right to write
 * the pages it alone holds. grant_write needs a sole holder of a page the prefix cache does not
 * index (else SLIMSERVE_FAILED_PRECONDITION, nothing changed); revoke_write makes the page
 * read-only. slimserve_device_tags_sync carries the change to the device. */
SLIMSERVE_C_API slimserve_status slimserve_page_pool_new_writer(slimserve_page_pool* pool,
                                                                uint32_t* out);
SLIMSERVE_C_API slimserve_status slimserve_page_pool_grant_write(slimserve_page_pool* pool,
                                                                 slimserve_page page,
                                                                 uint32_t writer);
SLIMSERVE_C_API slimserve_status slimserve_page_pool_revoke_write(slimserve_page_pool* pool,
                                                                  slimserve_page page);

/* ---- MLA: multi-head latent attention (DeepSeek-V3 / Kimi K2) --------------------------- */

/* A paged latent cache: one record per token, [num_pages, page_size, record bytes]
 * (docs/mla.md): BF16 [512 latent][64 rope] 1152 B; FP8 e4m3 per_token_group
 * [512 e4m3][4 f32 scales][64 bf16 rope] 656 B; FP8 e4m3 per_tensor [512][64 bf16] 640 B;
 * NVFP4 per_tensor [256 B e2m1 codes][32 e4m3 block scales][64 bf16 rope] 416 B (latent_scale:
 * the tensor scale). */
typedef int32_t slimserve_mla_scale_mode;
enum { SLIMSERVE_MLA_SCALE_NONE = 0, SLIMSERVE_MLA_SCALE_PER_TENSOR = 1,
       SLIMSERVE_MLA_SCALE_PER_TOKEN_GROUP = 2 };
typedef struct slimserve_mla_cache {
  void* pages;               /* device [num_pages, page_size, record bytes], 16-byte aligned */
  const float* latent_scale; /* per_tensor: one device float; else NULL */
  int32_t num_pages;
  int32_t page_size;
  slimserve_kv_dtype dtype;  /* SLIMSERVE_KV_BF16, SLIMSERVE_KV_FP8_E4M3 or SLIMSERVE_KV_NVFP4 */
  slimserve_mla_scale_mode scale_mode;
} slimserve_mla_cache;

/* Bytes of one token record (0 for a combination the cache does not support). */
SLIMSERVE_C_API int64_t slimserve_mla_record_bytes(slimserve_kv_dtype dtype,
                                                   slimserve_mla_scale_mode scale_mode);

/* Quantize-and-append of new tokens' latent [num_tokens, 512] and rope [num_tokens, 64]
 * (activation dtype) into their slots: the explicit form (token_request + token_position) or
 * the chunk form (append_indptr), as slimserve_append_kv. Tokens of aborted requests, or
 * outside their request's pages, write nothing. CSR page table (device). */
typedef struct slimserve_mla_append_args {
  size_t struct_size;
  slimserve_mla_cache cache;
  const slimserve_page_table_view* table;
  const slimserve_request_status* statuses; /* or NULL */
  const void* latent_new;  /* latent_new[t * latent_stride + d], 16-byte aligned */
  const void* rope_new;    /* rope_new[t * rope_stride + d], 16-byte aligned */
  int64_t latent_stride;   /* elements, multiple of 8; 0: 512 */
  int64_t rope_stride;     /* elements, multiple of 8; 0: 64 */
  slimserve_activation_dtype input_dtype;
  int32_t num_tokens;
  const int32_t* token_request;  /* [num_tokens] device, explicit form */
  const int32_t* token_position; /* [num_tokens] device, explicit form */
  const int32_t* append_indptr;  /* [batch_size + 1] device, chunk form */
} slimserve_mla_append_args;
SLIMSERVE_C_API slimserve_status slimserve_mla_append(const slimserve_mla_append_args* args,
                                                      slimserve_stream stream);

/* Absorbed decode: q [query rows, num_heads, 576] (q_nope . W_UK | q_rope), o [query rows,
 * num_heads, 512] in latent space. Request b owns rows [b * query_tokens, (b + 1) *
 * query_tokens), its last positions; with ragged_queries, rows [qo_indptr[b],
 * qo_indptr[b + 1]) (absorbed prefill of chunks up to 128 tokens). */
typedef struct slimserve_mla_problem {
  int32_t batch_size;
  int32_t num_heads;    /* 8, 16, 32, 64, 128 */
  int32_t query_tokens; /* 1 .. 8; ragged: the largest count per request (<= 128) */
  int32_t page_size;
  slimserve_kv_dtype kv_dtype;
  slimserve_mla_scale_mode scale_mode;
  slimserve_activation_dtype q_dtype; /* q and o (BF16) */
  int32_t ragged_queries;             /* 1: query rows per request from qo_indptr_host */
} slimserve_mla_problem;

typedef struct slimserve_mla_plan_args {
  size_t struct_size;
  slimserve_mla_problem problem;
  /* Host lengths, exactly one form: CSR (kv_indptr_host + last_page_len_host) or block
   * table (seq_lens_host). */
  const int32_t* kv_indptr_host;
  const int32_t* last_page_len_host;
  const int32_t* seq_lens_host;
  const int32_t* qo_indptr_host; /* ragged_queries only: [batch_size + 1] */
  int32_t num_sms;          /* 0: the current device */
  int32_t ctas_per_sm;      /* 0: the kernel's residency (2 for 16-row FP8 / NVFP4, else 1) */
  int32_t min_chunk_tokens; /* 0: 256 */
  int32_t disable_split;
  int32_t warpgroup_mma;    /* 1: the sm_90a wgmma kernel for requests of >= 64 rows (docs/mla.md) */
} slimserve_mla_plan_args;

typedef struct slimserve_mla_bound {
  size_t struct_size;
  slimserve_mla_problem problem; /* batch_size: the largest batch */
  int32_t num_sms;               /* 0: the current device */
  int32_t ctas_per_sm;           /* 0: the kernel's residency, as the plan */
  int32_t warpgroup_mma;         /* as slimserve_mla_plan_args (the plans this bound serves) */
} slimserve_mla_bound;

typedef struct slimserve_mla_plan slimserve_mla_plan;
SLIMSERVE_C_API slimserve_status slimserve_mla_workspace_size(const slimserve_mla_plan_args* args,
                                                              size_t* bytes);
SLIMSERVE_C_API slimserve_status slimserve_mla_workspace_bound(const slimserve_mla_bound* bound,
                                                               size_t* bytes);
SLIMSERVE_C_API slimserve_status slimserve_mla_plan_create(const slimserve_mla_plan_args* args,
                                                           void* workspace,
                                                           size_t workspace_bytes,
                                                           slimserve_stream stream,
                                                           slimserve_mla_plan** out);
SLIMSERVE_C_API void slimserve_mla_plan_destroy(slimserve_mla_plan* plan);

typedef struct slimserve_mla_decode_args {
  size_t struct_size;
  slimserve_mla_cache cache;
  const slimserve_page_table_view* table;        /* exactly one of the two (device) */
  const slimserve_block_table_view* block_table;
  const slimserve_request_status* statuses;      /* or NULL */
  const void* q; /* q[row * q_token_stride + head * q_head_stride + d], d < 576 */
  void* o;       /* o[row * o_token_stride + head * o_head_stride + d], d < 512 */
  float* lse;    /* [query rows, num_heads] natural log, or NULL */
  int64_t q_token_stride, q_head_stride; /* elements, multiples of 8; 0: packed */
  int64_t o_token_stride, o_head_stride;
  float sm_scale; /* required (DeepSeek-V3: 1 / sqrt(192), the non-absorbed head dim) */
} slimserve_mla_decode_args;
SLIMSERVE_C_API slimserve_status slimserve_mla_decode_run(const slimserve_mla_plan* plan,
                                                          const slimserve_mla_decode_args* args,
                                                          void* workspace,
                                                          size_t workspace_bytes,
                                                          slimserve_stream stream);

/* Cached prefix -> BF16 rows [latent | rope] for non-absorbed prefill: row token_indptr[b] + i
 * is position i of request b, at out[row * out_stride]. Rows of aborted requests are NaN. */
typedef struct slimserve_mla_gather_args {
  size_t struct_size;
  slimserve_mla_cache cache;
  const slimserve_page_table_view* table;   /* CSR (device) */
  const slimserve_request_status* statuses; /* or NULL */
  const int32_t* token_indptr; /* [batch_size + 1] device */
  void* out;                   /* BF16 [num_rows, out_stride] */
  int64_t out_stride;          /* elements, multiple of 8; 0: 576 */
  int32_t num_rows;            /* an upper bound of token_indptr[batch_size] */
} slimserve_mla_gather_args;
SLIMSERVE_C_API slimserve_status slimserve_mla_gather(const slimserve_mla_gather_args* args,
                                                      slimserve_stream stream);

/* ---- INT4 mixture-of-experts GEMM (docs/int4-gemm.md) ------------------------------------ */

/* An MoE layer routes each token to top_k of E experts; the engine's router gives expert ids
 * and weights, [T, top_k] each, in device memory. A layer aligns its routing once and passes
 * it to both grouped W4A16 GEMMs:
 *   1. once (host): slimserve_moe_routing_plan_create and slimserve_moe_gemm_plan_create for
 *      up to max_tokens tokens; their workspace size queries bound every step up to it (one
 *      allocation serves the engine's whole life, CUDA graphs included);
 *   2. each step: slimserve_moe_routing_run sorts the T * top_k (token, slot) pairs by expert
 *      on the device and checks the ids there (launches only, capturable), giving a
 *      slimserve_moe_routing;
 *   3. slimserve_moe_gemm_run with that routing, for gate+up (SLIMSERVE_MOE_GATE_UP_SILU:
 *      mid[pair] = silu(x W_gate) * (x W_up), pair = token * top_k + slot) and for down
 *      (SLIMSERVE_MOE_DOWN_WEIGHTED_SUM: out[token] = sum over slots, in slot order, of the
 *      router weight * (mid[pair] W_down)); FP32 accumulation, deterministic, no atomics;
 *   4. after the step: slimserve_moe_routing_read_status (synchronizes), or copy the 16-byte
 *      slimserve_moe_routing_status word with the step's other outputs.
 * An expert id outside 0 .. E - 1 makes no kernel read outside its inputs: its pair is
 * skipped by both GEMMs (its gate+up row is not written and adds nothing to the token's down
 * output) and counted in the status word. */

typedef int32_t slimserve_moe_epilogue;
enum { SLIMSERVE_MOE_GATE_UP_SILU = 0, SLIMSERVE_MOE_DOWN_WEIGHTED_SUM = 1 };
/* How the alignment sorts pairs by expert. */
typedef int32_t slimserve_moe_align_method;
enum {
  SLIMSERVE_MOE_ALIGN_AUTOMATIC = 0, /* CUB on the GPU, serial in the emulator */
  SLIMSERVE_MOE_ALIGN_SERIAL = 1,    /* one thread, stable counting sort (also on the GPU) */
  SLIMSERVE_MOE_ALIGN_DEVICE = 2     /* CUB radix sort + scan (CUDA build only) */
};

/* The router's output as the alignment reads it. One struct serves the plan (which reads the
 * sizes and options and keeps no pointer) and every step's run (which reads T and the ids). */
typedef struct slimserve_moe_routing_args {
  size_t struct_size;
  int64_t num_tokens;       /* T: 1 .. the plan's max_tokens */
  int64_t top_k;            /* 1 .. num_experts */
  int64_t num_experts;      /* E */
  const int32_t* topk_ids;  /* device [T, top_k] expert ids, 4-byte aligned */
  int64_t max_tokens;       /* plan only: the largest T it serves; 0: num_tokens */
  slimserve_moe_align_method align; /* plan only; 0: automatic */
} slimserve_moe_routing_args;

/* The alignment's device-side check of the ids (device memory, written by every run). */
typedef struct slimserve_moe_routing_status {
  int32_t invalid_pairs; /* pairs whose id is outside 0 .. E - 1 (skipped by the GEMMs) */
  int32_t first_invalid; /* the smallest such pair (token * top_k + slot), or -1 */
  int32_t first_id;      /* its id */
  int32_t reserved;
} slimserve_moe_routing_status;

/* One step's aligned routing: device pointers into the routing workspace plus the sizes and
 * ids it was aligned from. Written by slimserve_moe_routing_run; pass it to both GEMMs as it
 * is. Valid until the routing workspace is reused or the ids change; a GEMM refuses a routing
 * aligned from other ids or sizes. */
typedef struct slimserve_moe_routing {
  const int32_t* topk_ids;    /* [T, top_k] the ids it was aligned from */
  const int32_t* tile_expert; /* [max_tiles] expert of each 16-row tile */
  const int32_t* tile_rows;   /* [max_tiles, 16] pair of each row (T * top_k: padding) */
  const int32_t* tiles_used;  /* [1] */
  const slimserve_moe_routing_status* status;
  int64_t num_tokens;
  int64_t top_k;
  int64_t num_experts;
  int64_t max_tiles; /* row tiles of the worst routing of T tokens (the GEMMs' grid) */
} slimserve_moe_routing;

typedef struct slimserve_moe_routing_plan slimserve_moe_routing_plan;

/* Bytes of the routing workspace for every step up to max_tokens (the plan's). */
SLIMSERVE_C_API slimserve_status slimserve_moe_routing_workspace_size(
    const slimserve_moe_routing_args* args, size_t* bytes);
/* Preflight (1 <= top_k <= E, T >= 1, the ids pointer) and sizes; launches nothing. */
SLIMSERVE_C_API slimserve_status slimserve_moe_routing_plan_create(
    const slimserve_moe_routing_args* args, slimserve_moe_routing_plan** out);
SLIMSERVE_C_API void slimserve_moe_routing_plan_destroy(slimserve_moe_routing_plan* plan);
/* The alignment of args' T tokens on `stream` (launches only: capturable). `workspace`:
 * device, 256-byte aligned, at least the size query's bytes (else
 * SLIMSERVE_RESOURCE_EXHAUSTED). Writes *out only on success. */
SLIMSERVE_C_API slimserve_status slimserve_moe_routing_run(
    const slimserve_moe_routing_plan* plan, const slimserve_moe_routing_args* args,
    void* workspace, size_t workspace_bytes, slimserve_stream stream,
    slimserve_moe_routing* out);
/* After the step: copies the routing's status word to the host (synchronizes `stream`):
 * SLIMSERVE_OUT_OF_RANGE naming the first bad token, slot and id and the count of skipped
 * pairs, SLIMSERVE_OK when every id was in range. */
SLIMSERVE_C_API slimserve_status slimserve_moe_routing_read_status(
    const slimserve_moe_routing* routing, slimserve_stream stream);
/* Host check of a host copy of the ids: every id in 0 .. num_experts - 1
 * (SLIMSERVE_OUT_OF_RANGE names the first bad token, slot and id). */
SLIMSERVE_C_API slimserve_status slimserve_moe_validate_routing(const int32_t* host_topk_ids,
                                                                int64_t num_tokens,
                                                                int64_t top_k,
                                                                int64_t num_experts);

/* One grouped GEMM of a layer. Each expert's weights are packed exactly as the dense GEMM's
 * (slimserve_int4_weights_info of one expert: k x n), the E experts laid end to end. The
 * element type of a, c, scales and zeros is `activation`; device pointers, 16-byte aligned. */
typedef struct slimserve_moe_gemm_args {
  size_t struct_size;
  slimserve_activation_dtype activation;
  slimserve_moe_epilogue epilogue;
  int64_t num_tokens;   /* T: 1 .. the plan's max_tokens */
  int64_t top_k;        /* 1 .. num_experts */
  int64_t num_experts;  /* E */
  int64_t k;            /* reduction size: multiple of 16 and of group_size */
  int64_t n;            /* expert columns: gate+up [gate | up] 2 x intermediate (multiple of
                           32), down hidden (multiple of 16) */
  int64_t group_size;   /* a power of two >= 16 dividing k, or k */
  const void* a;        /* gate+up: [T, k] tokens; down: [T * top_k, k] in pair order */
  const uint32_t* b;    /* [E][k/16, n/16, 32] packed */
  const void* scales;   /* [E][k/group_size, n] */
  const void* zeros;    /* [E][k/group_size, n], or NULL (symmetric: z = 8) */
  const int32_t* topk_ids;    /* [T, top_k] device: the ids the routing was aligned from */
  const float* topk_weights;  /* [T, top_k] device router weights (down only; else NULL) */
  void* c;              /* gate+up: [T * top_k, n / 2] in pair order; down: [T, n] */
  int64_t max_tokens;   /* plan only: the largest T it serves; 0: num_tokens */
} slimserve_moe_gemm_args;

typedef struct slimserve_moe_gemm_plan slimserve_moe_gemm_plan;

/* Bytes of the GEMM's own workspace (with a routing) for every step up to max_tokens: the
 * down projection's FP32 partials [max_tokens * top_k, n]; 0 for gate+up. */
SLIMSERVE_C_API slimserve_status slimserve_moe_gemm_workspace_size(
    const slimserve_moe_gemm_args* args, size_t* bytes);
/* Preflight (shapes, group size, top_k <= E, pointers, alignment) and sizes; launches
 * nothing. */
SLIMSERVE_C_API slimserve_status slimserve_moe_gemm_plan_create(
    const slimserve_moe_gemm_args* args, slimserve_moe_gemm_plan** out);
SLIMSERVE_C_API void slimserve_moe_gemm_plan_destroy(slimserve_moe_gemm_plan* plan);

/* Where the group scales are applied: the FP64 model the results match (docs/int4-gemm.md). */
typedef int32_t slimserve_group_scaling;
enum {
  SLIMSERVE_SCALING_PER_WEIGHT = 0,   /* w = round_T((q - z) * s), as slimserve_int4_weights_dequantize */
  SLIMSERVE_SCALING_PER_GROUP_SUM = 1 /* w = (q - z) * s exactly (groups >= 64, per-channel) */
};
typedef struct slimserve_moe_gemm_plan_info {
  size_t struct_size;
  int64_t max_tokens;
  int64_t max_tiles;          /* row tiles for max_tokens in the worst routing */
  size_t workspace_bytes;     /* the GEMM's own part (as the size query) */
  slimserve_group_scaling scaling;
} slimserve_moe_gemm_plan_info;
SLIMSERVE_C_API slimserve_status slimserve_moe_gemm_plan_get_info(
    const slimserve_moe_gemm_plan* plan, slimserve_moe_gemm_plan_info* info);

/* The grouped GEMM (and, for down, the combine into token order) over `routing` on `stream`
 * (launches only: capturable). `workspace`: the GEMM's own part, device, 256-byte aligned
 * (may be NULL when that is 0). Refuses a routing aligned from other ids or sizes. */
SLIMSERVE_C_API slimserve_status slimserve_moe_gemm_run(const slimserve_moe_gemm_plan* plan,
                                                        const slimserve_moe_gemm_args* args,
                                                        const slimserve_moe_routing* routing,
                                                        void* workspace,
                                                        size_t workspace_bytes,
                                                        slimserve_stream stream);

/* ---- Moving a request's pages between engines: cache layouts and transfer lists (ABI 3) ---
 *
 * For a transfer engine (NIXL, UCX, RDMA verbs) that moves bytes between two processes'
 * registered memory: each engine describes its cache once (slimserve_describe_*_cache) and
 * registers the regions slimserve_cache_registration_regions names, once per cache. Per request
 * the receiving side checks the peer's layout (slimserve_cache_layout_check_compatible; a
 * mismatch names the field) and slimserve_build_transfer_list gives the (source, destination,
 * bytes) entries over the two caches, one per page piece (a page's filled slots in one array),
 * merged where both sides are contiguous. Host code only: nothing is launched or read from the
 * pages. A layout's bytes are its wire form: send sizeof(slimserve_cache_layout) bytes and
 * parse them on the other side with slimserve_cache_layout_parse (docs/disaggregation.md). */
typedef int32_t slimserve_cache_kind;
enum { SLIMSERVE_CACHE_PAGED_KV = 0, SLIMSERVE_CACHE_MLA_LATENT = 1 };

/* One array of a cache: page p starts at address + p * page_stride (address 0: no such array). */
typedef struct slimserve_cache_array {
  uint64_t address;
  int64_t page_stride; /* bytes */
  int64_t bytes;       /* (num_pages - 1) * page_stride + the bytes of one page */
} slimserve_cache_array;

/* A cache's geometry (136 bytes, no padding; the same bytes on both sides of a transfer). */
typedef struct slimserve_cache_layout {
  uint32_t magic;      /* 0x444C5353 ("SSLD") */
  uint32_t version;    /* 1 */
  uint8_t kind;        /* slimserve_cache_kind */
  uint8_t dtype;       /* slimserve_kv_dtype */
  uint8_t layout;      /* slimserve_kv_layout (MLA: NHD, token-major records) */
  uint8_t scale_mode;  /* slimserve_kv_scale_mode, or slimserve_mla_scale_mode for MLA */
  int32_t num_pages;
  int32_t page_size;
  int32_t num_kv_heads; /* MLA: 1 */
  int32_t head_dim;     /* MLA: 512 */
  int32_t token_bytes;  /* one (token, head) row of K; MLA: one token record */
  int32_t num_arrays;   /* 2 (K, V), 4 (+ per-token K and V scales), MLA 1 */
  int32_t reserved;
  slimserve_cache_array k; /* MLA: the record array */
  slimserve_cache_array v;
  slimserve_cache_array k_scales;
  slimserve_cache_array v_scales;
} slimserve_cache_layout;

/* One contiguous move of `bytes` from address src (source cache) to dst (destination cache). */
typedef struct slimserve_transfer_entry {
  uint64_t src;
  uint64_t dst;
  int64_t bytes;
} slimserve_transfer_entry;

/* The layout of a paged K/V cache whose pages are page_stride storage elements (NVFP4: bytes)
 * apart (0: packed). */
SLIMSERVE_C_API slimserve_status slimserve_describe_kv_cache(const slimserve_kv_cache* cache,
                                                             int64_t page_stride,
                                                             slimserve_cache_layout* out);
SLIMSERVE_C_API slimserve_status slimserve_describe_mla_cache(const slimserve_mla_cache* cache,
                                                              slimserve_cache_layout* out);
/* Checks bytes received from a peer (size, magic, version, enums, geometry, arrays). */
SLIMSERVE_C_API slimserve_status slimserve_cache_layout_parse(const void* bytes, size_t num_bytes,
                                                              slimserve_cache_layout* out);
/* SLIMSERVE_OK when pages move between the two byte for byte; else SLIMSERVE_INVALID_ARGUMENT
 * naming the first field that differs (kind, dtype, layout, scale_mode, page_size,
 * num_kv_heads, head_dim, token_bytes). Page counts, addresses and strides may differ. */
SLIMSERVE_C_API slimserve_status slimserve_cache_layout_check_compatible(
    const slimserve_cache_layout* local, const slimserve_cache_layout* remote);
/* Entries slimserve_build_transfer_list may need for a request of num_pages pages. */
SLIMSERVE_C_API int64_t slimserve_transfer_list_capacity(const slimserve_cache_layout* layout,
                                                         int32_t num_pages);
/* One request's list: src_pages and dst_pages (host, [num_pages] each, sequence order) hold
 * num_tokens tokens. Refuses incompatible layouts, page counts that do not fit num_tokens, ids
 * outside 1..num_pages - 1, a page listed twice, capacity below the bound; *count = 0 then. */
SLIMSERVE_C_API slimserve_status slimserve_build_transfer_list(
    const slimserve_cache_layout* src, const int32_t* src_pages, const slimserve_cache_layout* dst,
    const int32_t* dst_pages, int32_t num_pages, int64_t num_tokens, slimserve_transfer_entry* out,
    size_t capacity, size_t* count);
/* The fewest entries that move the same bytes as entries[0..count) (any order, pieces that do
 * not overlap on either side), in place: sorted by source address, an entry merged into the
 * previous one when its source and destination both continue it, across arrays too (a
 * combined K/V allocation's run of pages is one entry); *out_count gets the count (ABI 3). */
SLIMSERVE_C_API slimserve_status slimserve_coalesce_transfer_list(slimserve_transfer_entry* entries,
                                                                  size_t count, size_t* out_count);
/* A page's current writer (0: read-only, or an id out of range): a transfer's reservation is
 * granted with slimserve_page_pool_new_writer / _grant_write once its bytes are verified. */
SLIMSERVE_C_API uint32_t slimserve_page_pool_writer(const slimserve_page_pool* pool, int32_t page);
/* The memory to register with the transfer engine, once per cache: up to 4 regions into
 * out[0..3] (address, bytes; page_stride 0), arrays merged where they overlap or touch.
 * Returns the count, 0 for an invalid layout. */
SLIMSERVE_C_API int32_t slimserve_cache_registration_regions(const slimserve_cache_layout* layout,
                                                             slimserve_cache_array* out);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif /* SLIMSERVE_C_SLIMSERVE_H_ */
