// The C ABI (include/slimserve/c/slimserve.h) over the C++ façades. Each entry point converts
// C structs to the C++ Arguments, range-checks enumerations that arrive as integers, calls the
// façade, and turns its Status into a code plus this thread's last message. No exception
// crosses the boundary. Built twice: over slimserve::slimserve (libslimserve_c) and over
// slimserve::emulated (libslimserve_c_emulated).
#include "slimserve/c/slimserve.h"

#include "c_support.hpp"

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "slimserve/attention/append.hpp"
#include "slimserve/attention/decode.hpp"
#include "slimserve/attention/decode_plan.hpp"
#include "slimserve/attention/kv_cache_view.hpp"
#include "slimserve/attention/rotate_heads.hpp"
#include "slimserve/int4/gemm.hpp"
#include "slimserve/int4/gemm_layout.hpp"
#include "slimserve/int4/quantize.hpp"
#include "slimserve/kv/device_page_table.hpp"
#include "slimserve/kv/device_tag_array.hpp"
#include "slimserve/kv/page_movement.hpp"
#include "slimserve/kv/page_pool.hpp"
#include "slimserve/kv/page_table_builder.hpp"
#include "slimserve/kv/prefix_cache.hpp"
#include "slimserve/kv/request_pages.hpp"
#include "slimserve/kv/tag_check.hpp"
#include "slimserve/runtime/memory.hpp"
#include "slimserve/status.hpp"
#include "slimserve/version.hpp"

namespace ss = slimserve;
namespace kv = slimserve::kv;
namespace attention = slimserve::attention;
namespace int4 = slimserve::int4;
namespace rt = slimserve::rt;
using ss::make_status;
using ss::Status;
using ss::StatusCode;

// The handles' definitions: plain owners of the C++ objects.
struct slimserve_page_pool {
  kv::PagePool pool;
};
struct slimserve_prefix_cache {
  std::unique_ptr<kv::PrefixCache> cache;
};
struct slimserve_page_table {
  kv::PageTableStorage storage;
  std::int32_t page_size;
  std::int32_t num_pages;
  std::vector<kv::PageHandle> handles;  // the last build's pages, contiguous
  std::vector<kv::RequestPages> requests;
};
struct slimserve_request_sets {
  std::unique_ptr<kv::RequestPageSets> sets;
};
struct slimserve_decode_plan {
  attention::DecodePlan plan;
};
struct slimserve_int4_weights {
  int4::GemmWeights weights;
};
struct slimserve_gemm_plan {
  int4::GemmPlan plan;
};

namespace {

using namespace slimserve_capi;

static_assert(SLIMSERVE_INVALID_ARGUMENT == static_cast<int>(StatusCode::invalid_argument));
static_assert(SLIMSERVE_STALE_HANDLE == static_cast<int>(StatusCode::stale_handle));
static_assert(SLIMSERVE_INTERNAL == static_cast<int>(StatusCode::internal));
static_assert(SLIMSERVE_REQUEST_BAD_PAGE_TABLE == static_cast<int>(kv::RequestState::bad_page_table));
static_assert(SLIMSERVE_REQUEST_READ_DENIED == static_cast<int>(kv::RequestState::read_denied));
static_assert(SLIMSERVE_REQUEST_UNWRITTEN_SLOTS == static_cast<int>(kv::RequestState::unwritten_slots));
static_assert(SLIMSERVE_REQUEST_APPEND_NOT_NEXT == static_cast<int>(kv::RequestState::append_not_next));
static_assert(SLIMSERVE_REQUEST_RECORD_MISMATCH == static_cast<int>(kv::RequestState::record_mismatch));
static_assert(SLIMSERVE_REQUEST_TAGS_NOT_SYNCED == static_cast<int>(kv::RequestState::tags_not_synced));
// Device arrays of statuses are shared by C callers and the kernels.
static_assert(sizeof(slimserve_request_status) == sizeof(kv::RequestStatus));
static_assert(offsetof(slimserve_request_status, failed_slot) == offsetof(kv::RequestStatus, failed_slot));
static_assert(sizeof(slimserve_page) == sizeof(kv::PageHandle));
// Device arrays of moves are read by the kernels as the C++ structs.
static_assert(sizeof(slimserve_page_copy) == sizeof(kv::PageCopy));
static_assert(offsetof(slimserve_page_copy, dst) == offsetof(kv::PageCopy, dst));
static_assert(offsetof(slimserve_page_copy, writer) == offsetof(kv::PageCopy, writer));
static_assert(offsetof(slimserve_page_copy, tokens) == offsetof(kv::PageCopy, tokens));
static_assert(sizeof(slimserve_page_swap) == sizeof(kv::PageSwap));
static_assert(offsetof(slimserve_page_swap, writer) == offsetof(kv::PageSwap, writer));
static_assert(offsetof(slimserve_page_swap, host_slot) == offsetof(kv::PageSwap, host_slot));
static_assert(std::is_same_v<kv::WriterId, std::uint32_t>);
// Device arrays of swap identities are read by the kernels as kv::RecordIdentity.
static_assert(sizeof(slimserve_record_identity) == sizeof(kv::RecordIdentity));
static_assert(offsetof(slimserve_record_identity, pool) == offsetof(kv::RecordIdentity, pool));
static_assert(offsetof(slimserve_record_identity, writer) == offsetof(kv::RecordIdentity, writer));
static_assert(offsetof(slimserve_record_identity, sequence) == offsetof(kv::RecordIdentity, sequence));

kv::PageHandle to_handle(slimserve_page page) { return {page.id, page.tag}; }
slimserve_page to_c(kv::PageHandle page) { return {page.id, page.tag}; }

slimserve_page_table_view to_c(const kv::PageTableView& t) {
  return {t.indptr, t.indices, t.last_page_len, t.expected_tags, t.batch_size, t.page_size};
}
Status to_problem(const slimserve_decode_problem* p, attention::DecodeProblem& out) {
  if (p == nullptr) return null_argument("problem");
  out.batch_size = p->batch_size;
  out.num_qo_heads = p->num_qo_heads;
  out.num_kv_heads = p->num_kv_heads;
  out.head_dim = p->head_dim;
  out.page_size = p->page_size;
  out.query_tokens = p->query_tokens;
  SLIMSERVE_RETURN_IF_ERROR(to_enum(p->kv_dtype, "KV dtype", out.kv_dtype));
  return attention::can_implement(out);
}

Status to_plan_arguments(const slimserve_decode_problem* problem, const std::int32_t* indptr,
                         const std::int32_t* last_page_len, attention::DecodePlanArguments& out) {
  SLIMSERVE_RETURN_IF_ERROR(to_problem(problem, out.problem));
  const auto batch = static_cast<std::size_t>(out.problem.batch_size);
  if (indptr == nullptr) return null_argument("indptr_host");
  if (batch > 0 && last_page_len == nullptr) return null_argument("last_page_len_host");
  out.indptr_host = std::span<const std::int32_t>(indptr, batch + 1);
  out.last_page_len_host = std::span<const std::int32_t>(last_page_len, batch);
  return {};
}

Status to_gemm_arguments(const slimserve_gemm_args* a, int4::GemmArguments& out) {
  if (a == nullptr) return null_argument("args");
  SLIMSERVE_RETURN_IF_ERROR(to_enum(a->activation, "activation dtype", out.activation));
  out.m = a->m;
  out.n = a->n;
  out.k = a->k;
  out.group_size = a->group_size;
  out.a = a->a;
  out.b = a->b;
  out.scales = a->scales;
  out.zeros = a->zeros;
  out.bias = a->bias;
  out.c = a->c;
  return int4::can_implement(out);
}

kv::RequestRef to_ref(slimserve_request_ref r) { return {r.slot, r.writer}; }
slimserve_request_ref to_c(kv::RequestRef r) { return {r.slot, r.writer}; }
void to_c(const kv::PagePlan& plan, slimserve_page_plan* out) {
  if (out == nullptr) return;
  out->needs_copy = plan.needs_copy ? 1 : 0;
  out->copy_from = to_c(plan.copy_from);
  out->copy_to = to_c(plan.copy_to);
  out->copy_tokens = plan.copy_tokens;
  out->cached_tokens = plan.cached_tokens;
}
std::span<const kv::TokenId> token_span(const std::int32_t* tokens, std::size_t count) {
  return count == 0 ? std::span<const kv::TokenId>() : std::span<const kv::TokenId>(tokens, count);
}
Status to_request_view(const slimserve_request_pages_view* r, kv::RequestPagesView& out) {
  if (r == nullptr) return null_argument("request");
  out.pages = r->pages;
  out.tags = r->tags;
  out.num_pages = r->num_pages;
  out.num_tokens = r->num_tokens;
  out.writer = r->writer;
  return {};
}
kv::RecordIdentity to_identity(const slimserve_record_identity& i) {
  return {i.pool, i.writer, i.sequence};
}

template <class Handle, class Made>
Status hand_out(Made made, Handle** out) {
  *out = new Handle{std::move(made)};
  return {};
}

}  // namespace

extern "C" {

// ---- Status and version ----------------------------------------------------------------------

const char* slimserve_last_error(void) { return slimserve_capi::last_error_message(); }

const char* slimserve_status_name(slimserve_status status) {
  switch (status) {
    case SLIMSERVE_OK: return "ok";
    case SLIMSERVE_INVALID_ARGUMENT: return "invalid argument";
    case SLIMSERVE_OUT_OF_RANGE: return "out of range";
    case SLIMSERVE_UNSUPPORTED: return "unsupported";
    case SLIMSERVE_RESOURCE_EXHAUSTED: return "resource exhausted";
    case SLIMSERVE_STALE_HANDLE: return "stale handle";
    case SLIMSERVE_FAILED_PRECONDITION: return "failed precondition";
    case SLIMSERVE_DATA_LOSS: return "data loss";
    case SLIMSERVE_IO_ERROR: return "i/o error";
    case SLIMSERVE_DEVICE_ERROR: return "device error";
    case SLIMSERVE_INTERNAL: return "internal error";
    default: return "unknown";
  }
}

int32_t slimserve_c_abi_version(void) { return SLIMSERVE_C_ABI_VERSION; }
int32_t slimserve_version(void) {
  const ss::Version v = ss::linked_version();
  return v.major * 10000 + v.minor * 100 + v.patch;
}
int32_t slimserve_is_emulated(void) {
#if defined(SLIMSERVE_EMULATE)
  return 1;
#else
  return 0;
#endif
}

// ---- Memory ----------------------------------------------------------------------------------

slimserve_status slimserve_device_alloc(size_t bytes, void** out) {
  return guarded([&]() -> Status {
    if (out == nullptr) return null_argument("out");
    *out = nullptr;
    return rt::device_malloc(out, bytes);
  });
}
slimserve_status slimserve_device_free(void* ptr) {
  return guarded([&] { return ptr == nullptr ? Status{} : rt::device_free(ptr); });
}
slimserve_status slimserve_memcpy_async(void* dst, const void* src, size_t bytes,
                                        slimserve_copy_kind kind, slimserve_stream stream) {
  return guarded([&]() -> Status {
    if (kind < SLIMSERVE_HOST_TO_DEVICE || kind > SLIMSERVE_DEVICE_TO_DEVICE) {
      return make_status(StatusCode::invalid_argument, "unknown copy kind ", kind);
    }
    if (bytes > 0 && (dst == nullptr || src == nullptr)) return null_argument("dst or src");
    return rt::copy_async(dst, src, bytes, static_cast<rt::CopyDirection>(kind), stream);
  });
}
slimserve_status slimserve_memset_async(void* dst, int32_t byte_value, size_t bytes,
                                        slimserve_stream stream) {
  return guarded([&]() -> Status {
    if (bytes > 0 && dst == nullptr) return null_argument("dst");
    return rt::memset_async(dst, byte_value, bytes, stream);
  });
}
slimserve_status slimserve_stream_synchronize(slimserve_stream stream) {
  return guarded([&] { return rt::stream_synchronize(stream); });
}
slimserve_status slimserve_host_alloc(size_t bytes, void** out) {
  return guarded([&]() -> Status {
    if (out == nullptr) return null_argument("out");
    *out = nullptr;
    return rt::pinned_malloc(out, bytes);
  });
}
slimserve_status slimserve_host_free(void* ptr) {
  return guarded([&] { return ptr == nullptr ? Status{} : rt::pinned_free(ptr); });
}

// ---- Page pool -------------------------------------------------------------------------------

slimserve_status slimserve_page_pool_create(int32_t num_pages, slimserve_page_pool** out) {
  return guarded([&]() -> Status {
    if (out == nullptr) return null_argument("out");
    *out = nullptr;
    auto pool = kv::PagePool::create({num_pages});
    if (!pool.ok()) return pool.status();
    return hand_out<slimserve_page_pool>(*std::move(pool), out);
  });
}
void slimserve_page_pool_destroy(slimserve_page_pool* pool) { delete pool; }

slimserve_status slimserve_page_pool_allocate(slimserve_page_pool* pool, slimserve_page* out,
                                              size_t count) {
  return guarded([&]() -> Status {
    if (pool == nullptr) return null_argument("pool");
    if (count > 0 && out == nullptr) return null_argument("out");
    // Before sizing anything by count: a count past the pool (a negative int through size_t)
    // is the caller's mistake, not an allocation failure.
    const auto available = static_cast<std::size_t>(std::max(pool->pool.available_pages(), 0));
    if (count > available) {
      return make_status(StatusCode::resource_exhausted, "allocate of ", count, " pages; ", available,
                         " are available (nothing was taken)");
    }
    std::vector<kv::PageHandle> pages(count);
    SLIMSERVE_RETURN_IF_ERROR(pool->pool.allocate(pages));
    for (std::size_t i = 0; i < count; ++i) out[i] = to_c(pages[i]);
    return {};
  });
}
slimserve_status slimserve_page_pool_release(slimserve_page_pool* pool,
                                             const slimserve_page* pages, size_t count) {
  return guarded([&]() -> Status {
    if (pool == nullptr) return null_argument("pool");
    if (count > 0 && pages == nullptr) return null_argument("pages");
    std::vector<kv::PageHandle> handles(count);
    for (std::size_t i = 0; i < count; ++i) handles[i] = to_handle(pages[i]);
    return pool->pool.release(std::span<const kv::PageHandle>(handles));
  });
}
slimserve_status slimserve_page_pool_share(slimserve_page_pool* pool, slimserve_page page) {
  return guarded([&]() -> Status {
    if (pool == nullptr) return null_argument("pool");
    return pool->pool.share(to_handle(page));
  });
}
slimserve_status slimserve_page_pool_validate(const slimserve_page_pool* pool,
                                              slimserve_page page) {
  return guarded([&]() -> Status {
    if (pool == nullptr) return null_argument("pool");
    return pool->pool.validate(to_handle(page));
  });
}
slimserve_status slimserve_page_pool_new_writer(slimserve_page_pool* pool, uint32_t* out) {
  return guarded([&]() -> Status {
    if (pool == nullptr) return null_argument("pool");
    if (out == nullptr) return null_argument("out");
    *out = pool->pool.new_writer();
    return {};
  });
}
slimserve_status slimserve_page_pool_grant_write(slimserve_page_pool* pool, slimserve_page page,
                                                 uint32_t writer) {
  return guarded([&]() -> Status {
    if (pool == nullptr) return null_argument("pool");
    return pool->pool.grant_write(to_handle(page), writer);
  });
}
slimserve_status slimserve_page_pool_revoke_write(slimserve_page_pool* pool, slimserve_page page) {
  return guarded([&]() -> Status {
    if (pool == nullptr) return null_argument("pool");
    return pool->pool.revoke_write(to_handle(page));
  });
}
int32_t slimserve_page_pool_available(const slimserve_page_pool* pool) {
  return pool == nullptr ? 0 : pool->pool.available_pages();
}
slimserve_status slimserve_page_pool_prepare_append(slimserve_page_pool* pool,
                                                    slimserve_page last_page,
                                                    slimserve_append_target* out) {
  return guarded([&]() -> Status {
    if (pool == nullptr) return null_argument("pool");
    if (out == nullptr) return null_argument("out");
    auto target = pool->pool.prepare_append(to_handle(last_page));
    if (!target.ok()) return target.status();
    out->page = to_c(target->page);
    out->copy_from = to_c(target->copy_from);
    out->needs_copy = target->needs_copy ? 1 : 0;
    return {};
  });
}

// ABI 3 (SLIMSERVE_C_3): a page's writer, for pages the caller manages itself (a transfer's
// reservation, published once its bytes are verified).
uint32_t slimserve_page_pool_writer(const slimserve_page_pool* pool, int32_t page) {
  if (pool == nullptr || page < 0 || page >= pool->pool.num_pages()) return 0u;
  return pool->pool.writer(page);
}

// ---- Prefix cache ----------------------------------------------------------------------------

slimserve_status slimserve_prefix_cache_create(slimserve_page_pool* pool, int32_t page_size,
                                               uint64_t hash_seed, slimserve_prefix_cache** out) {
  return guarded([&]() -> Status {
    if (out == nullptr) return null_argument("out");
    *out = nullptr;
    if (pool == nullptr) return null_argument("pool");
    auto cache = kv::PrefixCache::create(pool->pool, {page_size, hash_seed});
    if (!cache.ok()) return cache.status();
    return hand_out<slimserve_prefix_cache>(*std::move(cache), out);
  });
}
void slimserve_prefix_cache_destroy(slimserve_prefix_cache* cache) { delete cache; }

slimserve_status slimserve_prefix_cache_match(slimserve_prefix_cache* cache,
                                              const int32_t* tokens, size_t num_tokens,
                                              uint64_t salt, uint64_t adapter_id,
                                              slimserve_page* out, size_t capacity,
                                              int32_t* hits) {
  return guarded([&]() -> Status {
    if (cache == nullptr) return null_argument("cache");
    if (hits == nullptr) return null_argument("hits");
    if (num_tokens > 0 && tokens == nullptr) return null_argument("tokens");
    if (capacity > 0 && out == nullptr) return null_argument("out");
    std::vector<kv::PageHandle> pages(capacity);
    auto matched = cache->cache->match_prefix(std::span<const kv::TokenId>(tokens, num_tokens),
                                              {salt, adapter_id}, pages);
    if (!matched.ok()) return matched.status();
    for (std::int32_t i = 0; i < *matched; ++i) out[i] = to_c(pages[static_cast<std::size_t>(i)]);
    *hits = *matched;
    return {};
  });
}
slimserve_status slimserve_prefix_cache_insert(slimserve_prefix_cache* cache,
                                               const int32_t* tokens, size_t num_tokens,
                                               uint64_t salt, uint64_t adapter_id,
                                               const slimserve_page* pages, size_t num_pages,
                                               int32_t* inserted) {
  return guarded([&]() -> Status {
    if (cache == nullptr) return null_argument("cache");
    if (num_tokens > 0 && tokens == nullptr) return null_argument("tokens");
    if (num_pages > 0 && pages == nullptr) return null_argument("pages");
    std::vector<kv::PageHandle> handles(num_pages);
    for (std::size_t i = 0; i < num_pages; ++i) handles[i] = to_handle(pages[i]);
    auto count = cache->cache->insert(std::span<const kv::TokenId>(tokens, num_tokens),
                                      {salt, adapter_id}, handles);
    if (!count.ok()) return count.status();
    if (inserted != nullptr) *inserted = *count;
    return {};
  });
}

// ---- Page tables and the tag check -------------------------------------------------------------

slimserve_status slimserve_page_table_create(int32_t max_batch, int64_t max_entries,
                                             int32_t page_size, int32_t num_pages,
                                             slimserve_page_table** out) {
  return guarded([&]() -> Status {
    if (out == nullptr) return null_argument("out");
    *out = nullptr;
    if (page_size < 1 || num_pages < 1) {
      return make_status(StatusCode::invalid_argument, "page table needs page_size >= 1 and ",
                         "num_pages >= 1, got ", page_size, " and ", num_pages);
    }
    auto storage = kv::PageTableStorage::create(max_batch, max_entries);
    if (!storage.ok()) return storage.status();
    *out = new slimserve_page_table{*std::move(storage), page_size, num_pages, {}, {}};
    return {};
  });
}
void slimserve_page_table_destroy(slimserve_page_table* table) { delete table; }

slimserve_status slimserve_page_table_build(slimserve_page_table* table,
                                            const slimserve_request_pages* requests,
                                            int32_t batch_size, slimserve_stream stream,
                                            slimserve_page_table_view* host,
                                            slimserve_page_table_view* device) {
  return guarded([&]() -> Status {
    if (table == nullptr) return null_argument("table");
    if (device == nullptr) return null_argument("device");
    if (batch_size < 0) {
      return make_status(StatusCode::invalid_argument, "batch_size ", batch_size, " < 0");
    }
    if (batch_size > 0 && requests == nullptr) return null_argument("requests");
    std::size_t total = 0;
    for (std::int32_t b = 0; b < batch_size; ++b) {
      if (requests[b].num_pages > 0 && requests[b].pages == nullptr) {
        return make_status(StatusCode::invalid_argument, "request ", b, " has a null page list");
      }
      total += requests[b].num_pages;
    }
    table->handles.assign(total, kv::PageHandle{});
    table->requests.clear();
    std::size_t next = 0;
    for (std::int32_t b = 0; b < batch_size; ++b) {
      const slimserve_request_pages& request = requests[b];
      for (std::size_t i = 0; i < request.num_pages; ++i) {
        table->handles[next + i] = to_handle(request.pages[i]);
      }
      table->requests.push_back(
          {std::span<const kv::PageHandle>(table->handles.data() + next, request.num_pages),
           request.num_tokens});
      next += request.num_pages;
    }
    auto host_table = kv::build_page_table(table->requests, {table->page_size, table->num_pages},
                                           table->storage.host());
    if (!host_table.ok()) return host_table.status();
    auto device_table = kv::upload_page_table(*host_table, table->num_pages,
                                              table->storage.device(), stream);
    if (!device_table.ok()) return device_table.status();
    if (host != nullptr) *host = to_c(*host_table);
    *device = to_c(*device_table);
    return {};
  });
}

slimserve_status slimserve_device_tags_create(int32_t num_pages, slimserve_device_tags** out) {
  return guarded([&]() -> Status {
    if (out == nullptr) return null_argument("out");
    *out = nullptr;
    auto tags = kv::DeviceTagArray::create(num_pages);
    if (!tags.ok()) return tags.status();
    return hand_out<slimserve_device_tags>(*std::move(tags), out);
  });
}
void slimserve_device_tags_destroy(slimserve_device_tags* tags) { delete tags; }

slimserve_status slimserve_device_tags_sync(slimserve_device_tags* tags,
                                            slimserve_page_pool* pool, slimserve_stream stream) {
  return guarded([&]() -> Status {
    if (tags == nullptr) return null_argument("tags");
    if (pool == nullptr) return null_argument("pool");
    return tags->tags.sync(pool->pool, stream);
  });
}

slimserve_status slimserve_check_page_tags_owned(const slimserve_page_table_view* device_table,
                                                 const slimserve_device_tags* tags,
                                                 const uint32_t* writers,
                                                 const int32_t* append_indptr,
                                                 slimserve_request_status* statuses,
                                                 int32_t* aborted_count, slimserve_stream stream) {
  return guarded([&]() -> Status {
    if (device_table == nullptr) return null_argument("device_table");
    if (tags == nullptr) return null_argument("tags");
    kv::TagCheckArguments arguments{to_view(*device_table), &tags->tags,
                                    reinterpret_cast<kv::RequestStatus*>(statuses), aborted_count};
    arguments.writers = writers;
    arguments.append_indptr = append_indptr;
    return kv::check_page_tags(arguments, stream);
  });
}

slimserve_status slimserve_check_page_tags_with(const slimserve_tag_check_args* args,
                                               slimserve_stream stream) {
  return guarded([&]() -> Status {
    slimserve_tag_check_args a{};
    SLIMSERVE_RETURN_IF_ERROR(read_versioned(args, "args", a));
    if (a.table == nullptr) return null_argument("args->table");
    if (a.tags == nullptr) return null_argument("args->tags");
    if (a.check_fill != 0 && a.check_fill != 1) {
      return make_status(StatusCode::invalid_argument, "args->check_fill is ", a.check_fill,
                         ", must be 0 or 1");
    }
    if (a.entry_capacity < 0) {
      return make_status(StatusCode::invalid_argument, "args->entry_capacity is ", a.entry_capacity);
    }
    kv::TagCheckArguments arguments{to_view(*a.table), &a.tags->tags,
                                    reinterpret_cast<kv::RequestStatus*>(a.statuses), a.aborted_count};
    arguments.table.num_entries = a.num_entries;
    arguments.table.entry_capacity = a.entry_capacity;
    arguments.table.built_at = static_cast<const kv::TableAge*>(a.device_built_at);
    arguments.writers = a.writers;
    arguments.append_indptr = a.append_indptr;
    arguments.check_fill = a.check_fill == 1;
    arguments.built_at = kv::TableAge{a.built_at_epoch, a.built_at_pool};
    return kv::check_page_tags(arguments, stream);
  });
}

slimserve_status slimserve_page_pool_table_age(const slimserve_page_pool* pool, uint64_t* epoch,
                                               uint32_t* pool_id) {
  return guarded([&]() -> Status {
    if (pool == nullptr) return null_argument("pool");
    if (epoch == nullptr) return null_argument("epoch");
    if (pool_id == nullptr) return null_argument("pool_id");
    const kv::TableAge age = kv::table_age(pool->pool);
    *epoch = age.epoch;
    *pool_id = age.pool;
    return {};
  });
}

slimserve_status slimserve_device_tags_fills(const slimserve_device_tags* tags, void** fills) {
  return guarded([&]() -> Status {
    if (tags == nullptr) return null_argument("tags");
    if (fills == nullptr) return null_argument("fills");
    *fills = tags->tags.fills();
    return {};
  });
}

slimserve_status slimserve_check_page_tags(const slimserve_page_table_view* device_table,
                                           const slimserve_device_tags* tags,
                                           slimserve_request_status* statuses,
                                           int32_t* aborted_count, slimserve_stream stream) {
  return guarded([&]() -> Status {
    if (device_table == nullptr) return null_argument("device_table");
    if (tags == nullptr) return null_argument("tags");
    return kv::check_page_tags({to_view(*device_table), &tags->tags,
                                reinterpret_cast<kv::RequestStatus*>(statuses), aborted_count},
                               stream);
  });
}

// ---- Request page sets ---------------------------------------------------------------------------

slimserve_status slimserve_request_sets_create(slimserve_page_pool* pool,
                                               slimserve_prefix_cache* cache,
                                               int32_t max_requests, int32_t page_size,
                                               slimserve_request_sets** out) {
  return guarded([&]() -> Status {
    if (out == nullptr) return null_argument("out");
    *out = nullptr;
    if (pool == nullptr) return null_argument("pool");
    auto sets = kv::RequestPageSets::create(pool->pool, cache != nullptr ? cache->cache.get() : nullptr,
                                            {max_requests, page_size});
    if (!sets.ok()) return sets.status();
    return hand_out<slimserve_request_sets>(*std::move(sets), out);
  });
}
void slimserve_request_sets_destroy(slimserve_request_sets* sets) { delete sets; }

slimserve_status slimserve_request_sets_admit(slimserve_request_sets* sets, const int32_t* tokens,
                                              size_t num_tokens, uint64_t salt,
                                              uint64_t adapter_id, slimserve_request_ref* out,
                                              slimserve_page_plan* plan) {
  return guarded([&]() -> Status {
    if (sets == nullptr) return null_argument("sets");
    if (out == nullptr) return null_argument("out");
    if (num_tokens > 0 && tokens == nullptr) return null_argument("tokens");
    kv::PagePlan page_plan;
    auto ref = sets->sets->admit(token_span(tokens, num_tokens), {salt, adapter_id}, &page_plan);
    if (!ref.ok()) return ref.status();
    *out = to_c(*ref);
    to_c(page_plan, plan);
    return {};
  });
}
slimserve_status slimserve_request_sets_append(slimserve_request_sets* sets,
                                               slimserve_request_ref request, int32_t new_tokens,
                                               slimserve_page_plan* plan) {
  return guarded([&]() -> Status {
    if (sets == nullptr) return null_argument("sets");
    auto page_plan = sets->sets->append(to_ref(request), new_tokens);
    if (!page_plan.ok()) return page_plan.status();
    to_c(*page_plan, plan);
    return {};
  });
}
void slimserve_request_sets_release_copy_sources(slimserve_request_sets* sets) {
  if (sets != nullptr) sets->sets->release_copy_sources();
}
slimserve_status slimserve_request_sets_fork(slimserve_request_sets* sets,
                                             slimserve_request_ref parent,
                                             slimserve_request_ref* child) {
  return guarded([&]() -> Status {
    if (sets == nullptr) return null_argument("sets");
    if (child == nullptr) return null_argument("child");
    auto ref = sets->sets->fork(to_ref(parent));
    if (!ref.ok()) return ref.status();
    *child = to_c(*ref);
    return {};
  });
}
slimserve_status slimserve_request_sets_preempt(slimserve_request_sets* sets,
                                                slimserve_request_ref request) {
  return guarded([&]() -> Status {
    if (sets == nullptr) return null_argument("sets");
    return sets->sets->preempt(to_ref(request));
  });
}
slimserve_status slimserve_request_sets_resume(slimserve_request_sets* sets,
                                               slimserve_request_ref preempted,
                                               const int32_t* tokens, size_t num_tokens,
                                               uint64_t salt, uint64_t adapter_id,
                                               slimserve_request_ref* out,
                                               slimserve_page_plan* plan) {
  return guarded([&]() -> Status {
    if (sets == nullptr) return null_argument("sets");
    if (out == nullptr) return null_argument("out");
    if (num_tokens > 0 && tokens == nullptr) return null_argument("tokens");
    kv::PagePlan page_plan;
    auto ref = sets->sets->resume(to_ref(preempted), token_span(tokens, num_tokens),
                                  {salt, adapter_id}, &page_plan);
    if (!ref.ok()) return ref.status();
    *out = to_c(*ref);
    to_c(page_plan, plan);
    return {};
  });
}
slimserve_status slimserve_request_sets_finish(slimserve_request_sets* sets,
                                               slimserve_request_ref request,
                                               const int32_t* tokens, size_t num_tokens,
                                               uint64_t salt, uint64_t adapter_id) {
  return guarded([&]() -> Status {
    if (sets == nullptr) return null_argument("sets");
    if (num_tokens > 0 && tokens == nullptr) return null_argument("tokens");
    return sets->sets->finish(to_ref(request), token_span(tokens, num_tokens), {salt, adapter_id});
  });
}
int32_t slimserve_request_sets_is_active(const slimserve_request_sets* sets,
                                         slimserve_request_ref request) {
  return sets != nullptr && sets->sets->is_active(to_ref(request)) ? 1 : 0;
}
slimserve_status slimserve_request_sets_pages(const slimserve_request_sets* sets,
                                              slimserve_request_ref request, slimserve_page* out,
                                              size_t capacity, size_t* count) {
  return guarded([&]() -> Status {
    if (sets == nullptr) return null_argument("sets");
    if (count == nullptr) return null_argument("count");
    if (capacity > 0 && out == nullptr) return null_argument("out");
    const std::span<const kv::PageHandle> pages = sets->sets->pages(to_ref(request));
    for (std::size_t i = 0; i < pages.size() && i < capacity; ++i) out[i] = to_c(pages[i]);
    *count = pages.size();
    return {};
  });
}
slimserve_status slimserve_request_sets_adopt(slimserve_request_sets* sets, const slimserve_page* pages,
                                              size_t count, int64_t num_tokens, slimserve_request_ref* out) {
  return guarded([&]() -> Status {
    if (sets == nullptr) return null_argument("sets");
    if (out == nullptr) return null_argument("out");
    if (count > 0 && pages == nullptr) return null_argument("pages");
    std::vector<kv::PageHandle> handles(count);
    for (std::size_t i = 0; i < count; ++i) handles[i] = to_handle(pages[i]);
    auto ref = sets->sets->adopt(handles, num_tokens);
    if (!ref.ok()) return ref.status();
    *out = to_c(*ref);
    return {};
  });
}
int64_t slimserve_request_sets_tokens(const slimserve_request_sets* sets,
                                      slimserve_request_ref request) {
  return sets == nullptr ? 0 : sets->sets->tokens(to_ref(request));
}

// ---- Moving pages ------------------------------------------------------------------------------

slimserve_status slimserve_check_page_copies(const slimserve_kv_cache* cache,
                                             const slimserve_page_copy* host_copies,
                                             int32_t num_copies) {
  return guarded([&]() -> Status {
    attention::PagedKVCacheView view;
    SLIMSERVE_RETURN_IF_ERROR(to_cache(cache, view));
    if (num_copies < 0) return make_status(StatusCode::invalid_argument, "num_copies ", num_copies);
    if (num_copies > 0 && host_copies == nullptr) return null_argument("host_copies");
    std::vector<kv::PageCopy> copies(static_cast<std::size_t>(num_copies));
    for (std::size_t i = 0; i < copies.size(); ++i) {
      const slimserve_page_copy& c = host_copies[i];
      copies[i] = kv::PageCopy{c.src, c.src_tag, c.dst, c.dst_tag, c.writer, c.tokens};
    }
    return kv::check_page_copies(copies, view);
  });
}
slimserve_status slimserve_copy_pages(const slimserve_kv_cache* cache,
                                      const slimserve_device_tags* tags,
                                      const slimserve_page_copy* copies, int32_t num_copies,
                                      slimserve_request_status* statuses,
                                      slimserve_stream stream) {
  return guarded([&]() -> Status {
    if (tags == nullptr) return null_argument("tags");
    kv::CopyPagesArguments arguments;
    SLIMSERVE_RETURN_IF_ERROR(to_cache(cache, arguments.cache));
    arguments.page_tags = &tags->tags;
    arguments.copies = reinterpret_cast<const kv::PageCopy*>(copies);
    arguments.num_copies = num_copies;
    arguments.statuses = reinterpret_cast<kv::RequestStatus*>(statuses);
    return kv::copy_pages(arguments, stream);
  });
}
int64_t slimserve_page_record_bytes(const slimserve_kv_cache* cache) {
  attention::PagedKVCacheView view;
  // A host slot: the record and the identity header in front of it.
  return to_cache(cache, view).ok() ? kv::swap_slot_bytes(view) : 0;
}
slimserve_status slimserve_check_page_swaps(const slimserve_kv_cache* cache,
                                            const slimserve_page_swap* host_swaps,
                                            int32_t num_swaps, slimserve_swap_direction direction,
                                            int32_t host_slots) {
  return guarded([&]() -> Status {
    attention::PagedKVCacheView view;
    SLIMSERVE_RETURN_IF_ERROR(to_cache(cache, view));
    if (direction != SLIMSERVE_SWAP_OUT && direction != SLIMSERVE_SWAP_IN) {
      return make_status(StatusCode::invalid_argument, "unknown swap direction ", direction);
    }
    if (num_swaps < 0) return make_status(StatusCode::invalid_argument, "num_swaps ", num_swaps);
    if (num_swaps > 0 && host_swaps == nullptr) return null_argument("host_swaps");
    std::vector<kv::PageSwap> swaps(static_cast<std::size_t>(num_swaps));
    for (std::size_t i = 0; i < swaps.size(); ++i) {
      const slimserve_page_swap& w = host_swaps[i];
      swaps[i] = kv::PageSwap{w.page, w.tag, w.writer, w.host_slot};
    }
    return kv::check_page_swaps(swaps, static_cast<kv::SwapDirection>(direction), view, host_slots);
  });
}
slimserve_status slimserve_swap_pages(const slimserve_kv_cache* cache,
                                      const slimserve_device_tags* tags, void* host_records,
                                      int32_t host_slots, const slimserve_page_swap* swaps,
                                      int32_t num_swaps, slimserve_swap_direction direction,
                                      slimserve_request_status* statuses,
                                      slimserve_stream stream) {
  return guarded([&]() -> Status {
    if (tags == nullptr) return null_argument("tags");
    if (direction != SLIMSERVE_SWAP_OUT && direction != SLIMSERVE_SWAP_IN) {
      return make_status(StatusCode::invalid_argument, "unknown swap direction ", direction);
    }
    kv::SwapPagesArguments arguments;
    SLIMSERVE_RETURN_IF_ERROR(to_cache(cache, arguments.cache));
    arguments.page_tags = &tags->tags;
    arguments.host_records = host_records;
    arguments.host_slots = host_slots;
    arguments.swaps = reinterpret_cast<const kv::PageSwap*>(swaps);
    arguments.num_swaps = num_swaps;
    arguments.direction = static_cast<kv::SwapDirection>(direction);
    arguments.statuses = reinterpret_cast<kv::RequestStatus*>(statuses);
    return kv::swap_pages(arguments, stream);
  });
}
int64_t slimserve_export_buffer_bytes(const slimserve_kv_cache* cache, int32_t num_pages) {
  attention::PagedKVCacheView view;
  return to_cache(cache, view).ok() ? kv::export_buffer_bytes(view, num_pages) : 0;
}
slimserve_status slimserve_export_request(const slimserve_kv_cache* cache,
                                          const slimserve_device_tags* tags,
                                          const slimserve_request_pages_view* request,
                                          void* buffer, int64_t buffer_bytes,
                                          slimserve_request_status* status,
                                          slimserve_stream stream) {
  return guarded([&]() -> Status {
    if (tags == nullptr) return null_argument("tags");
    kv::ExportRequestArguments arguments;
    SLIMSERVE_RETURN_IF_ERROR(to_cache(cache, arguments.cache));
    SLIMSERVE_RETURN_IF_ERROR(to_request_view(request, arguments.request));
    arguments.page_tags = &tags->tags;
    arguments.buffer = buffer;
    arguments.buffer_bytes = buffer_bytes;
    arguments.status = reinterpret_cast<kv::RequestStatus*>(status);
    return kv::export_request(arguments, stream);
  });
}
slimserve_status slimserve_import_request(const slimserve_kv_cache* cache,
                                          const slimserve_device_tags* tags,
                                          const slimserve_request_pages_view* request,
                                          const void* buffer, int64_t buffer_bytes,
                                          const void* header, size_t header_bytes,
                                          slimserve_request_status* status,
                                          slimserve_stream stream) {
  return guarded([&]() -> Status {
    if (tags == nullptr) return null_argument("tags");
    if (header == nullptr) return null_argument("header");
    kv::ImportRequestArguments arguments;
    SLIMSERVE_RETURN_IF_ERROR(to_cache(cache, arguments.cache));
    SLIMSERVE_RETURN_IF_ERROR(to_request_view(request, arguments.request));
    auto descriptor = kv::read_buffer_descriptor(
        std::span<const std::byte>(static_cast<const std::byte*>(header), header_bytes));
    if (!descriptor.ok()) return descriptor.status();
    SLIMSERVE_RETURN_IF_ERROR(kv::check_import_compatible(*descriptor, arguments.cache));
    arguments.page_tags = &tags->tags;
    arguments.buffer = buffer;
    arguments.buffer_bytes = buffer_bytes;
    arguments.descriptor = *descriptor;
    // This entry point has no expected identity: it takes the one the header claims, so the
    // device still verifies every record's integrity (checksum, index, length) against it.
    auto claimed = kv::read_buffer_identity(
        std::span<const std::byte>(static_cast<const std::byte*>(header), header_bytes));
    if (!claimed.ok()) return claimed.status();
    arguments.expected = *claimed;
    arguments.status = reinterpret_cast<kv::RequestStatus*>(status);
    return kv::import_request(arguments, stream);
  });
}

slimserve_status slimserve_swap_pages_with(const slimserve_swap_args* args, slimserve_stream stream) {
  return guarded([&]() -> Status {
    slimserve_swap_args a{};
    SLIMSERVE_RETURN_IF_ERROR(read_versioned(args, "args", a));
    if (a.tags == nullptr) return null_argument("args->tags");
    if (a.direction != SLIMSERVE_SWAP_OUT && a.direction != SLIMSERVE_SWAP_IN) {
      return make_status(StatusCode::invalid_argument, "args->direction: unknown swap direction ",
                         a.direction);
    }
    kv::SwapPagesArguments arguments;
    SLIMSERVE_RETURN_IF_ERROR(to_cache(&a.cache, arguments.cache));
    arguments.page_tags = &a.tags->tags;
    arguments.host_records = a.host_records;
    arguments.host_slots = a.host_slots;
    arguments.swaps = reinterpret_cast<const kv::PageSwap*>(a.swaps);
    arguments.num_swaps = a.num_swaps;
    arguments.direction = static_cast<kv::SwapDirection>(a.direction);
    arguments.statuses = reinterpret_cast<kv::RequestStatus*>(a.statuses);
    arguments.identities = reinterpret_cast<const kv::RecordIdentity*>(a.identities);
    return kv::swap_pages(arguments, stream);
  });
}

slimserve_status slimserve_export_request_with(const slimserve_export_args* args,
                                               slimserve_stream stream) {
  return guarded([&]() -> Status {
    slimserve_export_args a{};
    SLIMSERVE_RETURN_IF_ERROR(read_versioned(args, "args", a));
    if (a.tags == nullptr) return null_argument("args->tags");
    kv::ExportRequestArguments arguments;
    SLIMSERVE_RETURN_IF_ERROR(to_cache(&a.cache, arguments.cache));
    SLIMSERVE_RETURN_IF_ERROR(to_request_view(&a.request, arguments.request));
    arguments.page_tags = &a.tags->tags;
    arguments.buffer = a.buffer;
    arguments.buffer_bytes = a.buffer_bytes;
    arguments.status = reinterpret_cast<kv::RequestStatus*>(a.status);
    arguments.identity = to_identity(a.identity);
    return kv::export_request(arguments, stream);
  });
}

slimserve_status slimserve_import_request_with(const slimserve_import_args* args,
                                               slimserve_stream stream) {
  return guarded([&]() -> Status {
    slimserve_import_args a{};
    SLIMSERVE_RETURN_IF_ERROR(read_versioned(args, "args", a));
    if (a.tags == nullptr) return null_argument("args->tags");
    if (a.header == nullptr) return null_argument("args->header");
    if (a.expected.writer == kv::no_writer) {
      return make_status(StatusCode::invalid_argument,
                         "args->expected.writer is 0: whose export the buffer must be (the "
                         "exporter's identity, from the transfer's metadata)");
    }
    kv::ImportRequestArguments arguments;
    SLIMSERVE_RETURN_IF_ERROR(to_cache(&a.cache, arguments.cache));
    SLIMSERVE_RETURN_IF_ERROR(to_request_view(&a.request, arguments.request));
    auto descriptor = kv::read_buffer_descriptor(
        std::span<const std::byte>(static_cast<const std::byte*>(a.header), a.header_bytes));
    if (!descriptor.ok()) return descriptor.status();
    SLIMSERVE_RETURN_IF_ERROR(kv::check_import_compatible(*descriptor, arguments.cache));
    arguments.page_tags = &a.tags->tags;
    arguments.buffer = a.buffer;
    arguments.buffer_bytes = a.buffer_bytes;
    arguments.descriptor = *descriptor;
    arguments.expected = to_identity(a.expected);
    arguments.status = reinterpret_cast<kv::RequestStatus*>(a.status);
    return kv::import_request(arguments, stream);
  });
}

slimserve_status slimserve_read_buffer_identity(const void* header, size_t header_bytes,
                                                slimserve_record_identity* out) {
  return guarded([&]() -> Status {
    if (header == nullptr) return null_argument("header");
    if (out == nullptr) return null_argument("out");
    auto claimed = kv::read_buffer_identity(
        std::span<const std::byte>(static_cast<const std::byte*>(header), header_bytes));
    if (!claimed.ok()) return claimed.status();
    *out = slimserve_record_identity{claimed->pool, claimed->writer, claimed->sequence};
    return {};
  });
}

// ---- Append and decode -------------------------------------------------------------------------

slimserve_status slimserve_append_kv(const slimserve_kv_cache* cache,
                                     const slimserve_page_table_view* device_table,
                                     const slimserve_request_status* statuses,
                                     const slimserve_append_args* args, slimserve_stream stream) {
  return guarded([&]() -> Status {
    if (device_table == nullptr) return null_argument("device_table");
    if (args == nullptr) return null_argument("args");
    attention::AppendArguments a;
    SLIMSERVE_RETURN_IF_ERROR(to_cache(cache, a.cache));
    SLIMSERVE_RETURN_IF_ERROR(to_enum(args->input_dtype, "activation dtype", a.input_dtype));
    a.table = to_view(*device_table);
    a.request_status = to_statuses(statuses);
    a.k_new = args->k_new;
    a.v_new = args->v_new;
    a.num_tokens = args->num_tokens;
    a.token_request = args->token_request;
    a.token_position = args->token_position;
    a.append_indptr = args->append_indptr;
    return attention::append_kv(a, stream);
  });
}

slimserve_status slimserve_kv_append(const slimserve_kv_append_args* args, slimserve_stream stream) {
  return guarded([&]() -> Status {
    slimserve_kv_append_args a;
    // Callers built before the row strides pass a shorter struct: packed rows.
    SLIMSERVE_RETURN_IF_ERROR(read_versioned(args, "args", a, offsetof(slimserve_kv_append_args, k_row_stride)));
    attention::AppendArguments cpp;
    SLIMSERVE_RETURN_IF_ERROR(to_cache(&a.cache, cpp.cache, a.kv_page_stride));
    SLIMSERVE_RETURN_IF_ERROR(to_enum(a.input_dtype, "activation dtype", cpp.input_dtype));
    if (a.slot_mapping == nullptr && a.table == nullptr) {
      return make_status(StatusCode::invalid_argument, "table is null (only the slot_mapping form needs none)");
    }
    if (a.table != nullptr) cpp.table = to_view(*a.table);
    cpp.table.page_size = a.table != nullptr ? a.table->page_size : a.cache.page_size;
    cpp.request_status = to_statuses(a.statuses);
    cpp.k_new = a.k_new;
    cpp.v_new = a.v_new;
    cpp.k_row_stride = a.k_row_stride;
    cpp.v_row_stride = a.v_row_stride;
    cpp.num_tokens = a.num_tokens;
    cpp.token_request = a.token_request;
    cpp.token_position = a.token_position;
    cpp.append_indptr = a.append_indptr;
    cpp.slot_mapping = a.slot_mapping;
    if (a.reserved != 0) return make_status(StatusCode::invalid_argument, "args->reserved must be 0");
    SLIMSERVE_RETURN_IF_ERROR(to_enum(a.rotation, "rotation", cpp.rotation));
    return attention::append_kv(cpp, stream);
  });
}

slimserve_status slimserve_rotate_heads(const slimserve_rotate_heads_args* args, slimserve_stream stream) {
  return guarded([&]() -> Status {
    slimserve_rotate_heads_args a;
    SLIMSERVE_RETURN_IF_ERROR(read_versioned(args, "args", a));
    attention::RotateHeadsArguments cpp;
    SLIMSERVE_RETURN_IF_ERROR(to_enum(a.dtype, "activation dtype", cpp.dtype));
    cpp.input = a.input;
    cpp.output = a.output;
    cpp.num_tokens = a.num_tokens;
    cpp.num_heads = a.num_heads;
    cpp.head_dim = a.head_dim;
    cpp.input_row_stride = a.input_row_stride;
    cpp.output_row_stride = a.output_row_stride;
    return attention::rotate_heads(cpp, stream);
  });
}

slimserve_status slimserve_get_runtime_counters(slimserve_runtime_counters* out) {
  return guarded([&]() -> Status {
    const rt::RuntimeCounters c = rt::runtime_counters();
    slimserve_runtime_counters value{};
    value.synchronizations = c.synchronizations;
    value.allocations = c.allocations;
    value.frees = c.frees;
    value.copies = c.copies;
    return write_versioned(value, "out", out);
  });
}

slimserve_status slimserve_decode_workspace_size(const slimserve_decode_problem* problem,
                                                 const int32_t* indptr_host,
                                                 const int32_t* last_page_len_host,
                                                 size_t* bytes) {
  return guarded([&]() -> Status {
    if (bytes == nullptr) return null_argument("bytes");
    attention::DecodePlanArguments plan_args;
    SLIMSERVE_RETURN_IF_ERROR(to_plan_arguments(problem, indptr_host, last_page_len_host, plan_args));
    auto size = attention::decode_workspace_size(plan_args);
    if (!size.ok()) return size.status();
    *bytes = *size;
    return {};
  });
}

slimserve_status slimserve_decode_plan_create(const slimserve_decode_problem* problem,
                                              const int32_t* indptr_host,
                                              const int32_t* last_page_len_host, void* workspace,
                                              size_t workspace_bytes, slimserve_stream stream,
                                              slimserve_decode_plan** out) {
  return guarded([&]() -> Status {
    if (out == nullptr) return null_argument("out");
    *out = nullptr;
    attention::DecodePlanArguments plan_args;
    SLIMSERVE_RETURN_IF_ERROR(to_plan_arguments(problem, indptr_host, last_page_len_host, plan_args));
    auto plan = attention::plan_decode(plan_args, workspace, workspace_bytes, stream);
    if (!plan.ok()) return plan.status();
    return hand_out<slimserve_decode_plan>(*std::move(plan), out);
  });
}
void slimserve_decode_plan_destroy(slimserve_decode_plan* plan) { delete plan; }

slimserve_status slimserve_decode_run(const slimserve_decode_plan* plan,
                                      const slimserve_kv_cache* cache,
                                      const slimserve_page_table_view* device_table,
                                      const slimserve_request_status* statuses,
                                      const slimserve_decode_args* args, void* workspace,
                                      size_t workspace_bytes, slimserve_stream stream) {
  return guarded([&]() -> Status {
    if (plan == nullptr) return null_argument("plan");
    if (device_table == nullptr) return null_argument("device_table");
    if (args == nullptr) return null_argument("args");
    attention::DecodeArguments a;
    SLIMSERVE_RETURN_IF_ERROR(to_cache(cache, a.cache));
    SLIMSERVE_RETURN_IF_ERROR(to_enum(args->q_dtype, "activation dtype", a.q_dtype));
    a.table = to_view(*device_table);
    a.request_status = to_statuses(statuses);
    a.q = args->q;
    a.o = args->o;
    a.lse = args->lse;
    a.sm_scale = args->sm_scale;
    return attention::run_decode(a, plan->plan, workspace, workspace_bytes, stream);
  });
}

// ---- INT4 ------------------------------------------------------------------------------------

slimserve_status slimserve_int4_quantize(const void* weight, slimserve_weight_dtype dtype,
                                         slimserve_weight_layout layout, int64_t k, int64_t n,
                                         const slimserve_quantize_options* options,
                                         slimserve_int4_weights** out) {
  return guarded([&]() -> Status {
    if (out == nullptr) return null_argument("out");
    *out = nullptr;
    if (weight == nullptr) return null_argument("weight");
    if (options == nullptr) return null_argument("options");
    if (k < 1 || n < 1) {
      return make_status(StatusCode::invalid_argument, "weight shape ", k, " x ", n);
    }
    int4::TensorView view;
    switch (dtype) {
      case SLIMSERVE_WEIGHT_F32: view.type = int4::ElementType::float32; break;
      case SLIMSERVE_WEIGHT_F16: view.type = int4::ElementType::float16; break;
      case SLIMSERVE_WEIGHT_BF16: view.type = int4::ElementType::bfloat16; break;
      default: return make_status(StatusCode::invalid_argument, "unknown weight dtype ", dtype);
    }
    int4::WeightLayout weight_layout{};
    SLIMSERVE_RETURN_IF_ERROR(to_enum(layout, "weight layout", weight_layout));
    if (weight_layout != int4::WeightLayout::k_by_n && weight_layout != int4::WeightLayout::n_by_k) {
      return make_status(StatusCode::invalid_argument, "unknown weight layout ", layout);
    }
    ss::ActivationDtype activation{};
    SLIMSERVE_RETURN_IF_ERROR(to_enum(options->activation, "activation dtype", activation));
    view.shape = weight_layout == int4::WeightLayout::k_by_n ? std::vector<std::int64_t>{k, n}
                                                             : std::vector<std::int64_t>{n, k};
    view.bytes = std::span<const std::byte>(static_cast<const std::byte*>(weight),
                                            static_cast<std::size_t>(k * n) * int4::element_size(view.type));
    int4::QuantizeOptions quantize_options;
    quantize_options.group_size = options->group_size;
    quantize_options.symmetric = options->symmetric != 0;
    auto matrix = int4::quantize(view, weight_layout, quantize_options);
    if (!matrix.ok()) return matrix.status();
    auto packed = int4::repack_for_gemm(*matrix, activation);
    if (!packed.ok()) return packed.status();
    return hand_out<slimserve_int4_weights>(*std::move(packed), out);
  });
}
void slimserve_int4_weights_destroy(slimserve_int4_weights* weights) { delete weights; }

slimserve_status slimserve_int4_weights_get_info(const slimserve_int4_weights* weights,
                                                 slimserve_int4_weights_info* info) {
  return guarded([&]() -> Status {
    if (weights == nullptr) return null_argument("weights");
    if (info == nullptr) return null_argument("info");
    const int4::GemmWeights& w = weights->weights;
    info->k = w.k;
    info->n = w.n;
    info->group_size = w.group_size;
    info->packed = w.packed.data();
    info->packed_bytes = w.packed.size() * sizeof(std::uint32_t);
    info->scales = w.scales.data();
    info->scales_bytes = w.scales.size() * sizeof(std::uint16_t);
    info->zeros = w.zeros.empty() ? nullptr : w.zeros.data();
    info->zeros_bytes = w.zeros.size() * sizeof(std::uint16_t);
    return {};
  });
}

slimserve_status slimserve_int4_weights_dequantize(const slimserve_int4_weights* weights,
                                                   float* out_k_by_n, size_t count) {
  return guarded([&]() -> Status {
    if (weights == nullptr) return null_argument("weights");
    if (out_k_by_n == nullptr) return null_argument("out_k_by_n");
    const int4::GemmWeights& w = weights->weights;
    if (count < static_cast<std::size_t>(w.k * w.n)) {
      return make_status(StatusCode::resource_exhausted, "output of ", count,
                         " floats; the weight has ", w.k * w.n);
    }
    for (std::int64_t row = 0; row < w.k; ++row) {
      for (std::int64_t col = 0; col < w.n; ++col) {
        const auto address = int4::gemm_layout::code_address(row, col, w.n);
        const std::uint32_t q = (w.packed[static_cast<std::size_t>(address.word)] >> (4 * address.nibble)) & 0xFu;
        const auto g = static_cast<std::size_t>((row / w.group_size) * w.n + col);
        const std::uint32_t z =
            w.zeros.empty() ? int4::gemm_layout::symmetric_zero
                            : static_cast<std::uint32_t>(int4::activation_to_float(w.activation, w.zeros[g]));
        const std::uint16_t bits = int4::dequantize_reference(w.activation, q, z, w.scales[g]);
        out_k_by_n[row * w.n + col] = int4::activation_to_float(w.activation, bits);
      }
    }
    return {};
  });
}

slimserve_status slimserve_gemm_plan_create(const slimserve_gemm_args* args,
                                            slimserve_gemm_plan** out) {
  return guarded([&]() -> Status {
    if (out == nullptr) return null_argument("out");
    *out = nullptr;
    int4::GemmArguments a;
    SLIMSERVE_RETURN_IF_ERROR(to_gemm_arguments(args, a));
    auto plan = int4::plan_gemm(a);
    if (!plan.ok()) return plan.status();
    return hand_out<slimserve_gemm_plan>(*std::move(plan), out);
  });
}
void slimserve_gemm_plan_destroy(slimserve_gemm_plan* plan) { delete plan; }
size_t slimserve_gemm_plan_workspace_bytes(const slimserve_gemm_plan* plan) {
  return plan == nullptr ? 0 : plan->plan.workspace_bytes();
}
slimserve_status slimserve_gemm_run(const slimserve_gemm_plan* plan,
                                    const slimserve_gemm_args* args, void* workspace,
                                    size_t workspace_bytes, slimserve_stream stream) {
  return guarded([&]() -> Status {
    if (plan == nullptr) return null_argument("plan");
    int4::GemmArguments a;
    SLIMSERVE_RETURN_IF_ERROR(to_gemm_arguments(args, a));
    return int4::run_gemm(a, plan->plan, workspace, workspace_bytes, stream);
  });
}

}  // extern "C"
